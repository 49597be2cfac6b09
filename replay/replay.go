package replay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Options configure a replay. Zero fields take the defaults.
type Options struct {
	// Capacity is each sim device's capacity, and each allocator's maximum
	// (default 80 GiB; on ReplayOn's driver, at most its devices').
	Capacity uint64
	// Granularity is the sim devices' granularity, and the allocators'
	// chunk size (default 2 MiB).
	Granularity uint64
	// Policy is the allocators' size and alignment rule.
	Policy Policy
	// NoStitch turns the allocators' stitching off.
	NoStitch bool
	// SlackDivisor sets the allocators' automatic release threshold,
	// live/SlackDivisor (0: the allocator's default).
	SlackDivisor uint64
	// CheckEvery runs every allocator's check every CheckEvery events and
	// after the last; 0 never does.
	CheckEvery int
	// Verify checks every address an allocator returns: aligned to the
	// policy's quantum and overlapping no live allocation of its device.
	Verify bool
	// Record keeps, for reports, each device's Timeline and its
	// allocator's memory map at the trace's peak (DeviceResult.PeakMap).
	Record bool
	// Drain frees every allocation still live after the last event and
	// trims the allocators, and records their figures then in
	// DeviceResult.AfterDrain.
	Drain bool
	// Progress, if set, is called with the events replayed so far and the
	// trace's events every ProgressEvents events and after the last, on
	// the replay's goroutine (the CLI draws a bar with it). A panic in it
	// ends the replay with an error (driver.ErrInvalid).
	Progress func(done, total int)
	// Deadline, when not zero, stops a replay still running then, before
	// its next event, with an error marked context.DeadlineExceeded:
	// Result.Events says how many events it replayed (the benchmarks time
	// replays that would otherwise run for hours).
	Deadline time.Time
}

// ProgressEvents is how many events pass between calls of
// Options.Progress: often enough for a bar to move, rarely enough to
// cost nothing beside the events.
const ProgressEvents = 1 << 14

// The bounds Check holds a replay to. A granularity is a chunk: below a
// page nothing maps, above 1 GiB no allocator commits that coarsely. Each
// device's allocator reserves nine times its capacity of the sim driver's
// 127 TiB of address space (two heaps of four, and its stitch range), so
// a capacity of 1 TiB — five times the largest accelerator's — leaves
// room for fourteen devices.
const (
	MinGranularity = 4 * units.KiB
	MaxGranularity = units.GiB
	MaxCapacity    = units.TiB
)

// Check returns driver.ErrInvalid, saying what would be valid, for
// options no replay can run with: a granularity that is not a power of two
// from MinGranularity to MaxGranularity, or a capacity that is not a
// multiple of the granularity from one granule to MaxCapacity. Zero fields
// stand for their defaults. Its messages start with the option's name
// (the sentinel is a mark, not part of the text).
func (o Options) Check() error {
	o.defaults()
	g, c := o.Granularity, o.Capacity
	if g&(g-1) != 0 || g < MinGranularity || g > MaxGranularity {
		return sentinel.Mark(errors.Newf("granularity %s: want a power of two from %s to %s, such as 64KiB or 2MiB",
			units.Bytes(g), units.Bytes(MinGranularity), units.Bytes(MaxGranularity)), driver.ErrInvalid)
	}
	if c%g != 0 || c > MaxCapacity {
		return sentinel.Mark(errors.Newf("capacity %s: want a multiple of the granularity %s from %s to %s, such as 80GiB",
			units.Bytes(c), units.Bytes(g), units.Bytes(g), units.Bytes(MaxCapacity)), driver.ErrInvalid)
	}
	return nil
}

func (o *Options) defaults() {
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
	Options Options
	// Devices has one entry per device the trace names, in device order.
	Devices []DeviceResult
	// Events is how many of the events were replayed: all of them, unless
	// an error stopped the replay. A replay an event stopped still has
	// each device's figures, calls and (Options.Record) timeline up to
	// the last event replayed.
	Events int
	// SpaceCalls are the Reserve and Unreserve calls of the replay, all
	// devices' together (their allocators share the address space), from
	// its start to the last event, as the sim driver counted them; zero
	// off the sim driver (DeviceResult.Priced). Left out of each device's
	// DriverTime, as PyTorch's address reservations are of its modelled
	// calls: the trace does not show them.
	SpaceCalls sim.Calls
}

// DeviceResult is the replay of one device's events.
type DeviceResult struct {
	// Device is the device in the trace (replayed on a device of its own).
	Device int
	// Granularity is the granularity the device was replayed at.
	Granularity uint64
	// Summary is the trace's own account of the device (Summarize).
	Summary Summary
	// Allocs and Frees count the allocator calls the events made (OOM
	// probes not included).
	Allocs, Frees int
	// SkippedFrees counts free_completed events whose alloc_id was not
	// live: nothing to free.
	SkippedFrees int
	// OOMs are the requests PyTorch failed, in trace order, and what
	// vmarena's allocator did with each.
	OOMs []OOM
	// Figures are the allocator's figures after the last event. A served
	// OOM probe counts in its call and event counts only: what it
	// committed is given back at once, and its peaks are left out of
	// PeakAllocated and PeakCommitted (the trace never allocated it).
	Figures Figures
	// AfterDrain are the allocator's figures after freeing what was still
	// live and trimming (Options.Drain only).
	AfterDrain Figures
	// Priced says the replay ran on a sim driver, which counts and prices
	// its calls: Replay's own, or a *sim.Driver given to ReplayOn (where
	// the calls anything else makes on it meanwhile count too). On any
	// other driver DriverCalls and CallCosts are zero.
	Priced bool
	// DriverCalls are the calls vmarena's allocator made on the device —
	// Create, Release, Map, Unmap and SetAccess — from the start of the
	// replay to the last event (Drain's not included), as the sim driver
	// counted them (sim.Driver.Tally), beside Summary.SegmentCalls,
	// PyTorch's.
	DriverCalls sim.Calls
	// CallCosts is the sim driver's table of per-call costs, which prices
	// both sides (DriverTime, PyTorchDriverTime).
	CallCosts sim.CallCosts
	// Timeline is the device's memory after each event, and PeakMap its
	// allocator's memory map when the trace's allocated memory peaked
	// (Options.Record only; nil otherwise).
	Timeline *Timeline
	PeakMap  *PeakMap
}

// OOM is a request PyTorch's allocator failed (an oom event) and whether
// vmarena's allocator served it at the same point of the replay. A served
// request is freed at once, the program having never had it, and what the
// allocator committed to serve it is given back: it counts in neither the
// replay's peaks nor its committed memory.
type OOM struct {
	// Line and Seq name the oom event.
	Line int
	Seq  uint64
	// Size is what was asked; DeviceFree what PyTorch's device had left,
	// when HasDeviceFree.
	Size          uint64
	DeviceFree    uint64
	HasDeviceFree bool
	// Served says vmarena's allocator served the request; when not,
	// Refusal is its out-of-memory error.
	Served  bool
	Refusal string
}

// Replay runs a trace's allocations through vmarena's allocator on a sim
// driver with one device for each device the trace names, one allocator
// per device: alloc is Alloc(size), free_completed is Free of the address
// its alloc got; an oom event allocates its size and frees it at once
// (recording whether that was served), then trims what that committed,
// its peaks left out of the figures; free_requested, the segment events
// (PyTorch's own) and snapshot events change nothing. The first other allocator error
// stops it, named with the event's line, seq and device. The sim driver
// counts and prices the calls each device's allocator makes
// (DeviceResult.DriverCalls).
func Replay(events []Event, opts Options) (Result, error) {
	return replayOn(nil, events, opts)
}

// ReplayOn is Replay on drv instead of a sim driver: the trace's devices,
// in order, on drv's first devices, each allocator committing at most
// opts.Capacity (which should not exceed the device's capacity). A device
// running out of memory stops the replay with driver.ErrOutOfMemory. The
// caller keeps drv and closes it.
func ReplayOn(drv driver.Driver, events []Event, opts Options) (Result, error) {
	if drv == nil {
		return Result{}, errors.Wrap(driver.ErrInvalid, "replay: no driver")
	}
	return replayOn(drv, events, opts)
}

// countDevices counts the distinct devices events name, up to most+1.
func countDevices(events []Event, most int) int {
	seen := map[int]struct{}{}
	last := 0
	for i := range events {
		if d := events[i].Device; i == 0 || d != last {
			seen[d], last = struct{}{}, d
			if len(seen) > most {
				break
			}
		}
	}
	return len(seen)
}

// replayOn is Replay on drv, or on a sim driver of its own when drv is nil.
func replayOn(drv driver.Driver, events []Event, opts Options) (res Result, err error) {
	if err := opts.Check(); err != nil {
		return res, errors.Wrap(err, "replay")
	}
	opts.defaults()
	res.Options = opts
	res.Options.Progress = nil // the result is figures, not the caller's hook
	// A trace naming more devices than a driver has is refused before
	// anything is summarized per device (a 6.6 MB trace of 200,000
	// devices built 1.2 GB of summaries, then was refused).
	if n := countDevices(events, driver.MaxDevices); n > driver.MaxDevices {
		return res, errors.Wrapf(driver.ErrInvalid, "replay: the trace names more than %d devices, the most a driver has", driver.MaxDevices)
	}
	sums := Summarize(events)
	index := map[int]int{} // trace device -> driver device, dense
	for i, s := range sums {
		index[s.Device] = i
		res.Devices = append(res.Devices, DeviceResult{Device: s.Device, Granularity: opts.Granularity, Summary: s})
	}
	if drv == nil {
		var sd *sim.Driver // err is the result, for the deferred close
		if sd, err = sim.New(sim.Options{Devices: max(1, len(sums)), Capacity: opts.Capacity, Granularity: opts.Granularity}); err != nil {
			return res, errors.Wrap(err, "replay")
		}
		defer func() { err = errors.CombineErrors(err, sd.Close()) }()
		drv = sd
	} else if n := len(drv.Devices()); n < len(sums) {
		return res, errors.Wrapf(driver.ErrNoDevice, "replay: the trace names %d devices and the %s driver has %d", len(sums), drv.Name(), n)
	}
	priced, _ := drv.(*sim.Driver)
	var before sim.Tally // the calls counted before the replay, to count its own
	if priced != nil {
		before = priced.Tally()
	}
	als, err := newAllocators(drv, len(sums), opts)
	if err != nil {
		return res, err
	}
	devs := make([]*device, len(sums))
	for i, al := range als {
		devs[i] = &device{al: al, verify: opts.Verify, quantum: opts.Policy.quantum(), addrs: map[int64]driver.Addr{}, res: &res.Devices[i]}
		if opts.Record {
			devs[i].rec = newRecorder()
		}
	}
	defer func() {
		// An allocator refuses to close over live allocations: free what
		// the trace left live (Drain has already, when asked).
		for _, d := range devs {
			err = errors.CombineErrors(err, d.close())
		}
	}()
	checkAll := func(when string) error {
		for _, d := range devs {
			if err := d.al.check(); err != nil {
				return errors.Wrapf(err, "replay: allocator check of device %d after %s", d.res.Device, when)
			}
		}
		return nil
	}

	// settle records each device's figures (and timeline, and calls) as
	// they stand: after the last event, or after the last event replayed
	// when an error stops the replay, so that a failed replay still says
	// what it did so far.
	settle := func() {
		for _, d := range devs {
			d.res.Figures = d.figures()
			if d.rec != nil {
				d.rec.finish(d)
			}
		}
		if priced != nil {
			after := priced.Tally()
			res.SpaceCalls = after.Space.Sub(before.Space)
			for i, d := range devs {
				d.res.Priced, d.res.CallCosts = true, after.Costs
				d.res.DriverCalls = after.Devices[i].Sub(before.Devices[i])
			}
		}
	}
	if err := replayEvents(events, opts, devs, index, &res, checkAll); err != nil {
		settle()
		return res, err
	}
	settle()
	if opts.CheckEvery > 0 {
		if err := checkAll("the last event"); err != nil {
			return res, err
		}
	}
	if opts.Drain {
		for _, d := range devs {
			if err := d.drain(); err != nil {
				return res, errors.Wrapf(err, "replay: drain of device %d", d.res.Device)
			}
		}
		if err := checkAll("the drain"); err != nil {
			return res, err
		}
	}
	return res, nil
}

// replayEvents replays the events on their devices, counting them in
// res.Events, until the first error.
func replayEvents(events []Event, opts Options, devs []*device, index map[int]int, res *Result, checkAll func(string) error) error {
	for i, ev := range events {
		if !opts.Deadline.IsZero() && time.Now().After(opts.Deadline) {
			return sentinel.Mark(errors.Newf("replay: the deadline passed after %d of %d events", i, len(events)), context.DeadlineExceeded)
		}
		if err := devs[index[ev.Device]].step(ev); err != nil {
			return err
		}
		res.Events = i + 1
		if opts.CheckEvery > 0 && (i+1)%opts.CheckEvery == 0 {
			if err := checkAll(fmt.Sprintf("line %d (seq %d)", ev.Line, ev.Seq)); err != nil {
				return err
			}
		}
		if opts.Progress != nil && ((i+1)%ProgressEvents == 0 || i+1 == len(events)) {
			if err := hook("Progress", func() { opts.Progress(i+1, len(events)) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// device is the replay of one device's events: its allocator, the address
// each live alloc_id got, (when verifying) its live allocations in
// address order, and (when recording) what it held after each event.
type device struct {
	al      *allocator
	verify  bool
	quantum uint64
	addrs   map[int64]driver.Addr
	live    ranges.List[driver.Addr, struct{}] // the live allocations (verify only)
	res     *DeviceResult
	rec     *recorder // Options.Record only
	// probed is the allocator's peaks after the last served oom probe
	// that raised them, nil while they are the trace's own; peak is then
	// the trace's (notePeaks).
	probed *peaks
	peak   peaks
	// pending is a modelled oom event's record until the alloc after it
	// says whether vmarena served the request.
	pending *OOM
}

func (d *device) step(ev Event) error {
	if d.rec != nil {
		defer d.rec.record(d, ev)
	}
	what := func() string {
		return fmt.Sprintf("replay: line %d (seq %d), device %d: %s of %s (alloc_id %d)",
			ev.Line, ev.Seq, ev.Device, ev.Op, units.Bytes(ev.Size), ev.AllocID)
	}
	switch ev.Op {
	case OpAlloc:
		if _, ok := d.addrs[ev.AllocID]; ok {
			return errors.Newf("%s: the alloc_id is live already", what())
		}
		p, err := d.alloc(ev.Size)
		if o := d.pending; o != nil {
			d.pending = nil
			o.Served = err == nil
			if err != nil {
				o.Refusal = err.Error()
			}
			d.res.OOMs = append(d.res.OOMs, *o)
		}
		if err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		d.res.Allocs++
		d.addrs[ev.AllocID] = p
	case OpFreeCompleted:
		p, ok := d.addrs[ev.AllocID]
		if !ok {
			d.res.SkippedFrees++
			return nil
		}
		if err := d.free(p); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		delete(d.addrs, ev.AllocID)
		d.res.Frees++
	case OpOOM:
		if ev.Modelled {
			d.pending = &OOM{Line: ev.Line, Seq: ev.Seq, Size: ev.Size, DeviceFree: ev.DeviceFree, HasDeviceFree: ev.HasDeviceFree}
			return nil
		}
		return d.probe(ev, what)
	}
	d.notePeaks()
	return nil
}

// probe asks the allocator for what PyTorch failed to serve (an oom
// event), and frees it at once if served: the program never had it. What
// the probe committed is given back (the allocator trims to what it held
// before), and its peaks do not count: the trace never allocated it, so
// it must not raise vmarena's peak committed against the trace's peak
// allocated. Calls the probe and the trim made stay counted.
func (d *device) probe(ev Event, what func() string) error {
	oom := OOM{Line: ev.Line, Seq: ev.Seq, Size: ev.Size, DeviceFree: ev.DeviceFree, HasDeviceFree: ev.HasDeviceFree}
	before := d.al.figures()
	p, err := d.alloc(ev.Size)
	switch {
	case err == nil:
		oom.Served = true
		if err := d.free(p); err != nil {
			return errors.Wrapf(err, "%s: freeing the probe", what())
		}
		if err := d.al.trimTo(before.Committed); err != nil {
			return errors.Wrapf(err, "%s: giving back what the probe committed", what())
		}
		after := d.al.figures()
		if d.probed == nil && (after.PeakAllocated != before.PeakAllocated || after.PeakCommitted != before.PeakCommitted) {
			d.peak = peaks{before.PeakAllocated, before.PeakCommitted}
		}
		if d.probed != nil || after.PeakAllocated != before.PeakAllocated || after.PeakCommitted != before.PeakCommitted {
			d.probed = &peaks{after.PeakAllocated, after.PeakCommitted}
		}
		d.notePeaks()
	case errors.Is(err, driver.ErrOutOfMemory):
		oom.Refusal = err.Error()
	default:
		return errors.Wrapf(err, "%s", what())
	}
	d.res.OOMs = append(d.res.OOMs, oom)
	return nil
}

// peaks are an allocator's peak allocated and committed memory.
type peaks struct{ allocated, committed uint64 }

// notePeaks keeps the trace's own peaks once a probe has raised the
// allocator's: the most allocated and committed after any event, until an
// event of the trace takes the allocator's peak past the probe's (the
// allocator's peak is then the trace's again, transients within an event
// included).
func (d *device) notePeaks() {
	if d.probed == nil {
		return
	}
	f := d.al.figures()
	d.peak.allocated = tracePeak(d.peak.allocated, f.Allocated, f.PeakAllocated, d.probed.allocated)
	d.peak.committed = tracePeak(d.peak.committed, f.Committed, f.PeakCommitted, d.probed.committed)
}

func tracePeak(peak, now, allocatorPeak, probed uint64) uint64 {
	if allocatorPeak > probed {
		return allocatorPeak
	}
	return max(peak, now)
}

// figures are the allocator's figures, its peaks the trace's (notePeaks).
func (d *device) figures() Figures {
	f := d.al.figures()
	if d.probed != nil {
		f.PeakAllocated = tracePeak(d.peak.allocated, f.Allocated, f.PeakAllocated, d.probed.allocated)
		f.PeakCommitted = tracePeak(d.peak.committed, f.Committed, f.PeakCommitted, d.probed.committed)
	}
	return f
}

// alloc allocates size bytes and, when verifying, records the allocation,
// checking that it is aligned and overlaps no live allocation. An
// allocation that fails the check is freed again (the allocator would
// refuse to close over it) and the check's error returned.
func (d *device) alloc(size uint64) (driver.Addr, error) {
	p, err := d.al.alloc(size)
	if err != nil || !d.verify {
		return p, err
	}
	end := p + driver.Addr(size)
	if uint64(p)%d.quantum != 0 {
		err = errors.AssertionFailedf("the allocator returned %s, not aligned to the policy's %d bytes", p, d.quantum)
	} else if i, ok := d.live.Insert(p, end, struct{}{}); !ok {
		o := d.live.At(i)
		err = errors.AssertionFailedf("the allocator returned [%s, %s), which overlaps the live allocation [%s, %s)",
			p, end, o.Start, o.End)
	}
	if err != nil {
		return 0, errors.CombineErrors(err, d.al.free(p))
	}
	return p, nil
}

// free frees the allocation at p and forgets it.
func (d *device) free(p driver.Addr) error {
	if err := d.al.free(p); err != nil {
		return err
	}
	if d.verify {
		i, found := d.live.Find(p)
		if !found || d.live.At(i).Start != p {
			return errors.AssertionFailedf("replay: freed %s, which the replay has no record of", p)
		}
		d.live.Delete(i, i+1)
	}
	return nil
}

// drain frees what is still live, in alloc_id order, trims the allocator
// and records its figures.
func (d *device) drain() error {
	ids := make([]int64, 0, len(d.addrs))
	for id := range d.addrs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := d.free(d.addrs[id]); err != nil {
			return errors.Wrapf(err, "free of alloc_id %d", id)
		}
		delete(d.addrs, id)
	}
	if err := d.al.trim(); err != nil {
		return errors.Wrap(err, "trim")
	}
	d.res.AfterDrain = d.figures()
	return nil
}

// close frees what is still live and closes the allocator.
func (d *device) close() error {
	var err error
	for id, p := range d.addrs {
		err = errors.CombineErrors(err, d.al.free(p))
		delete(d.addrs, id)
	}
	return errors.CombineErrors(err, d.al.close())
}

// hook calls fn, the caller's hook named name, and turns a panic in it
// into an error (driver.ErrInvalid): the hook is the caller's code, and a
// replay must stop cleanly, closing what it made, not unwind half-done.
func hook(name string, fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.Wrapf(driver.ErrInvalid, "replay: the %s hook panicked: %v", name, r)
		}
	}()
	fn()
	return nil
}
