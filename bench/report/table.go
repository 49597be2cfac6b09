package main

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// entry is one line of the report: a row of the suite for one benchmark
// (a row for each sub-benchmark repeats), and what the output says it
// measured.
type entry struct {
	row row
	// name is the benchmark, less its Benchmark prefix ("AllocFree/1M").
	name string
	// label is the row's path, with the sub-benchmark for an anySub row.
	label string
	// value is the ratio, when measured, and text the ratio as go test
	// wrote it: a benchmark that did not run, was skipped or reported no
	// such metric has none.
	value    float64
	text     string
	measured bool
}

// met says whether the entry was measured and meets its target.
func (e entry) met() bool { return e.measured && e.row.met(e.value) }

// entries are the report's lines for the rows of cmds, from out, in the
// suite's order (an anySub row's benchmarks in output order). Where the
// output has a benchmark twice, the last result counts.
func entries(cmds []command, out output) []entry {
	var es []entry
	for _, c := range cmds {
		for _, r := range c.rows {
			if r.sub == anySub {
				es = append(es, eachSub(r, out)...)
				continue
			}
			name := strings.TrimPrefix(r.bench, "Benchmark")
			if r.sub != "" {
				name += "/" + r.sub
			}
			e := entry{row: r, name: name, label: r.path}
			for _, res := range out.results {
				if _, ok := r.matches(res.name); ok {
					e.measure(res)
				}
			}
			es = append(es, e)
		}
	}
	return es
}

// eachSub is an anySub row's entries: one per sub-benchmark of its
// benchmark in out (for a where row, one per sub-benchmark that reports
// the metric), or one unmeasured entry when out has none.
func eachSub(r row, out output) []entry {
	var es []entry
	index := map[string]int{}
	for _, res := range out.results {
		sub, ok := r.matches(res.name)
		if !ok {
			continue
		}
		if _, has := res.metric(r.metric); r.where && !has {
			continue
		}
		e := entry{row: r, name: strings.TrimPrefix(res.name, "Benchmark"), label: r.path + ", " + readableSub(sub)}
		e.measure(res)
		if i, seen := index[sub]; seen {
			es[i] = e
			continue
		}
		index[sub] = len(es)
		es = append(es, e)
	}
	if len(es) == 0 {
		es = append(es, entry{row: r, name: strings.TrimPrefix(r.bench, "Benchmark") + "/…", label: r.path})
	}
	return es
}

// measure sets e's value from res (unmeasured when res lacks e's
// metric).
func (e *entry) measure(res result) {
	m, ok := res.metric(e.row.metric)
	e.value, e.text, e.measured = m.value, m.text, ok
}

// byteSize is a size as go test writes units.Bytes's "2 MiB" in a
// sub-benchmark's name.
var byteSize = regexp.MustCompile(`^[0-9]+_[KMGT]iB$`)

// readableSub is a sub-benchmark's name for a label: a size with its
// space back ("2 MiB"), anything else as go test named it.
func readableSub(sub string) string {
	if byteSize.MatchString(sub) {
		return strings.ReplaceAll(sub, "_", " ")
	}
	return sub
}

// formatFloat formats v with prec decimals, or as few as it needs when
// prec is -1.
func formatFloat(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// measuredText is e's value as go test wrote it, or a dash.
func (e entry) measuredText() string {
	if !e.measured {
		return "—"
	}
	return e.text
}

// verdict is the met? column.
func (e entry) verdict() string {
	switch {
	case !e.measured:
		return "not measured"
	case e.met():
		return "yes"
	}
	return "no"
}

// source says where a report's figures come from: a sentence, and the
// commands it names.
type source struct {
	intro    string
	commands []string
}

// writeMarkdown writes the report's table: one line per entry, with the
// commands that produced it, where they ran, and the chart beside it
// (chart: the SVG's file name, "" for none).
func writeMarkdown(w io.Writer, src source, out output, es []entry, failed []string, chart string) error {
	var b strings.Builder
	b.WriteString("# Benchmark ratios against their targets\n\n")
	b.WriteString("Written by `go run ./bench/report`")
	if where := strings.Trim(strings.Join([]string{out.cpu, strings.Trim(out.goos+"/"+out.goarch, "/")}, ", "), ", "); where != "" {
		fmt.Fprintf(&b, " from a run on %s", where)
	}
	b.WriteString(". Each figure is one run's; on the project's 2-core VM a ratio can move by 20% from one run to the next.\n\n")
	fmt.Fprintf(&b, "%s\n\n", src.intro)
	for _, c := range src.commands {
		fmt.Fprintf(&b, "    %s\n", c)
	}
	b.WriteString("\n| path | benchmark | metric | measured | target | met? |\n| --- | --- | --- | --- | --- | --- |\n")
	met, measured := 0, 0
	for _, e := range es {
		if e.measured {
			measured++
		}
		if e.met() {
			met++
		}
		fmt.Fprintf(&b, "| %s | `%s` | `%s` | %s | %s (%s) | %s |\n", cell(e.label), cell(e.name), cell(e.row.metric),
			e.measuredText(), e.row.bound(), e.row.source, e.verdict())
	}
	fmt.Fprintf(&b, "\n%d of %d targets met", met, len(es))
	if measured < len(es) {
		fmt.Fprintf(&b, " (%d not measured)", len(es)-measured)
	}
	b.WriteString(".\n")
	for _, f := range failed {
		fmt.Fprintf(&b, "\nFailed: %s\n", f)
	}
	if chart != "" {
		fmt.Fprintf(&b, "\n![benchmark ratios against targets](%s)\n", chart)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell escapes what would end a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
