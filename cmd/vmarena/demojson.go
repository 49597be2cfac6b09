package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/mapping"
)

// demoJSONCmd runs the demo with --json: the text goes to a buffer, cut
// into the steps of a DemoJSON, which is printed at the end. A demo that
// fails prints no document, only the error.
func demoJSONCmd(stdout, stderr io.Writer, b backend, svg string) int {
	doc := &DemoJSON{Driver: b.name, Steps: []DemoStepJSON{}}
	if err := demoTo(&bytes.Buffer{}, b, svg, doc); err != nil {
		fmt.Fprintf(stderr, "vmarena demo: %v\n", err)
		return 1
	}
	if err := writeJSON(stdout, doc); err != nil {
		fmt.Fprintf(stderr, "vmarena demo: %v\n", err)
		return 1
	}
	return 0
}

// The demoRun methods below keep DemoJSON (d.doc) as the demo prints;
// without --json they do nothing.

// current is the step being printed, nil before the first.
func (d *demoRun) current() *DemoStepJSON {
	if d.doc == nil || len(d.doc.Steps) == 0 {
		return nil
	}
	return &d.doc.Steps[len(d.doc.Steps)-1]
}

// takeText moves the text printed since the last call into lines: each
// line less its indent, blank lines dropped.
func (d *demoRun) takeText() []string {
	lines := []string{}
	for _, l := range strings.Split(d.text.String(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	d.text.Reset()
	return lines
}

// endStep gives the step printed so far its text (before the first step:
// the header).
func (d *demoRun) endStep() {
	if d.doc == nil {
		return
	}
	lines := d.takeText()
	if s := d.current(); s != nil {
		s.Text = append(s.Text, lines...)
	} else if len(lines) > 0 {
		d.doc.Header = lines[0]
	}
}

// startStep begins the step just titled (its title line is not text).
func (d *demoRun) startStep() {
	if d.doc == nil {
		return
	}
	d.text.Reset()
	d.doc.Steps = append(d.doc.Steps, DemoStepJSON{Step: d.step, Title: d.title,
		Text: []string{}, Maps: [][]DemoSpanJSON{}, Refusals: []string{}, Skipped: []string{}})
}

// endJSON ends the last step.
func (d *demoRun) endJSON(granularity uint64) {
	d.endStep()
	d.doc.GranularityBytes = granularity
}

func (d *demoRun) jsonRefused(err string) {
	if s := d.current(); s != nil {
		s.Refusals = append(s.Refusals, err)
	}
}

func (d *demoRun) jsonSkipped(what string) {
	if s := d.current(); s != nil {
		s.Skipped = append(s.Skipped, what)
	}
}

// jsonMap keeps the memory map of tab's reservation.
func (d *demoRun) jsonMap(tab *mapping.Table) {
	s := d.current()
	if s == nil {
		return
	}
	base := tab.Reservation().Base()
	spans := []DemoSpanJSON{}
	for sp := range tab.Spans() {
		j := DemoSpanJSON{OffsetBytes: uint64(sp.Range.Base - base), SizeBytes: sp.Range.Size, State: fmt.Sprint(sp.State),
			Access: []DemoAccessJSON{}}
		if sp.Chunk != nil {
			dev, handle, off := int(sp.Chunk.Device()), uint64(sp.Chunk.Handle()), sp.ChunkOffset
			j.Device, j.ChunkHandle, j.ChunkOffsetBytes = &dev, &handle, &off
			for id, a := range sp.Access {
				if a != driver.AccessNone {
					j.Access = append(j.Access, DemoAccessJSON{Device: id, Access: fmt.Sprint(a)})
				}
			}
		}
		spans = append(spans, j)
	}
	s.Maps = append(s.Maps, spans)
}

func (d *demoRun) jsonUsageReset() {
	if s := d.current(); s != nil {
		s.Usage = []DemoUsageJSON{}
	}
}

func (d *demoRun) jsonUsage(dev int, used, peak, capacity uint64) {
	if s := d.current(); s != nil {
		s.Usage = append(s.Usage, DemoUsageJSON{Device: dev, UsedBytes: used, PeakBytes: peak, CapacityBytes: capacity})
	}
}
