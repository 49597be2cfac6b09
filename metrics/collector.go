package metrics

import (
	"fmt"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
)

// namespace begins every metric's name.
const namespace = "vmarena"

// nameLabel is the label whose value is the name a collector's caller gave
// its object.
const nameLabel = "name"

// A Collector is a prometheus.Collector over one named object of the
// library. Its descriptions are fixed when it is made; Collect reads the
// object's figures once and sends a constant metric for each, or nothing
// once the object is closed. Safe for concurrent use.
type Collector struct {
	kind, name string // the object's kind ("kvcache", "allocator", "arena", "pool") and name
	descs      []*prometheus.Desc
	collect    func(ch chan<- prometheus.Metric)
}

// Describe sends the description of every metric the collector sends.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c == nil { // a nil Collector describes and sends nothing
		return
	}
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect sends the object's figures as they are now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c != nil && c.collect != nil { // a nil or zero Collector watches nothing
		c.collect(ch)
	}
}

// Name is the value of the collector's name label.
func (c *Collector) Name() string {
	if c == nil {
		return ""
	}
	return c.name
}

func (c *Collector) String() string {
	if c == nil {
		return "a nil collector"
	}
	return fmt.Sprintf("the %s collector %q", c.kind, c.name)
}

// Register registers every collector with r, or none: when r refuses one,
// those registered before it are unregistered, and the error says which
// collector was refused and why. A collector of the same kind and name as
// one r holds is refused (ErrInvalid): the name label would no longer tell
// the two objects apart.
func Register(r prometheus.Registerer, cs ...*Collector) error {
	if isnil.Is(r) { // nil, or a nil *prometheus.Registry, whose Register would panic
		return errors.Wrap(driver.ErrInvalid, "metrics: register: the registerer is nil")
	}
	for i, c := range cs {
		if c == nil || c.collect == nil {
			return errors.CombineErrors(
				errors.Wrapf(driver.ErrInvalid, "metrics: register: collector %d of %d is nil or not made by a New function of this package", i+1, len(cs)),
				unregister(r, cs[:i]))
		}
		err := r.Register(c)
		if err == nil {
			continue
		}
		var dup prometheus.AlreadyRegisteredError
		switch {
		case errors.As(err, &dup) && dup.ExistingCollector == prometheus.Collector(c):
			err = errors.Wrapf(driver.ErrInvalid, "metrics: register %s: it is registered already", c)
		case errors.As(err, &dup):
			err = errors.WithHintf(errors.Wrapf(driver.ErrInvalid,
				"metrics: register %s: the registry has another %s collector named %q", c, c.kind, c.name),
				"give each %s its own name: the %q label is what tells their series apart", c.kind, nameLabel)
		default:
			err = errors.Wrapf(err, "metrics: register %s", c)
		}
		return errors.CombineErrors(err, unregister(r, cs[:i]))
	}
	return nil
}

// unregister takes back the collectors a failed Register registered.
func unregister(r prometheus.Registerer, cs []*Collector) error {
	for _, c := range cs {
		if !r.Unregister(c) {
			return errors.AssertionFailedf("metrics: register: %s, registered a moment ago, could not be unregistered", c)
		}
	}
	return nil
}

// checkName refuses a name that cannot tell objects apart in the name
// label: an empty one (Prometheus reads an empty label as no label) and
// one that is not UTF-8.
func checkName(what func() string, name string) error {
	if name == "" {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the name is empty", what()),
			"the name is the value of the name label: choose one that tells this object from the others of its kind")
	}
	if !utf8.ValidString(name) {
		return errors.Wrapf(driver.ErrInvalid, "%s: the name %q is not UTF-8, which a label value must be", what(), name)
	}
	return nil
}

// A figure is one metric of a kind of object, read from the object's
// figures S. Most are one series; one split by a label (split) has a
// series per value of it, whose values sum to the whole.
type figure[S any] struct {
	name, help string // name: after vmarena_<kind>_
	typ        prometheus.ValueType
	split      string // the label the series differ by; "" for one series
	series     []series[S]
}

// series is one series of a figure: the value of the figure's split label
// ("" when it has none) and how to read it.
type series[S any] struct {
	label string
	value func(*S) float64
}

func gauge[S any](name, help string, value func(*S) float64) figure[S] {
	return figure[S]{name: name, help: help, typ: prometheus.GaugeValue, series: []series[S]{{value: value}}}
}

func counter[S any](name, help string, value func(*S) float64) figure[S] {
	return figure[S]{name: name, help: help, typ: prometheus.CounterValue, series: []series[S]{{value: value}}}
}

// newCollector makes the collector of the object name of kind: closed
// says whether the object is closed, read reads its figures once. A read
// that fails sends each metric as invalid, with the error: the scrape
// reports it, as client_golang's collectors do.
func newCollector[S any](kind, name string, figs []figure[S], closed func() bool, read func() (S, error)) (*Collector, error) {
	descs := make([]*prometheus.Desc, len(figs))
	for i, f := range figs {
		var variable []string
		if f.split != "" {
			variable = []string{f.split}
		}
		descs[i] = prometheus.NewDesc(prometheus.BuildFQName(namespace, kind, f.name), f.help, variable, prometheus.Labels{nameLabel: name})
		if err := descs[i].Err(); err != nil {
			return nil, errors.Wrapf(err, "metrics: the %s collector %q: metric %s", kind, name, f.name)
		}
	}
	c := &Collector{kind: kind, name: name, descs: descs}
	c.collect = func(ch chan<- prometheus.Metric) {
		if closed() {
			return
		}
		st, err := read()
		if err != nil {
			for _, d := range descs {
				ch <- prometheus.NewInvalidMetric(d, errors.Wrapf(err, "metrics: %s", c))
			}
			return
		}
		for i, f := range figs {
			for _, s := range f.series {
				var labels []string
				if f.split != "" {
					labels = []string{s.label}
				}
				m, err := prometheus.NewConstMetric(descs[i], f.typ, s.value(&st), labels...)
				if err != nil {
					m = prometheus.NewInvalidMetric(descs[i], err)
				}
				ch <- m
			}
		}
	}
	return c, nil
}

// always is a read that cannot fail.
func always[S any](read func() S) func() (S, error) {
	return func() (S, error) { return read(), nil }
}
