package arena

import (
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// A Pool is stream-ordered allocation, as CUDA's memory pools
// (cudaMallocAsync / cudaFreeAsync, seed 002), built on an Allocator: its
// backing grows by mapping chunks and shrinks by unmapping them.
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
// allocator can unmap only its free tail, so memory released from inside
// the arena stays committed (and pooled) until the tail reaches it.
//
// Invariants (checked by Check): every live and pending block is a live
// allocation of the allocator; no block is both; UsedMemCurrent is the sum
// of live sizes; the high-water marks are at least the current values.
type Pool struct {
	al       *Allocator
	props    PoolProps
	d        driver.Driver
	isDflt   bool
	unhook   func()
	poisonOn bool

	mu            sync.Mutex
	threshold     uint64
	follow        bool
	opportunistic bool
	internal      bool
	live          map[driver.Addr]poolBlock
	pending       []*pendingFree
	idle          []*stream.Event // events of released frees, for reuse
	usedCur       uint64
	usedHigh      uint64
	reservedHigh  uint64
	imports       map[driver.Addr]int // live allocations other processes imported, and how many times
	destroyed     bool
}

// PoolProps are a pool's properties, fixed at creation (cudaMemPoolProps).
type PoolProps struct {
	// Device is the device whose memory backs the pool.
	Device driver.DeviceID
	// MaxSize is the most memory the pool may reserve (0: the device's
	// capacity).
	MaxSize uint64
	// Shareable asks for chunks that can be exported to other processes
	// (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
	Shareable bool
	// ChunkSize is the unit the pool's arena commits in (default: the
	// device's recommended granularity).
	ChunkSize uint64
	// Poison fills freed memory with PoisonByte in stream order, so that
	// work reading it after the free (a use after free) sees the poison.
	// Builds with the invariants tag turn it on for every pool.
	Poison bool
}

// PoisonByte is what Poison fills freed memory with.
const PoisonByte = 0xDB

// PoolAttr names a pool attribute; the values are CUDA's cudaMemPoolAttr.
type PoolAttr int

const (
	ReuseFollowEventDependencies   PoolAttr = 1
	ReuseAllowOpportunistic        PoolAttr = 2
	ReuseAllowInternalDependencies PoolAttr = 3
	ReleaseThreshold               PoolAttr = 4
	ReservedMemCurrent             PoolAttr = 5
	ReservedMemHigh                PoolAttr = 6
	UsedMemCurrent                 PoolAttr = 7
	UsedMemHigh                    PoolAttr = 8
)

func (a PoolAttr) String() string {
	switch a {
	case ReuseFollowEventDependencies:
		return "reuse-follow-event-dependencies"
	case ReuseAllowOpportunistic:
		return "reuse-allow-opportunistic"
	case ReuseAllowInternalDependencies:
		return "reuse-allow-internal-dependencies"
	case ReleaseThreshold:
		return "release-threshold"
	case ReservedMemCurrent:
		return "reserved-mem-current"
	case ReservedMemHigh:
		return "reserved-mem-high"
	case UsedMemCurrent:
		return "used-mem-current"
	case UsedMemHigh:
		return "used-mem-high"
	}
	return fmt.Sprintf("pool-attribute(%d)", int(a))
}

type poolBlock struct {
	size uint64 // bytes asked for
	cap  uint64 // bytes the allocator holds for it
	st   *stream.Stream
}

type pendingFree struct {
	addr driver.Addr
	cap  uint64
	st   *stream.Stream
	pos  uint64        // the free's position in st
	ev   *stream.Event // recorded on st right after the free
}

// NewPool creates a pool on space and mem's driver, which must have
// streams.
func NewPool(space *vaspace.Space, mem *physical.Memory, props PoolProps) (*Pool, error) {
	d := space.Driver()
	if !d.Supports(driver.FeatureStreams) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "arena: new pool: the %s driver has no streams", d.Name())
	}
	devs := d.Devices()
	if err := driver.CheckDevice(func() string { return "arena: new pool" }, props.Device, len(devs)); err != nil {
		return nil, err
	}
	max := props.MaxSize
	if max == 0 {
		max = devs[props.Device].Capacity
	}
	if props.Shareable && !d.Supports(driver.FeatureShareable) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "arena: new pool: the %s driver has no shareable chunks", d.Name())
	}
	// A shareable pool does not stitch: an allocation another process
	// imports is then always one range of the arena's chunks.
	al, err := NewAllocator(space, mem, AllocatorOptions{
		Arena:    Options{Device: props.Device, Max: max, ChunkSize: props.ChunkSize, shareable: props.Shareable},
		NoStitch: props.Shareable,
	})
	if err != nil {
		return nil, errors.Wrap(err, "arena: new pool")
	}
	p := &Pool{al: al, props: props, d: d, poisonOn: (props.Poison || invariants) && d.Supports(driver.FeatureHostAccess),
		follow: true, opportunistic: true, internal: true, live: map[driver.Addr]poolBlock{}}
	p.unhook = stream.OnSynchronize(d, p.onSynchronize)
	registerPool(p)
	return p, nil
}

// Props returns the pool's properties.
func (p *Pool) Props() PoolProps { return p.props }

// Allocator is the allocator behind the pool.
func (p *Pool) Allocator() *Allocator { return p.al }

func (p *Pool) errDestroyed(op string) error {
	return driver.Closed("arena: " + op + " on a destroyed pool")
}

// MallocAsync returns size bytes usable by work enqueued on s from now on.
func (p *Pool) MallocAsync(size uint64, s *stream.Stream) (driver.Addr, error) {
	what := func() string { return fmt.Sprintf("arena: malloc async %s on %s", units.Bytes(size), s) }
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
	if i, wait := p.reusableLocked(size, s); i >= 0 {
		pf := p.pending[i]
		if wait {
			if err := s.Wait(pf.ev); err != nil {
				return 0, errors.Wrapf(err, "%s: inserting the dependency on the free", what())
			}
		}
		p.pending = slices.Delete(p.pending, i, i+1)
		p.idle = append(p.idle, pf.ev)
		return p.handOutLocked(pf.addr, size, pf.cap, s), nil
	}
	addr, err := p.al.Alloc(size, 0)
	if errors.Is(err, driver.ErrOutOfMemory) && p.opportunistic && p.releaseCompletedLocked() {
		addr, err = p.al.Alloc(size, 0)
	}
	if err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	p.noteReservedLocked()
	return p.handOutLocked(addr, size, size, s), nil
}

// reusableLocked picks the pending block to reuse for size bytes on s: the
// smallest that fits (and is not more than twice the request plus a
// chunk, so a small request does not pin a large block) among those the
// policies allow; wait is true when the pool must insert a dependency.
func (p *Pool) reusableLocked(size uint64, s *stream.Stream) (int, bool) {
	limit := 2*size + p.al.Arena().ChunkSize()
	best, bestWait := -1, false
	better := func(i int) bool { return best < 0 || p.pending[i].cap < p.pending[best].cap }
	for i, pf := range p.pending {
		if pf.cap < size || pf.cap > limit {
			continue
		}
		if best >= 0 && !bestWait && !better(i) {
			continue // cannot beat a block already usable without a wait: skip the checks
		}
		ok := pf.st == s || (p.follow && s.OrderedAfter(pf.st, pf.pos))
		if !ok && p.opportunistic {
			done, err := pf.ev.Query()
			ok = err == nil && done
		}
		if ok && (bestWait || better(i)) {
			best, bestWait = i, false
		} else if !ok && p.internal && (best < 0 || bestWait && better(i)) {
			best, bestWait = i, true
		}
	}
	return best, bestWait
}

func (p *Pool) handOutLocked(addr driver.Addr, size, capacity uint64, s *stream.Stream) driver.Addr {
	p.live[addr] = poolBlock{size: size, cap: capacity, st: s}
	p.usedCur += size
	p.usedHigh = max(p.usedHigh, p.usedCur)
	return addr
}

func (p *Pool) noteReservedLocked() {
	p.reservedHigh = max(p.reservedHigh, p.al.Stats().Committed)
}

// FreeAsync gives ptr back at the current point of s's order: work
// enqueued on s before it may still use the memory, work after may not.
func (p *Pool) FreeAsync(ptr driver.Addr, s *stream.Stream) error {
	what := func() string { return fmt.Sprintf("arena: free async %s on %s", ptr, s) }
	if s.Driver() != p.d {
		return errors.Wrapf(driver.ErrInvalid, "%s: the stream is of another driver", what())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("free async")
	}
	b, ok := p.live[ptr]
	if n := p.imports[ptr]; ok && n > 0 {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: %d other process(es) imported it and have not released it", what(), n),
			"importers free first (seed 002): wait for their release (ipc.Conn.RecvRelease)")
	}
	if !ok {
		for _, pf := range p.pending {
			if pf.addr == ptr {
				return errors.Wrapf(driver.ErrNotAllocated, "%s: freed already (freed twice?)", what())
			}
		}
		return errors.Wrapf(driver.ErrNotAllocated, "%s: not the start of a live allocation of this pool", what())
	}
	if p.poisonOn {
		if err := s.Memset(ptr, PoisonByte, b.cap); err != nil {
			return errors.Wrapf(err, "%s: poisoning", what())
		}
	}
	ev, err := p.eventLocked()
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	pos := s.Position()
	if err := s.Record(ev); err != nil {
		p.idle = append(p.idle, ev)
		return errors.Wrapf(err, "%s", what())
	}
	delete(p.live, ptr)
	p.usedCur -= b.size
	p.pending = append(p.pending, &pendingFree{addr: ptr, cap: b.cap, st: s, pos: pos, ev: ev})
	return nil
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
	kept := p.pending[:0]
	for _, pf := range p.pending {
		if done, err := pf.ev.Query(); err == nil && done && p.al.Free(pf.addr) == nil {
			p.idle = append(p.idle, pf.ev)
			gave = true
			continue
		}
		kept = append(kept, pf)
	}
	clear(p.pending[len(kept):])
	p.pending = kept
	return gave
}

// onSynchronize runs after every synchronize on the pool's driver: memory
// the pool holds above its release threshold goes back to the device.
func (p *Pool) onSynchronize() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed || !p.opportunistic || p.al.Stats().Committed <= p.threshold {
		return
	}
	p.releaseCompletedLocked()
	_ = p.al.TrimTo(p.threshold)
}

// TrimTo releases memory back to the device until the pool holds
// minBytesToKeep, as far as its layout allows; it never releases memory
// behind outstanding allocations (live, or freed in stream order and not
// yet completed).
func (p *Pool) TrimTo(minBytesToKeep uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("trim")
	}
	p.releaseCompletedLocked()
	return errors.Wrap(p.al.TrimTo(minBytesToKeep), "arena: pool trim")
}

// SetAttribute sets a pool attribute (cudaMemPoolSetAttribute): the release
// threshold in bytes; the reuse policies 1 (on) or 0 (off); the
// high-water marks may only be reset, with 0, to the current value; the
// current values cannot be set.
func (p *Pool) SetAttribute(attr PoolAttr, value uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("set attribute")
	}
	flag := func(f *bool) error {
		if value > 1 {
			return errors.Wrapf(driver.ErrInvalid, "arena: pool attribute %s takes 0 or 1, not %d", attr, value)
		}
		*f = value == 1
		return nil
	}
	switch attr {
	case ReleaseThreshold:
		p.threshold = value
		return nil
	case ReuseFollowEventDependencies:
		return flag(&p.follow)
	case ReuseAllowOpportunistic:
		return flag(&p.opportunistic)
	case ReuseAllowInternalDependencies:
		return flag(&p.internal)
	case ReservedMemHigh, UsedMemHigh:
		if value != 0 {
			return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "arena: pool attribute %s can only be reset (set to 0), not set to %d", attr, value),
				"a high-water mark is measured, not chosen")
		}
		if attr == UsedMemHigh {
			p.usedHigh = p.usedCur
		} else {
			p.reservedHigh = p.al.Stats().Committed
		}
		return nil
	case ReservedMemCurrent, UsedMemCurrent:
		return errors.Wrapf(driver.ErrInvalid, "arena: pool attribute %s is read-only", attr)
	}
	return errors.Wrapf(driver.ErrInvalid, "arena: unknown pool attribute %d", int(attr))
}

// Attribute reads a pool attribute (cudaMemPoolGetAttribute); flags read
// as 1 or 0.
func (p *Pool) Attribute(attr PoolAttr) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := func(f bool) uint64 {
		if f {
			return 1
		}
		return 0
	}
	switch attr {
	case ReleaseThreshold:
		return p.threshold, nil
	case ReuseFollowEventDependencies:
		return b(p.follow), nil
	case ReuseAllowOpportunistic:
		return b(p.opportunistic), nil
	case ReuseAllowInternalDependencies:
		return b(p.internal), nil
	case ReservedMemCurrent:
		return p.al.Stats().Committed, nil
	case ReservedMemHigh:
		return max(p.reservedHigh, p.al.Stats().Committed), nil
	case UsedMemCurrent:
		return p.usedCur, nil
	case UsedMemHigh:
		return p.usedHigh, nil
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "arena: unknown pool attribute %d", int(attr))
}

// SetAccess sets what dev may do with the pool's memory, now and for
// memory the pool reserves later (cudaMemPoolSetAccess). Another device
// needs peer access to the pool's device.
func (p *Pool) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	if dev != p.props.Device {
		st, ok := p.d.(driver.Streams)
		if !ok {
			return errors.Wrapf(driver.ErrUnsupported, "arena: pool set access: the %s driver has no peer access", p.d.Name())
		}
		can, err := st.CanAccessPeer(dev, p.props.Device)
		if err != nil {
			return errors.Wrap(err, "arena: pool set access")
		}
		if !can && acc != driver.AccessNone {
			return errors.Wrapf(driver.ErrUnsupported, "arena: pool set access: device %d cannot access device %d", dev, p.props.Device)
		}
	}
	return errors.Wrap(p.al.SetAccess(dev, acc), "arena: pool set access")
}

// Access reports what dev may do with the pool's memory.
func (p *Pool) Access(dev driver.DeviceID) driver.Access { return p.al.Arena().Access(dev) }

// Offset is where the live allocation ptr starts in the pool's arena, and
// its size, for exporting it.
func (p *Pool) Offset(ptr driver.Addr) (off, size uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.live[ptr]
	if !ok {
		return 0, 0, errors.Wrapf(driver.ErrNotAllocated, "arena: offset of %s: not a live allocation of this pool", ptr)
	}
	return uint64(ptr - p.al.Arena().Base()), b.size, nil
}

// MarkImported records that another process imported the live allocation
// ptr: FreeAsync refuses it until each import is released (ReleaseImport),
// as seed 002 requires importers to free first.
func (p *Pool) MarkImported(ptr driver.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.live[ptr]; !ok {
		return errors.Wrapf(driver.ErrNotAllocated, "arena: export %s: not a live allocation of this pool", ptr)
	}
	if p.imports == nil {
		p.imports = map[driver.Addr]int{}
	}
	p.imports[ptr]++
	return nil
}

// ReleaseImport records that one importer of ptr released it.
func (p *Pool) ReleaseImport(ptr driver.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.imports[ptr] == 0 {
		return errors.Wrapf(driver.ErrNotAllocated, "arena: release of an import of %s: no process imported it", ptr)
	}
	if p.imports[ptr]--; p.imports[ptr] == 0 {
		delete(p.imports, ptr)
	}
	return nil
}

// Owns reports whether ptr is a live allocation of the pool.
func (p *Pool) Owns(ptr driver.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.live[ptr]
	return ok
}

// Destroy waits for the frees still in flight, returns every byte to the
// device and frees the pool's address space. It refuses while allocations
// are live (ErrBusy) and for a device's default pool (ErrInvalid).
func (p *Pool) Destroy() error {
	if p.isDflt {
		return errors.Wrap(driver.ErrInvalid, "arena: destroy of a device's default pool: it lives as long as the driver")
	}
	return p.destroy()
}

func (p *Pool) destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("destroy")
	}
	if len(p.live) > 0 {
		return errors.Wrapf(driver.ErrBusy, "arena: destroy of a pool with %d live allocation(s), %s in use", len(p.live), units.Bytes(p.usedCur))
	}
	var errs error
	for _, pf := range p.pending {
		errs = errors.CombineErrors(errs, pf.ev.WaitDone()) // not Synchronize: its hooks would take p.mu
		errs = errors.CombineErrors(errs, p.al.Free(pf.addr))
		p.idle = append(p.idle, pf.ev)
	}
	p.pending = nil
	for _, ev := range p.idle {
		errs = errors.CombineErrors(errs, ev.Destroy())
	}
	p.idle = nil
	errs = errors.CombineErrors(errs, p.al.Close())
	if errs != nil {
		return errors.Wrap(errs, "arena: destroy pool")
	}
	p.destroyed = true
	p.unhook()
	unregisterPool(p)
	return nil
}

// Check verifies the pool's invariants and its allocator's.
func (p *Pool) Check() error {
	p.mu.Lock()
	defer p.mu.Unlock()
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
		if n, err := p.al.Size(a); err != nil || n < b.size {
			fail("arena: pool block at %s is not a live allocation of %d bytes or more (%v)", a, b.size, err)
		}
	}
	for _, pf := range p.pending {
		if _, isLive := p.live[pf.addr]; isLive {
			fail("arena: pool block at %s is both live and pending", pf.addr)
		}
		if _, err := p.al.Size(pf.addr); err != nil {
			fail("arena: pending block at %s is not held by the allocator: %v", pf.addr, err)
		}
	}
	if used != p.usedCur {
		fail("arena: pool live blocks hold %d bytes, UsedMemCurrent says %d", used, p.usedCur)
	}
	if p.usedHigh < p.usedCur {
		fail("arena: UsedMemHigh %d below current %d", p.usedHigh, p.usedCur)
	}
	return errors.CombineErrors(errs, p.al.Check())
}

// Default pools and the pools' registry.

var pools struct {
	mu       sync.Mutex
	all      map[*Pool]struct{}
	defaults map[driver.Driver]map[driver.DeviceID]*Pool
}

func registerPool(p *Pool) {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	if pools.all == nil {
		pools.all = map[*Pool]struct{}{}
	}
	pools.all[p] = struct{}{}
}

func unregisterPool(p *Pool) {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	delete(pools.all, p)
	for dev, dp := range pools.defaults[p.d] {
		if dp == p {
			delete(pools.defaults[p.d], dev)
		}
	}
}

// DefaultPool returns dev's default pool on d, creating it on first use
// with its own address space and physical memory accounting. It cannot be
// destroyed; CloseDefaultPools ends it with the driver.
func DefaultPool(d driver.Driver, dev driver.DeviceID) (*Pool, error) {
	// One creation at a time, so two first uses cannot make two pools.
	defaultMu.Lock()
	defer defaultMu.Unlock()
	pools.mu.Lock()
	p := pools.defaults[d][dev]
	pools.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := NewPool(vaspace.New(d), physical.New(d), PoolProps{Device: dev})
	if err != nil {
		return nil, err
	}
	p.isDflt = true
	pools.mu.Lock()
	defer pools.mu.Unlock()
	if pools.defaults == nil {
		pools.defaults = map[driver.Driver]map[driver.DeviceID]*Pool{}
	}
	if pools.defaults[d] == nil {
		pools.defaults[d] = map[driver.DeviceID]*Pool{}
	}
	pools.defaults[d][dev] = p
	return p, nil
}

var defaultMu sync.Mutex

// CloseDefaultPools destroys d's default pools (before closing d); it
// refuses while any has live allocations.
func CloseDefaultPools(d driver.Driver) error {
	pools.mu.Lock()
	var ps []*Pool
	for _, p := range pools.defaults[d] {
		ps = append(ps, p)
	}
	pools.mu.Unlock()
	var errs error
	for _, p := range ps {
		errs = errors.CombineErrors(errs, p.destroy())
	}
	return errs
}

// MallocAsync allocates from the default pool of s's device
// (cudaMallocAsync).
func MallocAsync(size uint64, s *stream.Stream) (driver.Addr, error) {
	p, err := DefaultPool(s.Driver(), s.Device())
	if err != nil {
		return 0, err
	}
	return p.MallocAsync(size, s)
}

// MallocFromPoolAsync allocates from p (cudaMallocFromPoolAsync).
func MallocFromPoolAsync(p *Pool, size uint64, s *stream.Stream) (driver.Addr, error) {
	return p.MallocAsync(size, s)
}

// FreeAsync frees ptr, from whichever pool of s's driver holds it
// (cudaFreeAsync).
func FreeAsync(ptr driver.Addr, s *stream.Stream) error {
	pools.mu.Lock()
	var owner *Pool
	for p := range pools.all {
		if p.d == s.Driver() && p.Owns(ptr) {
			owner = p
			break
		}
	}
	pools.mu.Unlock()
	if owner == nil {
		return errors.Wrapf(driver.ErrNotAllocated, "arena: free async %s: no pool of this driver has a live allocation there", ptr)
	}
	return owner.FreeAsync(ptr, s)
}
