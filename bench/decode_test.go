package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/attention"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// decodeShapes are the layers BenchmarkDecodeAttention attends over, all
// of head dimension 128: llama3-8b's (32 query heads over 8 KV heads,
// grouped-query), llama-7b's (32 heads, multi-head) and llama-7b's on one
// GPU of four under tensor parallelism (8 of its heads).
var decodeShapes = []struct {
	name  string
	shape attention.Shape
}{
	{"llama3-8b", attention.Shape{Heads: 32, KVHeads: 8, HeadDim: 128}},
	{"llama-7b", attention.Shape{Heads: 32, KVHeads: 32, HeadDim: 128}},
	{"llama-7b-tp4", attention.Shape{Heads: 8, KVHeads: 8, HeadDim: 128}},
}

// BenchmarkDecodeAttention: one decode step's attention over 4k and 16k
// cached tokens of one layer (the shapes of decodeShapes, float32),
// contiguous — a kvcache sequence's K and V (per-layer layout: plain
// [T, KVHeads, 128] tensors over the cache's pages) — beside paged — 16-token blocks
// shuffled in a pool, through a block table, vLLM's layout — in the same
// loop, same numbers, bit-identical outputs. Reports contiguous-ns/token,
// paged-ns/token and x-contiguous-vs-paged (paged time over contiguous:
// above 1, contiguous is faster). Target: at least 1.1;
// reported, never asserted. llama-7b at 16k commits 1 GiB.
func BenchmarkDecodeAttention(b *testing.B) {
	b.ReportAllocs()
	for _, ds := range decodeShapes {
		for _, tokens := range []int{4 << 10, 16 << 10} {
			b.Run(fmt.Sprintf("%s/T=%dk", ds.name, tokens>>10), func(b *testing.B) {
				b.ReportAllocs()
				p, err := DecodeAttention(b.Loop, ds.shape, tokens)
				skipTooLarge(b, err)
				if err != nil {
					b.Fatal(err)
				}
				perToken := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(p.N) / float64(tokens) }
				b.ReportMetric(perToken(p.Lib), "contiguous-ns/token")
				b.ReportMetric(perToken(p.Bare), "paged-ns/token")
				b.ReportMetric(float64(p.Bare)/float64(p.Lib), "x-contiguous-vs-paged")
				b.ReportMetric(0, "ns/op") // the loop times both, and the fill; the figures above are the ones that matter
			})
		}
	}
}

// TestDecodeAttentionBody runs the body small, so a broken benchmark
// fails the tests rather than the next measurement.
func TestDecodeAttentionBody(t *testing.T) {
	for _, s := range []attention.Shape{{Heads: 8, KVHeads: 2, HeadDim: 16}, {Heads: 4, KVHeads: 4, HeadDim: 8}} {
		for _, tokens := range []int{1, 17, 1000} {
			p, err := DecodeAttention(Rounds(3), s, tokens)
			require.NoError(t, err)
			require.Equal(t, 3, p.N)
			require.Positive(t, p.Lib)
			require.Positive(t, p.Bare)
		}
	}
	_, err := DecodeAttention(Rounds(1), attention.Shape{Heads: 3, KVHeads: 2, HeadDim: 8}, 10)
	require.Error(t, err)
	_, err = DecodeAttention(Rounds(1), decodeShapes[0].shape, 1<<40)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = DecodeAttention(Rounds(1), attention.Shape{Heads: 1 << 50, KVHeads: 1, HeadDim: 128}, 1)
	require.ErrorIs(t, err, ErrTooLarge, "query heads alone")
}

// TestDecodeAttentionReadsTheCache: the contiguous side's K and V are the
// cache sequence's, holding what was written through Append's views,
// across 2 MiB pages (a row of 4 KiB: 512 to a page).
func TestDecodeAttentionReadsTheCache(t *testing.T) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	s := attention.Shape{Heads: 8, KVHeads: 8, HeadDim: 128}
	const tokens = 1300
	next := float32(0)
	kv, err := newSeqKV(vaspace.New(drv), physical.New(drv), tokens, s, func(x []float32) {
		for i := range x {
			x[i] = next
			next++
		}
	})
	require.NoError(t, err)
	n := tokens * s.RowLen()
	require.Len(t, kv.k, n)
	require.Len(t, kv.v, n)
	for i := range n {
		if kv.k[i] != float32(i) || kv.v[i] != float32(n+i) {
			require.Failf(t, "not what was written", "element %d: K %v, V %v", i, kv.k[i], kv.v[i])
		}
	}
	st := kv.c.Stats()
	require.Equal(t, tokens, st.TokensStored)
	require.Equal(t, 2*3, st.PagesCommitted, "K and V, 3 pages each")
	require.NoError(t, kv.c.Check())
	require.NoError(t, kv.close())
}
