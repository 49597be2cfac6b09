package trace

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Targets from issue 3 for vmarena's allocator on a replayed trace.
const (
	// TargetRatio is the most peak committed / peak allocated may be, at
	// TargetGranularity.
	TargetRatio = 1.02
	// TargetGranularity is the granularity TargetRatio is stated for.
	TargetGranularity = 2 * units.MiB
)

// ReplayOptions configure a replay. Zero fields take the defaults.
type ReplayOptions struct {
	// Capacity is the sim device's capacity, and the arena's maximum
	// (default 80 GiB).
	Capacity uint64
	// Granularity is the sim device's granularity, and the arena's chunk
	// size (default 2 MiB).
	Granularity uint64
	// Policy is the allocator's size and alignment rule.
	Policy arena.Policy
	// NoStitch turns the allocator's stitching off.
	NoStitch bool
	// CheckEvery runs the allocator's Check every CheckEvery events and
	// after the last; 0 never does.
	CheckEvery int
	// Verify checks every address the allocator returns: aligned to the
	// policy's quantum and overlapping no live allocation.
	Verify bool
	// Drain frees every allocation still live after the last event and
	// trims the allocator, and records its figures then in
	// Result.AfterDrain.
	Drain bool
}

func (o *ReplayOptions) defaults() {
	if o.Capacity == 0 {
		o.Capacity = 80 * units.GiB
	}
	if o.Granularity == 0 {
		o.Granularity = 2 * units.MiB
	}
}

// Result is what a replay did, beside what the trace says PyTorch did.
type Result struct {
	// Options are the options the replay ran with, defaults filled in.
	Options ReplayOptions
	// Summary is the trace's own account (Summarize).
	Summary Summary
	// Allocs and Frees count the allocator calls made.
	Allocs, Frees int
	// SkippedFrees counts free_completed events whose alloc_id was not
	// live: nothing to free.
	SkippedFrees int
	// Stats are the allocator's figures after the last event.
	Stats arena.AllocStats
	// AfterDrain are the allocator's figures after freeing what was still
	// live and trimming (ReplayOptions.Drain only).
	AfterDrain arena.AllocStats
}

// Ratio is the allocator's peak committed over the trace's peak allocated:
// the figure to set beside Summary.PyTorchRatio. The trace's figure is the
// denominator of both, so the two compare the same live bytes.
func (r Result) Ratio() float64 {
	if r.Summary.PeakAllocated == 0 {
		return 0
	}
	return float64(r.Stats.PeakCommitted) / float64(r.Summary.PeakAllocated)
}

// Verdict says whether a target was met.
type Verdict string

const (
	Met    Verdict = "met"
	NotMet Verdict = "not met"
	// NA: the target does not apply (another granularity; a trace with no
	// segment events to compare with).
	NA Verdict = "n/a"
)

// RatioTarget: Ratio at most TargetRatio, at TargetGranularity.
func (r Result) RatioTarget() Verdict {
	switch {
	case r.Options.Granularity != TargetGranularity || r.Summary.PeakAllocated == 0:
		return NA
	case r.Ratio() <= TargetRatio:
		return Met
	}
	return NotMet
}

// MapCallsTarget: no more chunk mappings than the trace has segment events
// (PyTorch's cudaMalloc and cudaFree calls).
func (r Result) MapCallsTarget() Verdict {
	switch {
	case r.Summary.SegmentEvents == 0:
		return NA
	case r.Stats.MapCalls <= r.Summary.SegmentEvents:
		return Met
	}
	return NotMet
}

// Replay runs a trace's allocations through vmarena's allocator on a sim
// driver with one device: alloc is Alloc(size, 0), free_completed is Free
// of the address its alloc got; free_requested and the segment events
// (PyTorch's own) change nothing. The first allocator error stops it, named
// with the event's line and seq.
func Replay(events []Event, opts ReplayOptions) (res Result, err error) {
	opts.defaults()
	res.Options = opts
	res.Summary = Summarize(events)
	if res.Summary.Devices > 1 {
		return res, errors.Newf("trace: replay: the trace has events on %d devices; replay traces of one device", res.Summary.Devices)
	}
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: opts.Capacity, Granularity: opts.Granularity})
	if err != nil {
		return res, errors.Wrap(err, "trace: replay")
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	al, err := arena.NewAllocator(vaspace.New(drv), physical.New(drv), arena.AllocatorOptions{
		Arena:  arena.Options{Device: 0, Max: opts.Capacity, ChunkSize: opts.Granularity},
		Policy: opts.Policy, NoStitch: opts.NoStitch,
	})
	if err != nil {
		return res, errors.Wrap(err, "trace: replay")
	}
	r := replayer{al: al, opts: opts, addrs: map[int64]driver.Addr{}}
	defer func() {
		// The allocator refuses to close over live allocations: free what
		// the trace left live (Drain has already, when asked).
		for _, p := range r.addrs {
			err = errors.CombineErrors(err, al.Free(p))
		}
		err = errors.CombineErrors(err, al.Close())
	}()
	for i, ev := range events {
		if err := r.step(ev, &res); err != nil {
			return res, err
		}
		if opts.CheckEvery > 0 && (i+1)%opts.CheckEvery == 0 {
			if err := al.Check(); err != nil {
				return res, errors.Wrapf(err, "trace: replay: allocator check after line %d (seq %d)", ev.Line, ev.Seq)
			}
		}
	}
	res.Stats = al.Stats()
	if opts.CheckEvery > 0 {
		if err := al.Check(); err != nil {
			return res, errors.Wrap(err, "trace: replay: allocator check after the last event")
		}
	}
	if opts.Drain {
		ids := make([]int64, 0, len(r.addrs))
		for id := range r.addrs {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			if err := r.free(id); err != nil {
				return res, errors.Wrapf(err, "trace: replay: drain: free of alloc_id %d", id)
			}
		}
		if err := al.Trim(); err != nil {
			return res, errors.Wrap(err, "trace: replay: drain: trim")
		}
		if err := al.Check(); err != nil {
			return res, errors.Wrap(err, "trace: replay: allocator check after the drain")
		}
		res.AfterDrain = al.Stats()
	}
	return res, nil
}

// replayer is one replay's state: the address each live alloc_id got, and
// (when verifying) the live allocations in address order.
type replayer struct {
	al    *arena.Allocator
	opts  ReplayOptions
	addrs map[int64]driver.Addr
	live  []span // sorted by base, disjoint (Verify only)
}

type span struct{ base, end driver.Addr }

func (r *replayer) step(ev Event, res *Result) error {
	what := func() string {
		return fmt.Sprintf("trace: replay: line %d (seq %d): %s of %s (alloc_id %d)", ev.Line, ev.Seq, ev.Op, units.Bytes(ev.Size), ev.AllocID)
	}
	switch ev.Op {
	case OpAlloc:
		if _, ok := r.addrs[ev.AllocID]; ok {
			return errors.Newf("%s: the alloc_id is live already", what())
		}
		p, err := r.al.Alloc(ev.Size, 0)
		if err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		res.Allocs++
		if r.opts.Verify {
			if err := r.add(p, ev); err != nil {
				return errors.Wrapf(err, "%s", what())
			}
		}
		r.addrs[ev.AllocID] = p
	case OpFreeCompleted:
		if _, ok := r.addrs[ev.AllocID]; !ok {
			res.SkippedFrees++
			return nil
		}
		if err := r.free(ev.AllocID); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		res.Frees++
	}
	return nil
}

func (r *replayer) free(id int64) error {
	p := r.addrs[id]
	if err := r.al.Free(p); err != nil {
		return err
	}
	delete(r.addrs, id)
	if r.opts.Verify {
		i, found := slices.BinarySearchFunc(r.live, p, func(s span, p driver.Addr) int { return cmp.Compare(s.base, p) })
		if !found {
			return errors.AssertionFailedf("trace: replay: freed %s, which the replay has no record of", p)
		}
		r.live = slices.Delete(r.live, i, i+1)
	}
	return nil
}

// add records the allocation at p, checking that it is aligned and
// overlaps no live allocation.
func (r *replayer) add(p driver.Addr, ev Event) error {
	if q := r.opts.Policy.Quantum(); uint64(p)%q != 0 {
		return errors.AssertionFailedf("the allocator returned %s, not aligned to the policy's %d bytes", p, q)
	}
	s := span{p, p + driver.Addr(ev.Size)}
	i, _ := slices.BinarySearchFunc(r.live, p, func(s span, p driver.Addr) int { return cmp.Compare(s.base, p) })
	if i > 0 && r.live[i-1].end > s.base {
		return errors.AssertionFailedf("the allocator returned [%s, %s), which overlaps the live allocation [%s, %s)",
			s.base, s.end, r.live[i-1].base, r.live[i-1].end)
	}
	if i < len(r.live) && r.live[i].base < s.end {
		return errors.AssertionFailedf("the allocator returned [%s, %s), which overlaps the live allocation [%s, %s)",
			s.base, s.end, r.live[i].base, r.live[i].end)
	}
	r.live = slices.Insert(r.live, i, s)
	return nil
}
