package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// growthShape is the sequence BenchmarkSequenceGrowth grows: 4 layers × 8
// KV heads × 128 fp16 (16 KiB a token: an eighth of llama3-8b's 128 KiB, so
// that the cache's sequence and the copying side's buffers fit a small
// machine) to 32k tokens (512 MiB), ollama's 256-token steps. The ratio
// does not depend on the layer count: each region grows the same way.
var growthShape = SequenceShape{Layers: 4, KVHeads: 8, HeadDim: 128, Tokens: 32 << 10, Step: 256}

// BenchmarkSequenceGrowth: one sequence growing token by token to 32k
// tokens of 16 KiB, each token's rows written, the KV cache's way (a
// kvcache sequence grown by Seq.Append, writing the views it returns:
// regions reserved at full length, 2 MiB pages committed at the tail,
// nothing moves) beside ollama's (a buffer 256 tokens longer allocated and
// the old contents copied whenever one fills), in the same loop, ending
// with the same bytes; cold (every sequence commits the memory it grows
// into) and warm (both sides keep the memory of the sequence before).
// Reports cache-ms, copying-ms, x-cache-vs-copying (copying time over the
// cache's), copied-MiB (what the copying side moved in a round), the
// cache's Appends that waited on mapping in a round (waits; the rest found
// their page mapped ahead) and each side's peak committed memory. Target:
// at least 10; reported, never asserted. Commits up to about
// 2.5 GiB (warm).
func BenchmarkSequenceGrowth(b *testing.B) {
	b.ReportAllocs()
	for _, start := range []GrowthStart{GrowCold, GrowWarm} {
		b.Run(start.String(), func(b *testing.B) {
			b.ReportAllocs()
			g, err := SequenceGrowth(b.Loop, growthShape, start)
			skipTooLarge(b, err)
			if err != nil {
				b.Fatal(err)
			}
			ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 / float64(g.N) }
			mib := func(n uint64) float64 { return float64(n) / float64(units.MiB) }
			b.ReportMetric(ms(g.Lib), "cache-ms")
			b.ReportMetric(ms(g.Bare), "copying-ms")
			b.ReportMetric(float64(g.Bare)/float64(g.Lib), "x-cache-vs-copying")
			b.ReportMetric(mib(g.Moved), "copied-MiB")
			b.ReportMetric(float64(g.Waits), "waits")
			b.ReportMetric(mib(g.LibPeak), "cache-peak-MiB")
			b.ReportMetric(mib(g.BarePeak), "copying-peak-MiB")
			b.ReportMetric(0, "ns/op") // the loop times both, and the checks; the figures above are the ones that matter
		})
	}
}

// smallShape is 1 layer of 8 × 128 fp16 (2 KiB rows, 1024 to a 2 MiB
// page) grown to a length that is neither a whole page nor a whole step.
var smallShape = SequenceShape{Layers: 1, KVHeads: 8, HeadDim: 128, Tokens: 1024 + 300, Step: 256}

// TestSequenceGrowthBody runs the body small, cold and warm, so a broken
// benchmark fails the tests rather than the next measurement.
func TestSequenceGrowthBody(t *testing.T) {
	for _, start := range []GrowthStart{GrowCold, GrowWarm} {
		g, err := SequenceGrowth(Rounds(2), smallShape, start)
		require.NoError(t, err)
		require.Equal(t, 2, g.N)
		require.Positive(t, g.Lib)
		require.Positive(t, g.Bare)
		require.Equal(t, 2*(1324/256), g.Moves, "2 regions, a move at every full step but the first")
		require.Equal(t, 2*2*ChunkSize, g.LibPeak, "2 regions of 2648 KiB: 2 pages each")
		require.GreaterOrEqual(t, g.BarePeak, uint64(2*1324*2048))
		if start == GrowWarm {
			require.Zero(t, g.Waits, "every page was kept from the sequence before")
		} else {
			// The mapper starts on the first unit when the sequence is
			// admitted, so the first Append may or may not find it done:
			// no lower bound, but never more than one wait a unit.
			require.LessOrEqual(t, g.Waits, 2, "1324 tokens, 1024 to a unit: 2 units a round")
		}
	}
	_, err := SequenceGrowth(Rounds(1), SequenceShape{Layers: 1, KVHeads: 1, HeadDim: 2, Tokens: 10, Step: 4}, GrowCold)
	require.Error(t, err, "a row of fewer than 4 elements")
	_, err = SequenceGrowth(Rounds(1), SequenceShape{Layers: 1 << 20, KVHeads: 1 << 10, HeadDim: 1 << 9, Tokens: 1 << 20, Step: 256}, GrowCold)
	require.ErrorIs(t, err, ErrTooLarge)
}

// TestSequenceGrowthSameBytes: grown the two ways, token by token, a
// sequence ends with the same elements in every region, those written —
// across page boundaries (the cache) and 256-token steps (the copying
// side), with a length that is neither a whole page nor a whole step — and
// so does the next sequence grown after a reset, cold or warm. A changed
// element is seen.
func TestSequenceGrowthSameBytes(t *testing.T) {
	sh := smallShape
	sh.Layers = 2
	for _, start := range []GrowthStart{GrowCold, GrowWarm} {
		t.Run(start.String(), func(t *testing.T) {
			drv, err := host.New(host.Options{Devices: 1, Capacity: 256 * units.MiB})
			require.NoError(t, err)
			defer func() { require.NoError(t, drv.Close()) }()
			space, mem := vaspace.New(drv), physical.New(drv)
			rows := newTokenRows(sh)
			lib, err := newCacheSeq(space, mem, sh, rows)
			require.NoError(t, err)
			bare, err := newCopying(space, mem, sh, rows, start)
			require.NoError(t, err)
			for range 2 { // a reset sequence grows again, from nothing or from what it kept
				for tok := range sh.Tokens {
					require.NoError(t, lib.appendToken(tok))
					require.NoError(t, bare.appendToken(tok))
				}
				require.NoError(t, sameSequences(sh, rows, lib, bare))
				for r := range sh.regions() {
					x, err := lib.region(r, sh.Tokens)
					require.NoError(t, err)
					y, err := bare.region(r, sh.Tokens)
					require.NoError(t, err)
					require.Equal(t, x, y, "region %d", r)
				}
				st := lib.c.Stats()
				require.Equal(t, 4*2*ChunkSize, st.Committed, "2 MiB pages a region: 1324 rows of 2 KiB")
				require.Equal(t, sh.Tokens, st.TokensStored)
				require.Equal(t, 4*(sh.Tokens/sh.Step), bare.moves)
				require.NoError(t, lib.c.Check())
				require.NoError(t, bare.al.Check())

				last, err := lib.region(3, sh.Tokens)
				require.NoError(t, err)
				last[len(last)-1] ^= 1
				require.ErrorContains(t, sameSequences(sh, rows, lib, bare), "region 3 differs")
				last[len(last)-1] ^= 1

				require.NoError(t, lib.reset(start))
				require.NoError(t, bare.reset(start))
				if start == GrowCold {
					require.Zero(t, lib.c.Stats().Committed)
					require.Zero(t, bare.al.Stats().Committed)
				} else {
					require.Equal(t, 4*2, lib.c.Stats().IdlePages, "kept for the next sequence: 2 pages a region")
					require.Positive(t, bare.al.Stats().Committed)
				}
			}
			require.NoError(t, lib.close())
			require.NoError(t, bare.close())
		})
	}
}
