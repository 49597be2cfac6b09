package main

// The largest allocations live at each device's peak, as vmarena replay
// prints them under its table and its report shows them: what PyTorch's
// memory viz shows of a snapshot, and the table's figures do not.

import (
	"fmt"
	"io"
	"strings"

	"github.com/vmarena/vmarena/replay"
)

// printedLargest is how many of the largest allocations at a device's
// peak vmarena replay prints; the report shows all the summary names
// (replay.MaxLargestAtPeak).
const printedLargest = 5

// largestHeading says whose peak a largest-allocations table is of, and
// when it was.
func largestHeading(c column) string {
	s := c.d.Summary
	return fmt.Sprintf("largest allocations live at the peak: %s — %s allocated at line %d (seq %d)%s, %s live",
		c.label, approx(s.PeakAllocated), s.Peak.Line, s.Peak.Seq, sinceStart(s, s.Peak), plural(s.LiveAtPeak, "allocation"))
}

// largestTable is the table of the n largest allocations live at the
// device's peak: header row first.
func largestTable(c column, n int) [][]string {
	s := c.d.Summary
	table := [][]string{{"size", "alloc_id", "allocated at", "time", "before the peak"}}
	for _, a := range s.LargestAtPeak[:min(n, len(s.LargestAtPeak))] {
		before := "—"
		if a.HasTime && s.Peak.HasTime {
			before = usSeconds(s.Peak.TimeUS - a.TimeUS)
		}
		when := "—"
		if a.HasTime && s.HasFirstTime {
			when = "+" + usSeconds(a.TimeUS-s.FirstTimeUS)
		}
		table = append(table, []string{approx(a.Size), fmt.Sprint(a.AllocID), fmt.Sprintf("line %d (seq %d)", a.Line, a.Seq), when, before})
	}
	return table
}

// printLargest prints, for each column whose trace allocated anything,
// the largest allocations live at its peak.
func printLargest(w io.Writer, cols []column) {
	for _, c := range cols {
		if len(c.d.Summary.LargestAtPeak) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", largestHeading(c))
		var b strings.Builder
		printTable(&b, largestTable(c, printedLargest))
		for _, line := range strings.SplitAfter(b.String(), "\n") {
			if line != "" {
				fmt.Fprint(w, "  "+line)
			}
		}
	}
}

// sinceStart is ", +T s" when the event and the device's first event have
// times: the time since the device's first timed event.
func sinceStart(s replay.Summary, a replay.PeakAlloc) string {
	if !a.HasTime || !s.HasFirstTime {
		return ""
	}
	return ", +" + usSeconds(a.TimeUS-s.FirstTimeUS)
}

// usSeconds formats microseconds as seconds to the millisecond.
func usSeconds(us int64) string { return fmt.Sprintf("%.3f s", float64(us)/1e6) }
