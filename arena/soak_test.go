package arena

import (
	heapq "container/heap"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The drift soak: does the allocator's layout degrade with history? A
// stationary workload — the same distribution of requests from the first
// event to the last — replayed for a long time, its ratio sampled as it
// goes. An allocator whose layout holds reads the same ratio in the last
// window as in the first.

// soakEvents is how many events BenchmarkSoak replays at each
// granularity: go test ./arena -run '^$' -bench Soak -benchtime 1x -args
// -soak-events 10000000.
var soakEvents = flag.Int("soak-events", 1_000_000, "the events BenchmarkSoak replays at each granularity")

// soakWindow is how many events each of the soak's samples covers.
const soakWindow = 100_000

// The stationary workload: sizes log-uniform from 512 B to soakMaxSize;
// each allocation's lifetime log-uniform from 1 to soakMaxLife events,
// ordering the frees; an alloc while fewer than soakLive bytes are live, a
// free of the allocation whose lifetime ends first otherwise, and never
// more than soakLimit live. The lifetimes do not grow with the run, so
// after the first window the live set's make-up is the same at any time.
const (
	soakMaxSize = units.GiB
	soakMaxLife = 50_000
	soakLive    = 40 * units.GiB
	soakLimit   = 60 * units.GiB
)

// soakAlloc is a live allocation of the soak: its address, size and the
// event at which its lifetime ends.
type soakAlloc struct {
	p      driver.Addr
	size   uint64
	expiry int
}

type soakHeap []soakAlloc

func (h soakHeap) Len() int           { return len(h) }
func (h soakHeap) Less(i, j int) bool { return h[i].expiry < h[j].expiry }
func (h soakHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *soakHeap) Push(x any)        { *h = append(*h, x.(soakAlloc)) }
func (h *soakHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// soakResult is a soak's samples: each window's peak committed over its
// peak allocated.
type soakResult struct {
	ratios    []float64
	cpu, wall time.Duration
	events    int
	calls     sim.Calls
}

// soak replays n events of the stationary workload drawn from seed on an
// 80 GiB sim device of granularity g.
func soak(seed uint64, n int, g uint64) (soakResult, error) {
	var r soakResult
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: 80 * units.GiB, Granularity: g})
	if err != nil {
		return r, err
	}
	defer drv.Close()
	al, err := NewAllocator(vaspace.New(drv), physical.New(drv), AllocatorOptions{ChunkSize: g})
	if err != nil {
		return r, err
	}
	rng := rand.New(rand.NewPCG(seed, 404))
	var live soakHeap
	var allocated, winAlloc, winCommit uint64
	free := func() error {
		a := heapq.Pop(&live).(soakAlloc)
		allocated -= a.size
		return al.Free(a.p)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0, wall0 := threadCPU(), time.Now()
	for i := 0; i < n; i++ {
		if allocated < soakLive {
			size := logUniform(rng, 512, soakMaxSize)
			for allocated+size > soakLimit {
				if err := free(); err != nil {
					return r, err
				}
			}
			p, err := al.Alloc(size, 0)
			if err != nil {
				return r, fmt.Errorf("event %d: %w", i, err)
			}
			allocated += size
			heapq.Push(&live, soakAlloc{p, size, i + int(logUniform(rng, 1, soakMaxLife))})
		} else if err := free(); err != nil {
			return r, err
		}
		winAlloc = max(winAlloc, allocated)
		winCommit = max(winCommit, al.committedNow())
		if (i+1)%soakWindow == 0 || i+1 == n {
			r.ratios = append(r.ratios, float64(winCommit)/float64(winAlloc))
			winAlloc, winCommit = 0, 0
		}
	}
	r.cpu, r.wall, r.events = threadCPU()-cpu0, time.Since(wall0), n
	r.calls = drv.Tally().Devices[0]
	for live.Len() > 0 {
		if err := free(); err != nil {
			return r, err
		}
	}
	if err := al.Check(); err != nil {
		return r, err
	}
	return r, al.Close()
}

// committedNow is the memory committed, for the soak's samples.
func (al *Allocator) committedNow() uint64 {
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.committed()
}

// soakDrift sums up a soak's samples: the mean ratio of its early
// windows (the tenth after the first, which holds the warm-up: at least
// one), of as many last ones, and the largest after the first.
func soakDrift(ratios []float64) (early, late, worst float64) {
	rest := ratios[min(1, len(ratios)-1):]
	k := max(1, len(rest)/10)
	for i := range k {
		early += rest[i] / float64(k)
		late += rest[len(rest)-k+i] / float64(k)
	}
	for _, x := range rest {
		worst = max(worst, x)
	}
	return early, late, worst
}

// BenchmarkSoak replays the stationary workload at 2 MiB and 64 KiB and
// reports the mean ratio of its early windows (the baseline, from the
// same run), of its late ones, their difference (the drift, which a
// layout that holds keeps within 0.001) and the largest, with the CPU
// time per event (thread clock) beside the wall time and the modelled
// driver time (A100 table) per window.
func BenchmarkSoak(b *testing.B) {
	for _, g := range []uint64{2 * units.MiB, 64 * units.KiB} {
		b.Run(units.Bytes(g), func(b *testing.B) {
			for range b.N {
				r, err := soak(1, *soakEvents, g)
				if err != nil {
					b.Fatal(err)
				}
				early, late, worst := soakDrift(r.ratios)
				b.ReportMetric(early, "ratio-early")
				b.ReportMetric(late, "ratio-late")
				b.ReportMetric(worst, "ratio-max")
				b.ReportMetric(late-early, "drift")
				b.ReportMetric(float64(r.cpu.Nanoseconds())/float64(r.events), "cpu-ns/event")
				b.ReportMetric(float64(r.wall.Nanoseconds())/float64(r.events), "wall-ns/event")
				b.ReportMetric(float64(r.calls.Time(sim.A100).Milliseconds())/float64(r.events)*soakWindow, "A100-ms/window")
				b.Logf("%s: %d events, ratio per %d events: %.4f", units.Bytes(g), r.events, soakWindow, r.ratios)
			}
		})
	}
}

// TestSoakSmall runs the soak for a few windows, checked: a test of the
// benchmark's machinery, not a figure.
func TestSoakSmall(t *testing.T) {
	if testing.Short() || race.Enabled || invariants.Enabled {
		t.Skip("replays 30,000 events on one goroutine, where the race detector finds nothing and the invariants build checks every structure after every change")
	}
	r, err := soak(2, 3*soakWindow/10, 2*units.MiB)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ratios) != 1 || r.ratios[0] < 1 {
		t.Fatalf("samples %v: want one window, committed at least what is allocated", r.ratios)
	}
}
