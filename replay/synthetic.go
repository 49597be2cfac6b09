package replay

// Synthetic allocator workloads: traces generated from a seed, replayed
// like the real ones, for shapes and scales no bundled trace has.

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Workloads names the synthetic workloads Synthetic makes.
var Workloads = []string{"random-lifetimes"}

// Synthetic returns the events of the named synthetic workload (one of
// Workloads) with its default options but the number of events (0: its
// default), drawn from seed: the same name, seed and events give the same
// events. An unknown name is driver.ErrInvalid, naming those there are, as
// is a number of events the workload refuses.
func Synthetic(name string, seed uint64, events int) ([]Event, error) {
	switch name {
	case "random-lifetimes":
		return RandomLifetimes{Seed: seed, Events: events}.Generate()
	}
	return nil, errors.Wrapf(driver.ErrInvalid, "replay: unknown synthetic workload %q, want %s", name, strings.Join(Workloads, " or "))
}

// The random-lifetimes workload's defaults, and the most events it makes:
// as many as a trace file may hold (MaxTraceEvents), since the events are
// built in memory as a trace's are (112 bytes each, 1.9 GB at the most).
const (
	DefaultSyntheticEvents = 100_000
	MaxSyntheticEvents     = MaxTraceEvents
)

// RandomLifetimes is the random-lifetimes workload: allocations of sizes
// drawn log-uniform from MinSize to MaxSize (as many 4 KiB requests as
// 4 GiB ones per factor of two), each with a lifetime drawn log-uniform
// from 1 to Events steps of the generator (a step makes an alloc or a
// free; nothing expires by itself: a lifetime orders the frees). The
// workload allocates while fewer than Live bytes are live, and otherwise
// frees the live allocation whose lifetime ends first; before an allocation that would take the live
// bytes past Limit it frees the same way until it fits, so live never
// exceeds Limit. Where Live + MaxSize is at most Limit (as with the
// defaults: 56 GiB live, 80 GiB at most), the live bytes thus stay within
// MaxSize of Live once they reach it, held mostly by allocations of long
// lifetimes while short ones come and go.
//
// Its events are an alloc and a free_completed per allocation (no
// free_requested: the free is complete at once), on device 0 and stream
// 0, numbered by seq from 0 and by line from 2 as if read from a file
// after its header; each allocation has an address of its own, never
// reused. Allocations still live after the last event stay live, as in a
// recorded trace. Zero fields take the defaults.
type RandomLifetimes struct {
	// Seed draws the sizes and lifetimes.
	Seed uint64
	// Events is how many events to make (default DefaultSyntheticEvents,
	// at most MaxSyntheticEvents).
	Events int
	// MinSize and MaxSize bound the sizes (default 512 B and 4 GiB).
	MinSize, MaxSize uint64
	// Live is the live bytes the workload keeps (default 56 GiB).
	Live uint64
	// Limit is the most bytes ever live (default 80 GiB: what an 80 GiB
	// device holds); at least MaxSize and Live.
	Limit uint64
}

func (w *RandomLifetimes) defaults() {
	if w.Events == 0 {
		w.Events = DefaultSyntheticEvents
	}
	if w.MinSize == 0 {
		w.MinSize = 512
	}
	if w.MaxSize == 0 {
		w.MaxSize = 4 * units.GiB
	}
	if w.Live == 0 {
		w.Live = 56 * units.GiB
	}
	if w.Limit == 0 {
		w.Limit = 80 * units.GiB
	}
}

// Check returns driver.ErrInvalid, saying what would be valid, for
// options no workload can be made with: a negative count of events or
// one over MaxSyntheticEvents, MinSize above MaxSize, or a Limit below
// MaxSize or Live. Zero fields stand for their defaults.
func (w RandomLifetimes) Check() error {
	w.defaults()
	invalid := func(format string, args ...any) error {
		return sentinel.Mark(errors.Newf("replay: random-lifetimes: "+format, args...), driver.ErrInvalid)
	}
	switch {
	case w.Events < 0 || w.Events > MaxSyntheticEvents:
		return invalid("%d events: want 1 to %d (0 for the default %d)", w.Events, MaxSyntheticEvents, DefaultSyntheticEvents)
	case w.MinSize > w.MaxSize:
		return invalid("sizes from %s to %s: the least is above the most", units.Bytes(w.MinSize), units.Bytes(w.MaxSize))
	case w.Limit < w.MaxSize:
		return invalid("limit %s is below the largest size %s, which could never be allocated", units.Bytes(w.Limit), units.Bytes(w.MaxSize))
	case w.Limit < w.Live:
		return invalid("limit %s is below the live bytes %s to keep", units.Bytes(w.Limit), units.Bytes(w.Live))
	}
	return nil
}

// Generate makes the workload's events, or returns Check's error.
func (w RandomLifetimes) Generate() ([]Event, error) {
	if err := w.Check(); err != nil {
		return nil, err
	}
	w.defaults()
	rng := rand.New(rand.NewPCG(w.Seed, 0x72616e646f6d)) // "random"
	events := make([]Event, 0, w.Events)
	add := func(op Op, a *liveAlloc) {
		events = append(events, Event{Line: len(events) + 2, Seq: uint64(len(events)), Op: op, Size: a.size,
			Addr: a.addr, HasAddr: true, AllocID: a.id})
	}
	var live allocHeap
	var bytes, next uint64 // live bytes; the next address
	free := func() {
		a := heap.Pop(&live).(*liveAlloc)
		bytes -= a.size
		add(OpFreeCompleted, a)
	}
	for id := int64(0); len(events) < w.Events; id++ {
		if bytes >= w.Live && live.Len() > 0 {
			free()
			continue
		}
		a := &liveAlloc{id: id, size: logUniform(rng, w.MinSize, w.MaxSize), addr: next}
		a.ends = id + int64(logUniform(rng, 1, uint64(w.Events)))
		for bytes+a.size > w.Limit && len(events) < w.Events {
			free()
		}
		if len(events) == w.Events {
			break
		}
		next += (a.size + 511) &^ 511
		bytes += a.size
		heap.Push(&live, a)
		add(OpAlloc, a)
	}
	return events, nil
}

// logUniform draws from [lo, hi] with a uniform logarithm.
func logUniform(rng *rand.Rand, lo, hi uint64) uint64 {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return min(hi, max(lo, uint64(math.Exp(l+rng.Float64()*(h-l)))))
}

// liveAlloc is a live allocation of the workload, made at step id (its
// AllocID): its lifetime ends at step ends, which orders the frees.
type liveAlloc struct {
	id, ends   int64
	size, addr uint64
}

// allocHeap is the live allocations, the one whose lifetime ends first on
// top (the earlier made first among equals, so the order is the seed's
// alone).
type allocHeap []*liveAlloc

func (h allocHeap) Len() int { return len(h) }
func (h allocHeap) Less(i, j int) bool {
	if h[i].ends != h[j].ends {
		return h[i].ends < h[j].ends
	}
	return h[i].id < h[j].id
}
func (h allocHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *allocHeap) Push(x any)   { *h = append(*h, x.(*liveAlloc)) }
func (h *allocHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = slices.Delete(old, len(old)-1, len(old))
	return x
}
