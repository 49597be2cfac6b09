package memsvg_test

import (
	"io"
	"testing"
	"time"

	"github.com/vmarena/vmarena/internal/memsvg"
)

// spans is a range of n granules with a span every third granule, as
// TestCap draws.
func spans(n uint64) memsvg.Picture {
	p := memsvg.Picture{Title: "busy", Granule: g, Ranges: []memsvg.Range{{Name: "r", Size: n * g}}}
	for i := uint64(0); i < n; i += 3 {
		p.Ranges[0].Spans = append(p.Ranges[0].Spans, memsvg.Span{Offset: i * g, Size: g, State: memsvg.State(1 + i%2), Chunk: i, Access: []memsvg.Access{memsvg.Read}})
	}
	return p
}

// BenchmarkCap renders TestCap's picture of 100,000 granules (about 128
// granules a cell, within MaxCells) and, as its baseline in the same
// run, a picture of MaxCells granules (one a cell): about as many cells,
// 1/128 of the spans. The ratio ("x-baseline") is what drawing many
// granules a cell costs over drawing the same cells one granule each.
func BenchmarkCap(b *testing.B) {
	busy, base := spans(100_000), spans(memsvg.MaxCells)
	var tb, tbase time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := memsvg.Write(io.Discard, busy); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := memsvg.Write(io.Discard, base); err != nil {
			b.Fatal(err)
		}
		tb, tbase = tb+t1.Sub(t0), tbase+time.Since(t1)
	}
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), "busy-ns/op")
	b.ReportMetric(float64(tbase.Nanoseconds())/float64(b.N), "baseline-ns/op")
	b.ReportMetric(float64(tb)/float64(tbase), "x-baseline")
}
