package arena

import (
	"fmt"
	"math"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// An Allocator carves Sparse ranges of its own into many allocations:
// Alloc and Free with coalescing. It commits memory where blocks are handed
// out and gives back wholly free chunks from anywhere in its ranges, as
// PyTorch's expandable segments do — never only from a tail.
//
// It keeps two heaps (heap.go): small requests, of at most half a chunk,
// and the rest, each in a range of its own, so small allocations share
// chunks among themselves rather than pinning chunks between large ones.
// (A shareable allocator keeps one, so another process can mirror it with
// one reservation at the same offsets.)
// Each range is much larger than the memory the allocator may commit
// (AddressSpace, default four times Max): address space is cheap, and room to
// place a block where memory is already committed matters more as
// allocations come and go.
//
// Free space is kept in TLSF lists (tlsf.go): O(1) alloc and free whatever
// the number of live allocations, with fragmentation close to best fit.
// Block records live in process memory, never in the memory they describe
// — device memory is not the allocator's to write, and the sim driver has
// none — and off the garbage collector's pointer graph: a slab of blocks
// that name each other by slot, and a flat index from offset to used block
// (heap.go, offindex.go). Requests of the default policy of at most 4 KiB
// are served from bins (bins.go): 64 KiB blocks of the small heap cut into
// slots of one size class, whose alloc and free touch the bin's one-line
// record and a byte, not the block records. An Alloc that a free block or
// a bin's free slot serves, and a Free, make no Go allocation.
//
// When no free block fits, the allocator commits the chunks of a hole next
// to the free bytes that waste least, keeping committed memory within a
// budget of the live set (grow.go). Whole free chunks elsewhere move into
// the hole first (relocate.go: an unmap and a map, no create); what must
// be created is cut so that a large request's interior is one chunk of its
// own; free chunks beyond the budget go back. A request that a free block
// serves on part of a large free chunk strands that chunk, within the
// budget's slack, rather than give it back and create its own
// (strand.go). Only when no hole has room
// for the request does it stitch whole free chunks into a third range
// (stitch.go). When a commit fails for lack of memory it gives back every
// wholly free chunk and tries once more before it reports out of memory.
// Free never gives memory back; the budget, Trim and TrimTo do.
//
// The allocator owns its ranges exclusively: nothing it exposes lets a
// caller grow, shrink, decommit, close or place anything in them.
//
// Invariants (checked by Check): each heap's (heap.go); the stranded
// chunks' (strand.go); every lent block
// belongs to exactly one live stitch, which lends exactly its parts;
// Allocated is the sum of the live requests and held the bytes of used
// blocks and stitched allocations; no more than Max is committed.
type Allocator struct {
	// mu guards everything below; it is taken before the ranges' locks.
	mu        lockrank.Mutex[lockrank.ArenaAllocator]
	heaps     [2]*heap // small and large requests
	st        *Sparse  // the stitch range; nil when stitching is off
	stFree    *extent.Set
	policy    Policy
	q, cs     uint64
	max       uint64 // the most memory committed at once
	threshold uint64 // 0: automatic, held/slackDiv (see budget)
	slackDiv  uint64
	held      uint64 // bytes of used blocks and stitched allocations: the live set
	// high is the live set's high-water mark, decaying towards held by
	// 1/2^keepDecayShift of the distance each Alloc and Free: free chunks
	// are kept committed up to a share of high − held (keepBudget).
	high    uint64
	keepDiv uint64 // keepDivisor; 0 keeps no share (tests compare)
	// strands are the chunks over edgeChunk that live blocks cover in
	// part (strand.go): at most maxStrands, of at most the slack in all.
	strands  [maxStrands]stranded
	nstrands int
	stranded uint64               // their bytes
	stitches map[uint64]*stitched // by offset in the stitch range
	// owned are the live allocations a handle owns (AllocOwned), by
	// address: Free refuses them, only the handle's Release frees them.
	owned  map[driver.Addr]*Owned
	stats  AllocStats
	closed bool
}

// The heaps, by index.
const (
	small = 0
	large = 1
)

// AllocatorOptions configure an allocator.
type AllocatorOptions struct {
	// Device is the device whose memory backs the allocator.
	Device driver.DeviceID
	// Max is the most memory the allocator may hold committed at once
	// (default: the device's capacity).
	Max uint64
	// AddressSpace is the address space reserved for each of its two
	// heaps (default 4 × Max), rounded up to whole chunks. A request
	// goes where committing it needs the least new memory, and free
	// chunks move to it: over a long run of random lifetimes the live set
	// spreads over about three times its size of address space, and a
	// large request needs a hole of its own size.
	AddressSpace uint64
	// ChunkSize is the unit memory is committed and given back in (default:
	// the device's recommended granularity). Every chunk is its own driver
	// handle, so any free one can go back.
	ChunkSize uint64
	// Access lists the devices given read-write access to the allocator's
	// memory (default: Device alone).
	Access []driver.DeviceID
	// Shareable makes every chunk exportable to other processes; a
	// shareable allocator does not stitch, so an allocation is always one
	// stretch of its range's chunks.
	Shareable bool
	// Policy is the size and alignment rule.
	Policy Policy
	// NoStitch turns stitching off.
	NoStitch bool
	// ReleaseThreshold is how many bytes the allocator may keep committed
	// beyond the live set when it must commit more: before committing, it
	// gives back (or stitches) free chunks down to it. 0 means automatic:
	// 1/SlackDivisor of the live set, at least one chunk — the same bound
	// at every scale, so committed memory stays within that fraction of
	// what is live at any peak, plus what partly used chunks hold.
	// NoRelease never gives memory back on its own (only when out of
	// memory, and on Trim).
	ReleaseThreshold uint64
	// SlackDivisor sets the automatic release threshold, live/SlackDivisor
	// (default 256: 0.4%, which leaves most of a 1% overhead to the free
	// bytes of partly used chunks). Smaller divisors commit and give back
	// less often and hold more at the peak (grow.go says more).
	SlackDivisor uint64
}

// NoRelease is a ReleaseThreshold that keeps every free chunk committed
// until the device runs out or Trim is called (PyTorch's default).
const NoRelease = math.MaxUint64

// AllocStats are an allocator's figures.
type AllocStats struct {
	// Allocated is the sum of the sizes asked for by live allocations.
	Allocated, PeakAllocated uint64
	// Committed is the memory behind the allocator (a stitched chunk is
	// mapped twice but counted once); PeakCommitted the most it has been.
	Committed, PeakCommitted uint64
	// LargestFree is the largest free committed block.
	LargestFree uint64
	// MapEvents and UnmapEvents count contiguous ranges mapped or unmapped
	// at once (a commit of several chunks, a stitch), as PyTorch counts
	// segment_map and segment_unmap; ChunkMaps and ChunkUnmaps count the
	// driver calls behind them, one per chunk.
	MapEvents, UnmapEvents, ChunkMaps, ChunkUnmaps int
	// Decommits counts the times free memory was given back and
	// DecommittedBytes how much.
	Decommits        int
	DecommittedBytes uint64
	// Grows counts commits of new memory, Stitches requests served by
	// stitching, OOMRetries allocations retried after giving memory back
	// because the device (or Max) was full.
	Grows, Stitches, OOMRetries int
	// Relocations counts the times whole free chunks were moved to where a
	// request went instead of creating memory there (one map event each),
	// and RelocatedBytes their memory.
	Relocations    int
	RelocatedBytes uint64
	// Splits counts requests that would have pinned a whole free chunk
	// much larger than themselves, which was given back and the request's
	// own chunks committed instead.
	Splits int
	// Strands counts requests that covered such a chunk in part and
	// stranded it instead (strand.go: no driver call, the chunk's free
	// rest stays committed and served until it is wholly free again), and
	// Stranded is the bytes of the chunks stranded now, at most the
	// slack beyond the live set.
	Strands  int
	Stranded uint64
	// Creates and Releases count the chunks created and released, and
	// Grants the access grants of new mappings (one a device and map
	// event): with ChunkMaps and ChunkUnmaps, the driver calls behind the
	// allocator's memory.
	Creates, Releases, Grants int
	// Live is the number of live allocations.
	Live int
}

// NewAllocator reserves the allocator's two ranges (and, unless NoStitch
// or Shareable, a stitch range of Max bytes). No memory is committed until
// it allocates.
func NewAllocator(space *vaspace.Space, mem *physical.Memory, opts AllocatorOptions) (*Allocator, error) {
	if opts.Policy > PolicyAscendMedia {
		return nil, errors.Wrapf(driver.ErrInvalid, "arena: unknown allocator policy %d", opts.Policy)
	}
	if space == nil || mem == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new allocator: the address space or the physical memory is nil")
	}
	if space.Driver() == nil || mem.Driver() == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new allocator: the address space or the physical memory has no driver (made with vaspace.New and physical.New of an open driver?)")
	}
	devs := space.Driver().Devices()
	what := func() string {
		return fmt.Sprintf("arena: new allocator of %s on device %d", units.Bytes(opts.Max), opts.Device)
	}
	if err := driver.CheckDevice(what, opts.Device, len(devs)); err != nil {
		return nil, err
	}
	if opts.Max == 0 {
		opts.Max = devs[opts.Device].Capacity
	}
	cs := opts.ChunkSize
	if cs == 0 {
		cs = devs[opts.Device].RecommendedGranularity
	}
	if opts.Max < cs {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: Max is below the chunk size %s: nothing could ever be committed", what(), units.Bytes(cs)),
			"give a Max of at least one chunk")
	}
	if opts.AddressSpace == 0 {
		opts.AddressSpace = satMul(opts.Max, 4)
	}
	if opts.AddressSpace < opts.Max {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the address space %s is smaller than Max", what(), units.Bytes(opts.AddressSpace))
	}
	if opts.SlackDivisor == 0 {
		opts.SlackDivisor = 256
	}
	al := &Allocator{policy: opts.Policy, q: opts.Policy.Quantum(), threshold: opts.ReleaseThreshold, slackDiv: opts.SlackDivisor,
		keepDiv: keepDivisor, stitches: map[uint64]*stitched{}}
	var err error
	fail := func(err error) (*Allocator, error) {
		for _, h := range al.distinct() {
			err = errors.CombineErrors(err, h.s.Close())
		}
		return nil, errors.Wrap(err, "arena: new allocator")
	}
	for i := range al.heaps {
		if opts.Shareable && i > 0 {
			// One range only, so that another process can mirror it at
			// the same offsets with one reservation.
			al.heaps[i] = al.heaps[0]
			break
		}
		s, err := NewSparse(space, mem, SparseOptions{Max: opts.AddressSpace, ChunkSize: opts.ChunkSize, Device: opts.Device,
			Access: opts.Access, Shareable: opts.Shareable})
		if err != nil {
			return fail(err)
		}
		al.heaps[i] = newHeap(s, al.q)
		al.heaps[i].bins.on = i == small && binsFor(al.q, s.ChunkSize(), opts.Shareable)
	}
	al.cs = al.heaps[0].cs
	al.max = alignDown(opts.Max, al.cs)
	for _, h := range al.distinct() {
		h.held, h.max = &al.held, al.max
		h.strandRoom = al.strandRoom
	}
	if !opts.NoStitch && !opts.Shareable {
		if al.st, err = NewSparse(space, mem, SparseOptions{Max: al.max, ChunkSize: al.cs, Device: opts.Device, Access: opts.Access}); err != nil {
			return fail(errors.Wrap(err, "the stitch range"))
		}
		al.stFree = extent.New(0, al.max)
	}
	return al, nil
}

// Max is the most memory the allocator may hold committed at once.
func (al *Allocator) Max() uint64 {
	if al.unmade() {
		return 0
	}
	return al.max
}

// ChunkSize is the unit the allocator commits and gives back memory in.
func (al *Allocator) ChunkSize() uint64 {
	if al.unmade() {
		return 0
	}
	return al.cs
}

// Closed reports whether the allocator is closed. A zero Allocator, not
// made by NewAllocator, reports itself closed.
func (al *Allocator) Closed() bool {
	if al == nil || al.heaps[small] == nil {
		return true
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.closed
}

// Policy is the allocator's size and alignment rule.
func (al *Allocator) Policy() Policy {
	if al.unmade() {
		return 0
	}
	return al.policy
}

// distinct lists the allocator's heaps, each once (a shareable allocator
// keeps one heap for both kinds of request), none nil.
func (al *Allocator) distinct() []*heap {
	hs := make([]*heap, 0, 2)
	for i, h := range al.heaps {
		if h != nil && (i == 0 || h != al.heaps[0]) {
			hs = append(hs, h)
		}
	}
	return hs
}

// ranges lists the allocator's Sparse ranges: its heaps', then the stitch
// range's.
func (al *Allocator) ranges() []*Sparse {
	var rs []*Sparse
	for _, h := range al.distinct() {
		rs = append(rs, h.s)
	}
	if al.st != nil {
		rs = append(rs, al.st)
	}
	return rs
}

// Ranges lists the address ranges the allocator's allocations lie in: its
// heaps' (one, for a shareable allocator) and, when stitching is on, the
// stitch range. They never move.
func (al *Allocator) Ranges() []vaspace.Range {
	if al.unmade() {
		return nil
	}
	var rs []vaspace.Range
	for _, s := range al.ranges() {
		rs = append(rs, s.Range())
	}
	return rs
}

// Owns reports whether p lies in one of the allocator's ranges (not
// whether it is a live allocation: see Size).
func (al *Allocator) Owns(p driver.Addr) bool {
	if al.unmade() {
		return false
	}
	for _, r := range al.Ranges() {
		if r.Contains(p) {
			return true
		}
	}
	return false
}

// HostAddressable reports whether the allocator's memory is addressable
// from this process (Bytes works).
func (al *Allocator) HostAddressable() bool {
	if al.unmade() {
		return false
	}
	return al.heaps[0].s.HostAddressable()
}

// SetReleaseThreshold changes the release threshold (see
// AllocatorOptions.ReleaseThreshold).
func (al *Allocator) SetReleaseThreshold(n uint64) {
	if al.unmade() {
		return
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	al.threshold = n
}

func (al *Allocator) errClosed(op string) error {
	return driver.Closed("arena: " + op + " on a closed allocator")
}

// heapFor is the heap a request of fp bytes goes to.
func (al *Allocator) heapFor(fp uint64) *heap {
	if fp <= al.cs/2 {
		return al.heaps[small]
	}
	return al.heaps[large]
}

// heapOf is the heap whose range holds p, or nil. (It is on the path of
// every Free: no allocation, no lock.)
func (al *Allocator) heapOf(p driver.Addr) *heap {
	for _, h := range al.heaps {
		if h.s.Range().Contains(p) {
			return h
		}
	}
	return nil
}

// committed is the memory the heaps hold.
func (al *Allocator) committed() uint64 {
	var c uint64
	for _, h := range al.distinct() {
		c += h.s.Committed()
	}
	return c
}

// Alloc returns the address of size fresh bytes aligned to align (0 means
// the policy's quantum; otherwise a power of two). When no free block
// fits it commits memory, stitches or gives memory back as the type's doc
// says; if it still cannot serve the request the error says why, and no
// allocation changes.
func (al *Allocator) Alloc(size, align uint64) (driver.Addr, error) {
	if al.unmade() {
		return 0, unmade("Allocator.Alloc", "NewAllocator")
	}
	what := func() string { return fmt.Sprintf("arena: alloc %s aligned to %d", units.Bytes(size), align) }
	align, fp, err := al.checkRequest(what, size, align)
	if err != nil {
		return 0, err
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return 0, al.errClosed("alloc")
	}
	return al.allocLocked(what, size, align, fp)
}

// checkRequest checks a request of size bytes aligned to align and returns
// the alignment and the footprint it is served with.
func (al *Allocator) checkRequest(what func() string, size, align uint64) (uint64, uint64, error) {
	if size == 0 {
		return 0, 0, errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return 0, 0, err
	}
	align = max(align, al.q)
	fp := alignUp(al.policy.Footprint(size), al.q)
	if fp < size || fp > al.max || align > al.max {
		return 0, 0, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: larger than the allocator's maximum %s", what(), units.Bytes(al.max)),
			"create the allocator with a larger Max")
	}
	return align, fp, nil
}

// allocLocked serves a request of size bytes (footprint fp, aligned to
// align), checked by the caller, which holds mu.
func (al *Allocator) allocLocked(what func() string, size, align, fp uint64) (driver.Addr, error) {
	h := al.heapFor(fp)
	var p driver.Addr
	var err error
	if c := h.bins.class(fp, align); c != 0 {
		p, err = al.binAllocLocked(h, c, size)
	} else {
		p, err = al.placeLocked(h, fp, align, size)
	}
	if err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	al.stats.Allocated += size
	al.stats.PeakAllocated = max(al.stats.PeakAllocated, al.stats.Allocated)
	al.noteHeld()
	al.checkAfter("alloc")
	return p, nil
}

// placeLocked places a block of fp bytes aligned to align for a request
// of req bytes in the heap h: in a free block that fits, else where
// committing it costs least (growLocked).
func (al *Allocator) placeLocked(h *heap, fp, align, req uint64) (driver.Addr, error) {
	if r := h.free.find(&h.slab, (fp+align-al.q)/al.q, al.q); r != 0 {
		return al.serveLocked(h, r, h.startIn(h.at(r), fp, align), fp, align, req)
	}
	return al.growLocked(h, fp, align, req)
}

// Free ends the allocation at p. A pointer that is not the start of a live
// allocation — freed already, never allocated here, or inside one — is
// ErrNotAllocated, and one that a handle owns (AllocOwned: a tensor's) is
// ErrBusy; nothing changes then. Free keeps the memory committed for later
// allocations.
func (al *Allocator) Free(p driver.Addr) error {
	if al.unmade() {
		return unmade("Allocator.Free", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("free")
	}
	if al.owned[p] != nil {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "arena: free %s: the allocation is owned by its holder (a tensor?), whose Release frees it", p),
			"release the tensor (or the Owned handle) instead")
	}
	return al.freeLocked(p)
}

// freeLocked ends the allocation at p; the caller holds mu.
func (al *Allocator) freeLocked(p driver.Addr) error {
	if h := al.heapOf(p); h != nil {
		if id := h.bins.find(uint64(p) - h.base); id != 0 {
			if !al.binFreeLocked(h, id, uint64(p)-h.base) {
				return al.notAllocated("free", p)
			}
			al.checkAfter("free")
			return nil
		}
		if r := h.usedAt(p); r != 0 {
			b := h.at(r)
			al.stats.Allocated -= b.req
			al.held -= b.size
			al.unstrand(h, h.release(r))
			al.noteHeld()
			al.checkAfter("free")
			return nil
		}
	}
	if st := al.stitchAt(p); st != nil {
		if err := al.unstitchLocked(st); err != nil {
			return err
		}
		al.noteHeld()
		al.checkAfter("free")
		return nil
	}
	return al.notAllocated("free", p)
}

// notAllocated explains why p, given to the call op ("free", "size",
// "bytes", "export"), is not a live allocation's start.
func (al *Allocator) notAllocated(op string, p driver.Addr) error {
	what := fmt.Sprintf("arena: %s %s", op, p)
	if h := al.heapOf(p); h != nil {
		if id := h.bins.find(uint64(p) - h.base); id != 0 {
			return h.bins.notAllocated(h.base, op, what, id, uint64(p)-h.base)
		}
		return h.notAllocated(op, what, uint64(p-h.s.Base()))
	}
	if al.st != nil && al.st.Range().Contains(p) {
		off := uint64(p - al.st.Base())
		for _, st := range al.stitches {
			if off > st.off && off < st.off+st.size {
				return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the stitched allocation at %s; %s takes its start",
					what, al.st.Base()+driver.Addr(st.off), op)
			}
		}
		return freedError(op, fmt.Sprintf("%s: no live stitched allocation starts there", what))
	}
	return errors.WithHint(errors.Wrapf(driver.ErrNotAllocated, "%s: the address is not in this allocator's memory", what),
		"pass the start of a live allocation, with the allocator whose Alloc returned it")
}

// freedError is ErrNotAllocated for memory of the allocator's that no
// live allocation holds, msg saying what was asked, with the likely
// cause for op.
func freedError(op, msg string) error {
	if op == "free" {
		return errors.WithHint(errors.Wrapf(driver.ErrNotAllocated, "%s (freed twice?)", msg), "free each allocation once")
	}
	return errors.WithHint(errors.Wrapf(driver.ErrNotAllocated, "%s (freed already?)", msg),
		"use an allocation only until it is freed")
}

// Size reports the size asked for by the live allocation at p.
func (al *Allocator) Size(p driver.Addr) (uint64, error) {
	if al.unmade() {
		return 0, unmade("Allocator.Size", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return 0, al.errClosed("size")
	}
	if h := al.heapOf(p); h != nil {
		if _, req, ok := h.liveAt(p); ok {
			return req, nil
		}
	}
	if st := al.stitchAt(p); st != nil {
		return st.req, nil
	}
	return 0, al.notAllocated("size", p)
}

// Bytes returns the live allocation at p as a slice of the size asked for,
// on drivers whose memory the process addresses (driver.HostMapper). The
// memory must be writable by some device (ErrAccessDenied otherwise): the
// slice is for reading and writing, and while the allocation lives
// SetAccess cannot take write access away. It is valid until the
// allocation is freed.
func (al *Allocator) Bytes(p driver.Addr) ([]byte, error) {
	if al.unmade() {
		return nil, unmade("Allocator.Bytes", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return nil, al.errClosed("bytes")
	}
	return al.bytesLocked(p)
}

// bytesLocked is Bytes with mu held, so that no SetAccess or Free comes
// between the checks and the slice.
func (al *Allocator) bytesLocked(p driver.Addr) ([]byte, error) {
	var s *Sparse
	var off, n uint64
	if h := al.heapOf(p); h != nil {
		if o, req, ok := h.liveAt(p); ok {
			s, off, n = h.s, o, req
		}
	}
	if st := al.stitchAt(p); st != nil {
		s, off, n = al.st, st.off, st.req
	}
	if s == nil {
		return nil, al.notAllocated("bytes", p)
	}
	d := s.Driver()
	hm, ok := d.(driver.HostMapper)
	if !ok {
		return nil, errors.Wrapf(driver.ErrUnsupported, "arena: bytes of an allocation: the %s driver's memory is not addressable from the host", d.Name())
	}
	s.mu.Lock()
	err := s.writableLocked(func() string { return fmt.Sprintf("arena: bytes of the allocation at %s", p) }, off, off+n)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return hm.HostBytes(p, n)
}

// SharedChunk is one chunk under a live allocation of a shareable
// allocator, as another process needs it: where it lies (Offset from the
// Base of the range holding the allocation), its size, the driver handle
// that identifies it (a new chunk at the same offset has another), and
// its shareable handle.
type SharedChunk struct {
	Offset, Size uint64
	Handle       driver.Handle
	Shareable    driver.Shareable
}

// Exported is a live allocation of a shareable allocator as another
// process needs it: the range it lies in (Base and Size of that range),
// its offset and size there, and the chunks under it.
type Exported struct {
	RangeBase    driver.Addr
	RangeSize    uint64
	Offset, Size uint64
	Chunks       []SharedChunk
}

// Export exports (once per chunk) and lists the chunks under the live
// allocation at p, which must be of a shareable allocator.
func (al *Allocator) Export(p driver.Addr) (Exported, error) {
	if al.unmade() {
		return Exported{}, unmade("Allocator.Export", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return Exported{}, al.errClosed("export")
	}
	h := al.heapOf(p)
	var b *block
	if h != nil {
		if r := h.usedAt(p); r != 0 {
			b = h.at(r)
		}
	}
	if b == nil {
		if al.stitchAt(p) != nil {
			return Exported{}, errors.Wrapf(driver.ErrUnsupported, "arena: export %s: a stitched allocation cannot be exported", p)
		}
		return Exported{}, al.notAllocated("export", p)
	}
	if !h.s.opts.Shareable {
		return Exported{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "arena: export %s: the allocator's chunks are not shareable", p),
			"create the allocator with Shareable")
	}
	cs, err := h.s.export(b.off, b.size)
	if err != nil {
		return Exported{}, err
	}
	return Exported{RangeBase: h.s.Base(), RangeSize: h.s.Max(), Offset: b.off, Size: b.req, Chunks: cs}, nil
}

// export exports and lists the chunks overlapping [off, off+n).
func (s *Sparse) export(off, n uint64) ([]SharedChunk, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lo, hi := s.slots.Overlapping(off, off+n)
	out := make([]SharedChunk, 0, hi-lo)
	for i := lo; i < hi; i++ {
		it := s.slots.At(i)
		sh, ok := it.Val.c.Exported()
		if !ok {
			var err error
			if sh, err = it.Val.c.Export(); err != nil {
				return nil, errors.Wrapf(err, "arena: export the chunk at %#x", it.Start)
			}
		}
		out = append(out, SharedChunk{Offset: it.Start, Size: it.Size(), Handle: it.Val.c.Handle(), Shareable: sh})
	}
	return out, nil
}

// SetAccess sets what dev may do with all the allocator's memory, now and
// later: its heaps and its stitch range. It refuses a value that is no
// driver.Access (ErrInvalid), and (ErrBusy) to leave the memory writable
// by no device while allocations are live: their bytes (Bytes, a
// tensor's) would fault. On failure nothing changes.
func (al *Allocator) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	if al.unmade() {
		return unmade("Allocator.SetAccess", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("set access")
	}
	if err := driver.CheckAccess(func() string { return fmt.Sprintf("arena: allocator set access of device %d", dev) }, acc); err != nil {
		return err
	}
	if n := al.live(); n > 0 && al.heaps[0].s.losesWrite(dev, acc) {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "arena: allocator set access of device %d to %s: %d live allocation(s) would be writable by no device",
				dev, acc, n),
			"free the allocations (release their tensors) first, or give another device write access first")
	}
	ranges := al.ranges()
	old := al.heaps[0].s.Access(dev)
	for i, s := range ranges {
		if err := s.SetAccess(dev, acc); err != nil {
			for _, done := range ranges[:i] {
				err = errors.CombineErrors(err, done.SetAccess(dev, old))
			}
			return errors.Wrap(err, "arena: allocator set access")
		}
	}
	return nil
}

// Access reports what dev may do with the allocator's memory.
func (al *Allocator) Access(dev driver.DeviceID) driver.Access {
	if al.unmade() {
		return 0
	}
	return al.heaps[0].s.Access(dev)
}

// Stats returns the allocator's figures.
func (al *Allocator) Stats() AllocStats {
	if al.unmade() {
		return AllocStats{}
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	st := al.stats
	st.Committed = al.committed()
	for _, s := range al.ranges() {
		ss := s.Stats()
		st.MapEvents += ss.MapEvents
		st.UnmapEvents += ss.UnmapEvents
		st.ChunkMaps += ss.ChunkMaps
		st.ChunkUnmaps += ss.ChunkUnmaps
		st.Decommits += ss.Decommits
		st.DecommittedBytes += ss.DecommittedBytes
		st.Creates += ss.Creates
		st.Releases += ss.Releases
		st.Grants += ss.Grants
	}
	st.Live = al.live()
	st.Stranded = al.stranded
	for _, h := range al.distinct() {
		st.LargestFree = max(st.LargestFree, h.free.largest(&h.slab))
	}
	return st
}

// Close gives back all memory and frees the ranges. It refuses (ErrBusy)
// while allocations are live: their memory may still be in use through
// slices and tensors, and unmapping it would turn a later touch into a
// fault. Free them first.
func (al *Allocator) Close() error {
	if al.unmade() {
		return unmade("Allocator.Close", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("close")
	}
	if n := al.live(); n > 0 {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "arena: close of an allocator: %d allocation(s) still live, %s in all",
				n, units.Bytes(al.stats.Allocated)),
			"free every allocation (release the tensors that hold theirs) before closing the allocator")
	}
	// The free memory goes back through the heaps first, so that their
	// books follow what the driver gives back even when it refuses
	// part-way; then the ranges are freed, those a Close that failed
	// later did not free yet. Close may be called again after a refusal.
	if _, err := al.releaseLocked(math.MaxUint64, nil, span{}); err != nil {
		al.checkAfter("close")
		return errors.Wrap(err, "arena: close of an allocator")
	}
	var errs error
	rs := al.ranges()
	for i := len(rs) - 1; i >= 0; i-- { // the stitch range first: it borrows from the heaps
		if !rs[i].Closed() {
			errs = errors.CombineErrors(errs, rs[i].Close())
		}
	}
	if errs != nil {
		return errs
	}
	al.closed = true
	return nil
}

// live is the number of live allocations.
func (al *Allocator) live() int {
	n := len(al.stitches)
	for _, h := range al.distinct() {
		n += h.used.len() - h.bins.n + h.bins.live
	}
	return n
}

// checkAfter runs the allocator's own checks after a change, in invariants
// builds.
func (al *Allocator) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("arena: allocator "+op, al.checkLocked(false))
	}
}

// Check verifies every invariant in the type's doc, the heaps' and the
// ranges' (with their page tables against the driver), and returns every
// violation.
func (al *Allocator) Check() error {
	if al.unmade() {
		return unmade("Allocator.Check", "NewAllocator")
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.checkLocked(true)
}

func (al *Allocator) checkLocked(deep bool) error {
	if al.closed {
		return nil
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var held, allocated uint64
	errs = errors.CombineErrors(errs, al.checkStrands())
	lent := map[uint64]int{} // blocks lent, by stitch offset
	for _, h := range al.distinct() {
		hh, ha, hl := h.check(fail)
		held += hh
		allocated += ha + h.bins.check(h, fail)
		for st, n := range hl {
			lent[st] += n
		}
	}
	for off, st := range al.stitches {
		allocated += st.req
		held += st.size
		if st.off != off || lent[off] != len(st.parts) {
			fail("arena: stitch at %#x lends %d blocks, %d are marked", off, len(st.parts), lent[off])
		}
		delete(lent, off)
	}
	if len(lent) > 0 {
		fail("arena: %d stitch(es) that are not live hold lent blocks", len(lent))
	}
	for p, o := range al.owned {
		live := al.stitchAt(p) != nil
		if h := al.heapOf(p); h != nil {
			if _, _, ok := h.liveAt(p); ok {
				live = true
			}
		}
		if o.p != p || o.al != al || !live {
			fail("arena: the owned allocation %s is recorded at %s, or is not live", o.p, p)
		}
	}
	if allocated != al.stats.Allocated || held != al.held {
		fail("arena: live allocations hold %d bytes in %d, the counts say %d and %d", allocated, held, al.stats.Allocated, al.held)
	}
	if c := al.committed(); c > al.max {
		fail("arena: %d bytes committed, above the allocator's maximum %d", c, al.max)
	}
	if al.high < al.held || al.high > al.max {
		fail("arena: the live set's high-water mark %d is below the live set %d or above the maximum %d", al.high, al.held, al.max)
	}
	if deep {
		for _, s := range al.ranges() {
			errs = errors.CombineErrors(errs, s.Check())
		}
		if al.stFree != nil {
			errs = errors.CombineErrors(errs, al.stFree.Check())
		}
	}
	return errs
}
