package metrics_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// env is a driver with its address space and physical memory.
type env struct {
	drv   driver.Driver
	space *vaspace.Space
	mem   *physical.Memory
}

// page is the host driver's granularity in these tests: small, so that a
// few tokens cross pages.
const page = 64 * units.KiB

// hostEnv is a host driver of one device of 64 MiB, closed at the end.
func hostEnv(t *testing.T) *env {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// simEnv is a sim driver of one device of 8 GiB, of the same granularity
// as hostEnv's (its recommended granularity is 2 MiB), closed at the end.
func simEnv(t *testing.T) *env {
	t.Helper()
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: 8 * units.GiB, Granularity: page})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// scrape gathers c alone through a pedantic registry (which checks every
// series against the descriptions) and returns its series by name and
// labels, the name label left out: `metric` or `metric{label="value"}`.
// Every series must carry name="want".
func scrape(t *testing.T, c *metrics.Collector, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			named := false
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" {
					require.Equal(t, name, l.GetValue(), mf.GetName())
					named = true
					continue
				}
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			require.True(t, named, "%s has the name label", mf.GetName())
			key := mf.GetName()
			if len(labels) > 0 {
				slices.Sort(labels)
				key += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
				require.True(t, strings.HasSuffix(mf.GetName(), "_total"), "the counter %s ends in _total", mf.GetName())
			} else {
				require.NotNil(t, m.GetGauge(), "%s is a gauge or a counter", mf.GetName())
				require.False(t, strings.HasSuffix(mf.GetName(), "_total"), "the gauge %s does not end in _total", mf.GetName())
			}
			_, dup := got[key]
			require.False(t, dup, key)
			got[key] = v
		}
	}
	return got
}

// lint requires that promlint finds nothing wrong with c's metrics.
func lint(t *testing.T, c *metrics.Collector) {
	t.Helper()
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
