package main

// The tables vmarena replay and vmarena kv simulate print, and the HTML
// reports (--report FILE) that show the same tables beside charts of what
// the run recorded.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/cmd/vmarena/internal/report"
	"github.com/vmarena/vmarena/replay"
	"github.com/vmarena/vmarena/serving"
)

// printTable prints rows of cells in padded columns.
func printTable(w io.Writer, table [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range table {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	_ = tw.Flush()
}

// reportTable is a printed table in a report: its first row the header,
// every cell the printed text.
func reportTable(caption string, table [][]string) report.Table {
	t := report.Table{Caption: caption}
	if len(table) > 0 {
		t.Header, t.Rows = table[0], table[1:]
	}
	return t
}

// checkReport says what keeps a report from being written to name, before
// the run rather than after it: something there that is not a regular
// file (a directory; a FIFO, which opening for writing would wait on for
// good; a device), a directory that is not there or that cannot be
// written (the report is written beside its name and renamed over it).
// An empty name is no report. It leaves nothing behind.
func checkReport(name string) error {
	if name == "" {
		return nil
	}
	if fi, err := os.Stat(name); err == nil {
		switch {
		case fi.IsDir():
			return errors.Newf("%s: a directory, want a file", name)
		case !fi.Mode().IsRegular():
			return errors.Newf("%s: not a regular file (%s), want a file", name, fi.Mode().Type())
		}
	}
	dir := filepath.Dir(name)
	if di, err := os.Stat(dir); err != nil || !di.IsDir() {
		return errors.Newf("%s: there is no directory %s to write it in", name, dir)
	}
	f, err := os.CreateTemp(dir, ".vmarena-report-check-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return errors.Newf("%s: cannot be written in %s: %v", name, dir, err)
	}
	return errors.CombineErrors(f.Close(), os.Remove(f.Name()))
}

// writeReport writes the page to the file name.
func writeReport(name string, p report.Page) error {
	return errors.Wrapf(report.WriteFile(name, p), "writing the report %s", name)
}

// The kinds of a memory map at the peak, in the legend's order (the
// report's palette colours them blue, green, orange and light grey).
const (
	kindAllocated   = "allocated"
	kindFree        = "free (committed)"
	kindStitched    = "stitched"
	kindUncommitted = "not committed"
)

var mapKinds = []report.Kind{{Name: kindAllocated}, {Name: kindFree}, {Name: kindStitched}, {Name: kindUncommitted}}

// kindOf names a block's kind in the report: the chunks a stitch borrows
// and the stitched allocation itself are both "stitched".
func kindOf(k replay.MapKind) string {
	switch k {
	case replay.MapUsed:
		return kindAllocated
	case replay.MapFree:
		return kindFree
	case replay.MapLent, replay.MapStitched:
		return kindStitched
	}
	return kindUncommitted
}

// replayReport is vmarena replay's report: the header and table it
// printed, then a section per column — the device's memory over its
// events and its allocator's memory map at the trace's peak.
func replayReport(header string, cols []column, table [][]string) report.Page {
	p := report.Page{
		Title: "vmarena replay",
		Intro: []string{header,
			"Below the table, one section per device of each trace: what was allocated (the trace's live allocations, the same in vmarena's allocator), " +
				"what vmarena's allocator held committed and what PyTorch's caching allocator held reserved after each event; " +
				"then the allocator's memory map when the allocated memory first reached its peak, and the largest allocations live then."},
		Sections: []report.Section{{Title: "Figures", Tables: []report.Table{reportTable("vmarena replay's table", table)}}},
	}
	for _, c := range cols {
		p.Sections = append(p.Sections, replaySection(c))
	}
	return p
}

func replaySection(c column) report.Section {
	d := c.d
	s := report.Section{Title: c.label}
	s.Notes = append(s.Notes, fmt.Sprintf("%d events; peak allocated (trace) %s, peak committed (vmarena) %s, peak reserved (PyTorch) %s.",
		d.Summary.Events, approx(d.Summary.PeakAllocated), approx(d.Figures.PeakCommitted), reservedCell(d)))
	if tl := d.Timeline; tl != nil {
		chart := report.LineChart{
			Title: "memory over the events: " + c.label,
			X:     report.Axis{Label: "event", Unit: report.Count},
			Y:     report.Axis{Label: "memory", Unit: report.Bytes},
			Series: []report.Series{
				{Name: "allocated (trace)", X: tl.Allocated.X, Y: tl.Allocated.Y},
				{Name: "committed (vmarena)", X: tl.Committed.X, Y: tl.Committed.Y},
			},
		}
		switch {
		case d.Summary.SegmentEvents == 0:
			chart.Caption = "The trace has no segment events: PyTorch's reserved memory is not drawn."
		case d.Summary.MidRun():
			// The reserved sum starts at zero with the first event and
			// leaves out what was held before recording (docs/replay.md,
			// Mid-run traces, says so): drawn, it would mislead.
			chart.Caption = "The trace starts mid-run (" + midRun(d) + "): PyTorch's reserved memory is not drawn."
		default:
			chart.Series = append(chart.Series, report.Series{Name: "reserved (PyTorch)", X: tl.Reserved.X, Y: tl.Reserved.Y})
		}
		s.Charts = append(s.Charts, chart)
	}
	if m := d.PeakMap; m != nil {
		s.Charts = append(s.Charts, peakMap(c.label, m))
	}
	if len(d.Summary.LargestAtPeak) > 0 {
		s.Tables = append(s.Tables, reportTable(largestHeading(c)+"; times from the device's first event", largestTable(c, replay.MaxLargestAtPeak)))
	}
	return s
}

// peakMap draws each of the allocator's ranges up to its last committed
// byte; a range with nothing committed is left out.
func peakMap(label string, m *replay.PeakMap) report.MemoryMap {
	rows := make([]report.MapRow, len(m.Ranges))
	for i, name := range m.Ranges {
		rows[i].Name = name
	}
	for _, b := range m.Blocks {
		rows[b.Range].Segments = append(rows[b.Range].Segments, report.Segment{Offset: b.Offset, Size: b.Size, Kind: kindOf(b.Kind)})
	}
	var kept []report.MapRow
	var empty []string
	for _, r := range rows {
		for len(r.Segments) > 0 && r.Segments[len(r.Segments)-1].Kind == kindUncommitted {
			r.Segments = r.Segments[:len(r.Segments)-1]
		}
		if len(r.Segments) == 0 {
			empty = append(empty, r.Name)
			continue
		}
		// The ranges share the axis: say what each holds, which a range
		// of a few chunks beside one of gigabytes is too thin to show.
		var committed uint64
		for _, sg := range r.Segments {
			if sg.Kind != kindUncommitted {
				committed += sg.Size
			}
		}
		r.Name += ", " + approx(committed)
		kept = append(kept, r)
	}
	when := fmt.Sprintf("after event %d (line %d)", m.Event, m.Line)
	if m.Line == 0 {
		when = fmt.Sprintf("after the last event (%d)", m.Event)
	}
	caption := fmt.Sprintf("%s: allocated %s, committed %s. Each range is drawn to its last committed byte.", when, approx(m.Allocated), approx(m.Committed))
	if len(empty) > 0 {
		caption += fmt.Sprintf(" Nothing was committed in: %s.", strings.Join(empty, ", "))
	}
	return report.MemoryMap{Title: "memory map at the peak: " + label, Kinds: mapKinds, Rows: kept, Caption: caption}
}

// kvReport is vmarena kv simulate's report: the header and table it
// printed, and each scheme's sequences, KV memory and waste over
// simulated time.
// kvLineStep is how much wider, in points, each scheme's line is drawn
// than the next scheme's, drawn over it.
const kvLineStep = 1.4

func kvReport(header []string, results []serving.Result, table [][]string) report.Page {
	simTime := report.Axis{Label: "simulated time", Unit: report.Seconds}
	charts := []report.LineChart{
		{Title: "sequences running", X: simTime, Y: report.Axis{Label: "sequences", Unit: report.Count}},
		{Title: "KV memory in use by running sequences", X: simTime, Y: report.Axis{Label: "KV memory", Unit: report.Bytes}},
		{Title: "KV waste: memory in use holding no token", X: simTime, Y: report.Axis{Label: "KV waste", Unit: report.Bytes}},
	}
	// Where two schemes hold the same (this cache and the paged scheme
	// often do), the later line would hide the earlier: each scheme's is
	// drawn wider than the next's, so this cache's shows at the edges of
	// the paged scheme's drawn over it.
	for k, r := range results {
		tl := r.Timeline
		if tl == nil {
			continue
		}
		width := report.DefaultWidth + kvLineStep*float64(len(results)-1-k)
		for i, s := range []serving.Series{tl.Seqs, tl.InUse, tl.Waste} {
			charts[i].Series = append(charts[i].Series, report.Series{Name: r.Scheme, X: s.X, Y: s.Y, Steps: true, Width: width})
		}
	}
	over := report.Section{Title: "Over time", Notes: []string{
		"Each scheme's state from one step to the next, over the simulated time (idle gaps between requests included); " +
			"long runs are drawn thinned, keeping every peak."}}
	for _, c := range charts {
		over.Charts = append(over.Charts, c)
	}
	return report.Page{
		Title: "vmarena kv simulate",
		Intro: header,
		Sections: []report.Section{
			{Title: "Figures", Tables: []report.Table{reportTable("vmarena kv simulate's table", table)}},
			over,
		},
	}
}
