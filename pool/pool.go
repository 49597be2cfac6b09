// Package pool owns stream-ordered allocation, as CUDA's memory pools
// (cudaMallocAsync / cudaFreeAsync / cudaMemPool*): a Pool hands
// out memory usable by work on a stream from a point of that stream's
// order on, takes it back at a point of a stream's order, and reuses it
// across streams only as its reuse policies allow. The package also owns
// the registry that finds the pool of a pointer (FreeAsync) and each
// device's default pool (Default).
//
// A pool owns its allocator exclusively: it never hands out the allocator,
// its arena or its reservations, so no caller can grow, shrink, free into,
// close or carve the memory behind the pool's back; what other packages
// need (ipc: where a pointer lies and the chunks under it) they get from
// pool methods. The package never touches memory except through streams
// (poisoning is a stream-ordered fill), and never calls into a pool while
// it holds the registry's lock (registry.go states the lock order).
// allocator_shim.go is its only contact with the allocator.
package pool

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// A Pool is stream-ordered allocation built on an allocator: its backing
// grows by mapping chunks and shrinks by unmapping them.
//
// MallocAsync returns memory usable by work enqueued on its stream from
// then on; FreeAsync gives it back at that point of its stream's order.
// Freed memory waits in the pending list until it is safe to hand out
// again. For an allocation on stream s, a pending block freed on stream t
// is reused when
//
//   - t is s: stream order alone keeps the uses apart;
//   - ReuseFollowEventDependencies is on and s is ordered after the free
//     (s waited on an event recorded on t after it, directly or through
//     other streams);
//   - ReuseAllowOpportunistic is on and the free has completed;
//   - ReuseAllowInternalDependencies is on: the pool makes s wait for the
//     free (inserts the dependency) and reuses the block.
//
// With all three off, memory is never reused across streams. Pending
// blocks go back to the allocator (and may then be unmapped) only once
// their free has completed: when a synchronize finds the pool holding more
// than its release threshold, or an allocation would otherwise run out of
// memory — both only with opportunistic reuse on, since memory in the
// allocator can go to any stream — and on an explicit TrimTo. The
// allocator then gives back wholly free chunks wherever they lie in its
// range, as CUDA's pools unmap any free page.
//
// Invariants (checked by Check, and after every change in builds with the
// invariants tag): every live and pending block is a live allocation of
// the allocator; no block is both; UsedMemCurrent is the sum of live
// sizes; the high-water marks are at least the current values; every
// imported block is live.
type Pool struct {
	// Fixed at creation.
	al       *allocator
	props    Props
	d        driver.Driver   // comparable (New checks)
	ranges   []vaspace.Range // the allocator's, indexed by the registry while the pool lives
	base     driver.Addr     // where offsets count from (alBase)
	max      uint64          // the size of the range at base (alMax)
	isDflt   bool
	unhook   func()
	poisonOn bool

	// mu guards everything below and every call into al. Lock order
	// (registry.go): registry.creating, then Pool.mu, then registry.mu;
	// Pool.mu also comes before the allocator's locks, the streams' and
	// events' locks, and stream's hook lock (taken under it to unhook).
	mu            lockrank.Mutex[lockrank.Pool]
	threshold     uint64
	follow        bool
	opportunistic bool
	internal      bool
	live          map[driver.Addr]block
	pending       pendingSet
	idle          []*stream.Event // events of released frees, for reuse
	usedCur       uint64
	usedHigh      uint64
	reservedHigh  uint64
	imports       map[driver.Addr]int // live blocks other processes imported, and how many times
	// held counts, of imports, those an ImportHolder keeps: only it
	// releases them (ReleaseImportFor). Each count is positive and at most
	// imports[ptr]; the rest of imports[ptr] are the caller's own.
	held      map[driver.Addr]map[*ImportHolder]int
	destroyed bool
}

// Props are a pool's properties, fixed at creation (cudaMemPoolProps).
type Props struct {
	// Device is the device whose memory backs the pool.
	Device driver.DeviceID
	// MaxSize is the most memory the pool may reserve: a whole number of
	// chunks, at least one. 0 means the device's capacity rounded down to
	// whole chunks. Any other value is taken as given, never rounded: one
	// that is not a multiple of ChunkSize, or is smaller than it, is
	// refused (ErrInvalid).
	MaxSize uint64
	// Shareable asks for chunks that can be exported to other processes
	// (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
	Shareable bool
	// ChunkSize is the unit the pool commits memory in: a multiple of the
	// device's minimum granularity (ErrMisaligned otherwise). 0 means the
	// device's recommended granularity.
	ChunkSize uint64
	// Poison fills freed memory with PoisonByte in stream order, so that
	// work reading it after the free (a use after free) sees the poison.
	// Builds with the invariants tag turn it on for every pool.
	Poison bool
}

// PoisonByte is what Poison fills freed memory with.
const PoisonByte = 0xDB

// block is a live allocation.
type block struct {
	size uint64 // bytes asked for
	cap  uint64 // bytes the allocator holds for it
	st   *stream.Stream
}

// New creates a pool on space and mem's driver, which must have streams.
func New(space *vaspace.Space, mem *physical.Memory, props Props) (*Pool, error) {
	return newPool(space, mem, props, false)
}

// newPool creates a pool, a device's default pool when dflt is set, and
// registers it.
func newPool(space *vaspace.Space, mem *physical.Memory, props Props, dflt bool) (*Pool, error) {
	d := space.Driver()
	what := func() string { return "pool: new pool" }
	// First: a driver == cannot compare would panic in every check below.
	if err := driver.CheckComparable(what, d); err != nil {
		return nil, err
	}
	if mem.Driver() != d {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the address space and the physical memory are on different drivers", what())
	}
	if !d.Supports(driver.FeatureStreams) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no streams", what(), d.Name())
	}
	devs := d.Devices()
	if err := driver.CheckDevice(what, props.Device, len(devs)); err != nil {
		return nil, err
	}
	if props.Shareable && !d.Supports(driver.FeatureShareable) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no shareable chunks", what(), d.Name())
	}
	if err := sizes(what, &props, devs[props.Device]); err != nil {
		return nil, err
	}
	al, err := newAllocator(space, mem, props.Device, props.MaxSize, props.ChunkSize, props.Shareable)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	p := &Pool{al: al, props: props, d: d, ranges: alRanges(al), base: alBase(al), max: alMax(al), isDflt: dflt,
		poisonOn: (props.Poison || invariants.Enabled) && d.Supports(driver.FeatureHostAccess),
		follow:   true, opportunistic: true, internal: true, live: map[driver.Addr]block{}}
	if err := reg.add(p); err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), alClose(al))
	}
	if p.unhook, err = stream.OnSynchronize(d, p.onSynchronize); err != nil {
		reg.remove(p)
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), alClose(al))
	}
	return p, nil
}

// sizes checks the chunk size and maximum size of props and fills in
// their defaults (Props says how); it reserves nothing.
func sizes(what func() string, props *Props, dev driver.Device) error {
	if props.ChunkSize == 0 {
		props.ChunkSize = dev.RecommendedGranularity
	}
	if err := driver.CheckSize(func() string { return what() + ": chunk size" }, props.ChunkSize, dev.MinGranularity); err != nil {
		return err
	}
	cs := props.ChunkSize
	if props.MaxSize == 0 {
		if props.MaxSize = dev.Capacity / cs * cs; props.MaxSize == 0 {
			return errors.Wrapf(driver.ErrInvalid, "%s: the chunk size %s exceeds device %d's capacity %s",
				what(), units.Bytes(cs), dev.ID, units.Bytes(dev.Capacity))
		}
		return nil
	}
	if cs > props.MaxSize {
		return errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: the chunk size %s exceeds the maximum size %s: the pool could never commit a chunk",
				what(), units.Bytes(cs), units.Bytes(props.MaxSize)),
			"make MaxSize a multiple of ChunkSize, or ChunkSize smaller")
	}
	if props.MaxSize%cs != 0 {
		down := props.MaxSize / cs * cs
		return errors.WithHintf(
			errors.Wrapf(driver.ErrInvalid, "%s: the maximum size %s is not a multiple of the chunk size %s",
				what(), units.Bytes(props.MaxSize), units.Bytes(cs)),
			"use %d or %d bytes (whole chunks)", down, down+cs)
	}
	return nil
}

// Props returns the pool's properties, with ChunkSize and MaxSize as the
// pool uses them (defaults filled in).
func (p *Pool) Props() Props {
	if p.unmade() {
		return Props{}
	}
	return p.props
}

func (p *Pool) errDestroyed(op string) error {
	return driver.Closed("pool: " + op + " on a destroyed pool")
}

// checkLocked runs Check's walk after a change in builds with the
// invariants tag, and stops at the first change that broke an invariant.
func (p *Pool) checkAfterLocked(op string) {
	if invariants.Enabled {
		invariants.Fail("pool: "+op, p.checkLocked())
	}
}

// usable returns nil when s can take work, and otherwise the refusal,
// named by the operation asking: a nil stream is ErrInvalid, a destroyed
// one ErrClosed. Every
// entry point that takes a stream asks first, before it changes anything
// — even a default pool is not created for a stream that cannot use it. A
// stream destroyed after the question is the same as one destroyed after
// the call: what the call handed out stays the caller's.
func usable(what func() string, s *stream.Stream) error {
	if s == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: no stream (nil)", what())
	}
	if s.Destroyed() {
		return errors.Wrapf(driver.ErrClosed, "%s: the stream is destroyed", what())
	}
	return nil
}

// MallocAsync returns size bytes usable by work enqueued on s from now on.
// A nil stream is ErrInvalid, a destroyed one ErrClosed. s may be of
// another device than the pool's (its work reaches the memory through
// the pool's access for that device); FreeAsync takes only a stream of
// the pool's device, so memory allocated on another's is freed on one of
// the pool's device after an event of s.
func (p *Pool) MallocAsync(size uint64, s *stream.Stream) (driver.Addr, error) {
	if p.unmade() {
		return 0, unmade("Pool.MallocAsync", "New")
	}
	what := func() string { return fmt.Sprintf("pool: malloc async %s on %s", units.Bytes(size), s) }
	if err := usable(what, s); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	if s.Driver() != p.d {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: the stream is of another driver", what())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return 0, p.errDestroyed("malloc async")
	}
	defer p.checkAfterLocked("malloc async")
	if at, wait, ok := p.reusableLocked(size, s); ok {
		if wait {
			if err := s.Wait(p.pending.at(at).ev); err != nil {
				return 0, errors.Wrapf(err, "%s: inserting the dependency on the free", what())
			}
		}
		pf := p.pending.take(at)
		p.idle = append(p.idle, pf.ev)
		return p.handOutLocked(pf.addr, size, pf.cap, s), nil
	}
	addr, err := alAlloc(p.al, size)
	if errors.Is(err, driver.ErrOutOfMemory) && p.opportunistic && p.releaseCompletedLocked() {
		addr, err = alAlloc(p.al, size)
	}
	if err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	p.noteReservedLocked()
	return p.handOutLocked(addr, size, size, s), nil
}

// reusableLocked picks the pending block to reuse for size bytes on s: the
// smallest that fits (and is not more than twice the request plus a
// chunk, so a small request does not pin a large block) among those usable
// without a wait, else the smallest the pool may make s wait for; wait is
// true when it must insert that dependency. s's own frees come first (a
// binary search: stream order alone makes them usable); another stream's
// are looked at, smallest first, only while they could beat the best so
// far.
func (p *Pool) reusableLocked(size uint64, s *stream.Stream) (best pendingAt, wait, ok bool) {
	limit := 2*size + alChunkSize(p.al)
	var bestCap uint64
	own := p.pending.listOf(s)
	if own >= 0 {
		list := p.pending.lists[own]
		if i := p.pending.fitting(own, size); i < len(list) && list[i].cap <= limit {
			best, bestCap, ok = pendingAt{own, i}, list[i].cap, true
		}
	}
	if !p.follow && !p.opportunistic && !p.internal {
		return best, false, ok
	}
	for l := range p.pending.lists {
		if l == own {
			continue
		}
		list := p.pending.lists[l]
		for i := p.pending.fitting(l, size); i < len(list) && list[i].cap <= limit; i++ {
			pf := &list[i]
			if ok && !wait && pf.cap >= bestCap {
				break // a block usable without a wait is no larger
			}
			usable := p.follow && s.OrderedAfter(pf.st, pf.pos)
			if !usable && p.opportunistic {
				done, err := pf.ev.Query()
				usable = err == nil && done
			}
			if usable {
				best, bestCap, wait, ok = pendingAt{l, i}, pf.cap, false, true
				break // the rest of this list is no smaller
			}
			if p.internal && (!ok || wait && pf.cap < bestCap) {
				best, bestCap, wait, ok = pendingAt{l, i}, pf.cap, true, true
			}
		}
	}
	return best, wait, ok
}

func (p *Pool) handOutLocked(addr driver.Addr, size, capacity uint64, s *stream.Stream) driver.Addr {
	p.live[addr] = block{size: size, cap: capacity, st: s}
	p.usedCur += size
	p.usedHigh = max(p.usedHigh, p.usedCur)
	return addr
}

func (p *Pool) noteReservedLocked() {
	p.reservedHigh = max(p.reservedHigh, alCommitted(p.al))
}

// FreeAsync gives ptr back at the current point of s's order: work
// enqueued on s before it may still use the memory, work after may not.
// s must be a stream of the pool's device: the pool records the free with
// an event of that device. A nil stream is ErrInvalid, a destroyed one
// ErrClosed, and ptr stays live.
func (p *Pool) FreeAsync(ptr driver.Addr, s *stream.Stream) error {
	if p.unmade() {
		return unmade("Pool.FreeAsync", "New")
	}
	what := func() string { return fmt.Sprintf("pool: free async %s on %s", ptr, s) }
	if err := usable(what, s); err != nil {
		return err
	}
	if s.Driver() != p.d {
		return errors.Wrapf(driver.ErrInvalid, "%s: the stream is of another driver", what())
	}
	if s.Device() != p.props.Device {
		return errors.WithHintf(
			errors.Wrapf(driver.ErrInvalid, "%s: the pool's memory is device %d's, the stream device %d's", what(), p.props.Device, s.Device()),
			"free on a stream of device %d, after an event of the stream that last used the memory", p.props.Device)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("free async")
	}
	defer p.checkAfterLocked("free async")
	b, ok := p.live[ptr]
	if n := p.imports[ptr]; ok && n > 0 {
		kept := ""
		if h := p.holdersLocked(ptr); h != "" {
			kept = " (kept: " + h + ")"
		}
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: %d other process(es) imported it and have not released it%s", what(), n, kept),
			"importers free first, as with cudaMemPoolImportPointer: wait for their release (ipc.Conn.RecvRelease)")
	}
	if !ok {
		return p.notLiveLocked(what(), ptr)
	}
	// The event first: if none can be had, nothing is enqueued yet.
	ev, err := p.eventLocked()
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	if p.poisonOn {
		if err := s.Memset(ptr, PoisonByte, b.cap); err != nil {
			p.idle = append(p.idle, ev)
			return errors.Wrapf(err, "%s: poisoning", what())
		}
	}
	pos := s.Position()
	if err := s.Record(ev); err != nil {
		p.idle = append(p.idle, ev)
		return errors.Wrapf(err, "%s", what())
	}
	delete(p.live, ptr)
	p.usedCur -= b.size
	p.pending.add(pendingFree{addr: ptr, cap: b.cap, st: s, pos: pos, ev: ev})
	return nil
}

// notLiveLocked explains why ptr is not a live allocation of the pool.
func (p *Pool) notLiveLocked(what string, ptr driver.Addr) error {
	pending := false
	p.pending.all(func(pf *pendingFree) { pending = pending || pf.addr == ptr })
	if pending {
		return errors.Wrapf(driver.ErrNotAllocated, "%s: freed already (freed twice?)", what)
	}
	return errors.Wrapf(driver.ErrNotAllocated, "%s: not the start of a live allocation of this pool", what)
}

func (p *Pool) eventLocked() (*stream.Event, error) {
	if n := len(p.idle); n > 0 {
		ev := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return ev, nil
	}
	return stream.NewEvent(p.d, p.props.Device)
}

// releaseCompletedLocked gives every pending block whose free has
// completed back to the allocator; it reports whether it gave any.
func (p *Pool) releaseCompletedLocked() bool {
	gave := false
	p.pending.filter(func(pf *pendingFree) bool {
		if done, err := pf.ev.Query(); err == nil && done && alFree(p.al, pf.addr) == nil {
			p.idle = append(p.idle, pf.ev)
			gave = true
			return false
		}
		return true
	})
	return gave
}

// onSynchronize runs after every synchronize on the pool's driver: memory
// the pool holds above its release threshold goes back to the device.
func (p *Pool) onSynchronize() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed || !p.opportunistic || alCommitted(p.al) <= p.threshold {
		return
	}
	defer p.checkAfterLocked("release at synchronize")
	p.releaseCompletedLocked()
	_ = alTrimTo(p.al, p.threshold)
}

// TrimTo releases memory back to the device until the pool holds
// minBytesToKeep, as far as its layout allows; it never releases memory
// behind outstanding allocations (live, or freed in stream order and not
// yet completed).
func (p *Pool) TrimTo(minBytesToKeep uint64) error {
	if p.unmade() {
		return unmade("Pool.TrimTo", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("trim")
	}
	defer p.checkAfterLocked("trim")
	p.releaseCompletedLocked()
	return errors.Wrap(alTrimTo(p.al, minBytesToKeep), "pool: trim")
}

// SetAccess sets what dev may do with the pool's memory, now and for
// memory the pool reserves later (cudaMemPoolSetAccess). Another device
// needs peer access to the pool's device.
func (p *Pool) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	if p.unmade() {
		return unmade("Pool.SetAccess", "New")
	}
	if dev != p.props.Device {
		st, ok := p.d.(driver.Streams)
		if !ok {
			return errors.Wrapf(driver.ErrUnsupported, "pool: set access: the %s driver has no peer access", p.d.Name())
		}
		can, err := st.CanAccessPeer(dev, p.props.Device)
		if err != nil {
			return errors.Wrap(err, "pool: set access")
		}
		if !can && acc != driver.AccessNone {
			return errors.Wrapf(driver.ErrUnsupported, "pool: set access: device %d cannot access device %d", dev, p.props.Device)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("set access")
	}
	defer p.checkAfterLocked("set access")
	return errors.Wrap(alSetAccess(p.al, dev, acc), "pool: set access")
}

// Access reports what dev may do with the pool's memory.
func (p *Pool) Access(dev driver.DeviceID) driver.Access {
	if p.unmade() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return driver.AccessNone
	}
	return alAccess(p.al, dev)
}

// Bytes returns the live allocation ptr as a slice of the size asked for,
// on drivers whose memory the process addresses (driver.HostMapper);
// others are ErrUnsupported. Like ptr itself, the slice may be used only
// by work ordered before the allocation's FreeAsync.
func (p *Pool) Bytes(ptr driver.Addr) ([]byte, error) {
	if p.unmade() {
		return nil, unmade("Pool.Bytes", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return nil, p.errDestroyed("bytes")
	}
	blk, ok := p.live[ptr]
	if !ok {
		return nil, p.notLiveLocked(fmt.Sprintf("pool: bytes of %s", ptr), ptr)
	}
	b, err := alBytes(p.al, ptr)
	if err != nil {
		return nil, errors.Wrap(err, "pool: bytes")
	}
	// The allocator's block may be a reused one, larger than asked for.
	if uint64(len(b)) < blk.size {
		return nil, errors.AssertionFailedf("pool: bytes of %s: the driver gave %d bytes of an allocation of %d", ptr, len(b), blk.size)
	}
	return b[:blk.size:blk.size], nil
}

// Owns reports whether ptr is a live allocation of the pool.
func (p *Pool) Owns(ptr driver.Addr) bool {
	if p.unmade() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.live[ptr]
	return ok
}

// Destroy waits for the frees still in flight (without the pool's lock, so
// work ahead of them may call into the pool), returns every byte to the
// device and frees the pool's address space. It refuses while allocations
// are live (ErrBusy) and for a device's default pool (ErrInvalid).
func (p *Pool) Destroy() error {
	if p.unmade() {
		return unmade("Pool.Destroy", "New")
	}
	if p.isDflt {
		return errors.Wrap(driver.ErrInvalid, "pool: destroy of a device's default pool: it lives as long as the driver")
	}
	return p.destroy()
}

func (p *Pool) destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.destroyed {
			return p.errDestroyed("destroy")
		}
		if len(p.live) > 0 {
			return errors.Wrapf(driver.ErrBusy, "pool: destroy of a pool with %d live allocation(s), %s in use", len(p.live), units.Bytes(p.usedCur))
		}
		// Frees still in flight are waited for without the lock: work ahead
		// of them (a host function that synchronizes any stream, whose
		// hooks take p.mu; one that allocates) may need it. Then look
		// again: the pool may have changed meanwhile.
		var inFlight []*stream.Event
		p.pending.all(func(pf *pendingFree) {
			if done, err := pf.ev.Query(); err != nil || !done {
				inFlight = append(inFlight, pf.ev)
			}
		})
		if len(inFlight) == 0 {
			break
		}
		p.mu.Unlock()
		var errs error
		for _, ev := range inFlight {
			errs = errors.CombineErrors(errs, ev.WaitDone()) // not Synchronize: its hooks would take p.mu
		}
		p.mu.Lock()
		if errs != nil {
			return errors.Wrap(errs, "pool: destroy: waiting for the frees in flight")
		}
	}
	var errs error
	p.pending.all(func(pf *pendingFree) {
		errs = errors.CombineErrors(errs, pf.ev.WaitDone()) // done already (above): returns at once
		errs = errors.CombineErrors(errs, alFree(p.al, pf.addr))
		p.idle = append(p.idle, pf.ev)
	})
	p.pending.clear()
	for _, ev := range p.idle {
		errs = errors.CombineErrors(errs, ev.Destroy())
	}
	p.idle = nil
	// Out of the index before the ranges are freed: once they are, the
	// driver may hand them to a new pool, which registers them.
	reg.remove(p)
	if err := alClose(p.al); err != nil {
		// Still reserved, so still ours: the pool lives on, and can be
		// destroyed again.
		return errors.Wrap(errors.CombineErrors(errors.CombineErrors(errs, err), reg.add(p)), "pool: destroy")
	}
	p.destroyed = true
	p.unhook()
	reg.forgetDefault(p)
	return errors.Wrap(errs, "pool: destroy")
}

// Check verifies the pool's invariants and its allocator's, and reports
// every violation.
func (p *Pool) Check() error {
	if p.unmade() {
		return unmade("Pool.Check", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checkLocked()
}

func (p *Pool) checkLocked() error {
	if p.destroyed {
		return nil
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var used uint64
	for a, b := range p.live {
		used += b.size
		if n, err := alSize(p.al, a); err != nil || n < b.size {
			fail("pool: block at %s is not a live allocation of %d bytes or more (%v)", a, b.size, err)
		}
	}
	p.pending.check(fail)
	p.pending.all(func(pf *pendingFree) {
		if _, isLive := p.live[pf.addr]; isLive {
			fail("pool: block at %s is both live and pending", pf.addr)
		}
		if _, err := alSize(p.al, pf.addr); err != nil {
			fail("pool: pending block at %s is not held by the allocator: %v", pf.addr, err)
		}
	})
	if n := len(p.live) + p.pending.len(); n != alLive(p.al) {
		fail("pool: %d live and %d pending blocks, the allocator has %d live allocations", len(p.live), p.pending.len(), alLive(p.al))
	}
	for a, n := range p.imports {
		if _, isLive := p.live[a]; !isLive || n <= 0 {
			fail("pool: %d import(s) counted of %s, which is not live", n, a)
		}
	}
	for a, hs := range p.held {
		sum := 0
		for h, k := range hs {
			if k <= 0 {
				fail("pool: %s keeps %d import(s) of %s", h, k, a)
			}
			sum += k
		}
		if len(hs) == 0 || sum > p.imports[a] {
			fail("pool: holders keep %d import(s) of %s in %d entries, %d are counted", sum, a, len(hs), p.imports[a])
		}
	}
	if !slices.Equal(p.ranges, alRanges(p.al)) {
		fail("pool: the allocator's ranges %v moved from %v", alRanges(p.al), p.ranges)
	}
	if used != p.usedCur {
		fail("pool: live blocks hold %d bytes, UsedMemCurrent says %d", used, p.usedCur)
	}
	if p.usedHigh < p.usedCur {
		fail("pool: UsedMemHigh %d below current %d", p.usedHigh, p.usedCur)
	}
	return errors.CombineErrors(errs, alCheck(p.al))
}
