package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// TestSmallWorkloads prints committed ÷ allocated at the peak at 2 MiB
// for workloads of a few hundred MiB, where one chunk is most of a
// percent: random lifetimes of 512 B to 1 MiB under 300 MiB live, and
// small training runs (activations up to 8 MiB). A figure, not a target:
// the item 3 reads it.
func TestSmallWorkloads(t *testing.T) {
	if testing.Short() || invariants.Enabled {
		t.Skip("replays about 100,000 allocator calls, each checked under the invariants tag")
	}
	var ws []workload
	for seed := uint64(1); seed <= 3; seed++ {
		w := randomWorkload(seed, 20000, units.MiB, 300*units.MiB)
		w.name = fmt.Sprintf("random-1MiB/%d", seed)
		ws = append(ws, w)
		w = trainingWorkload(seed, 24+8*int(seed), 3, 8*units.MiB)
		w.name = fmt.Sprintf("training-8MiB/%d", seed)
		ws = append(ws, w)
	}
	for _, w := range ws {
		r, err := runWorkload(w, AllocatorOptions{}, 0)
		require.NoError(t, err)
		t.Logf("%-16s %6d events  peak allocated %7.2f MiB  ratio %.4f  map/unmap events %d/%d",
			w.name, len(w.events), float64(r.peakAllocated)/float64(units.MiB), r.ratio(), r.stats.MapEvents, r.stats.UnmapEvents)
	}
}
