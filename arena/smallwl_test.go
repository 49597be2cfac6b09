package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// TestSmallWorkloads: committed ÷ allocated at the peak at 2 MiB for
// workloads of a few hundred MiB, where one chunk is most of a percent —
// random lifetimes of 512 B to 1 MiB under 300 MiB live and of 512 B to
// 8 MiB under 256 MiB, and small training runs (activations up to
// 8 MiB) — is at most what PyTorch's caching allocator reserves for the
// same events (internal/cachingmodel), and printed.
func TestSmallWorkloads(t *testing.T) {
	if testing.Short() || invariants.Enabled {
		t.Skip("replays about 100,000 allocator calls, each checked under the invariants tag")
	}
	var ws []workload
	for seed := uint64(1); seed <= 3; seed++ {
		w := randomWorkload(seed, 20000, units.MiB, 300*units.MiB)
		w.name = fmt.Sprintf("random-1MiB/%d", seed)
		ws = append(ws, w)
		w = randomWorkload(seed, 3000, 8*units.MiB, 256*units.MiB)
		w.name = fmt.Sprintf("random-8MiB/%d", seed)
		ws = append(ws, w)
		w = trainingWorkload(seed, 24+8*int(seed), 3, 8*units.MiB)
		w.name = fmt.Sprintf("training-8MiB/%d", seed)
		ws = append(ws, w)
	}
	for _, w := range ws {
		r, err := runWorkload(w, AllocatorOptions{}, 0)
		require.NoError(t, err)
		pt, _, ok := cachingRatio(w, 80*units.GiB)
		require.True(t, ok)
		t.Logf("%-16s %6d events  peak allocated %7.2f MiB  ratio %.4f (PyTorch's caching allocator, modelled: %.4f)  map/unmap events %d/%d",
			w.name, len(w.events), float64(r.peakAllocated)/float64(units.MiB), r.ratio(), pt, r.stats.MapEvents, r.stats.UnmapEvents)
		require.LessOrEqual(t, r.ratio(), pt, "%s: at most the caching allocator's", w.name)
	}
}
