package arena

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// An Allocator carves one arena into many allocations: Alloc and Free with
// coalescing, growing the arena when nothing fits and giving its free tail
// back on Trim.
//
// Free space is kept in TLSF lists (tlsf.go): O(1) alloc and free whatever
// the number of live allocations, with fragmentation close to best fit.
// Block records live on the Go heap, never in the memory they describe —
// device memory is not the allocator's to write, and the sim driver has
// none.
//
// Stitching (as GMLake does): when no free range is long enough but the
// arena holds enough chunks that are wholly free, those physical chunks are
// mapped side by side into a fresh range of a second reservation and the
// request is served there — no copy and no new memory. While the stitched
// allocation lives, the chunks' own ranges in the arena are lent to it
// (neither free nor allocatable); Free unmaps the stitch and returns them.
//
// Invariants (checked by Check): the blocks cover [0, arena Len) in address
// order without gaps; no two free blocks touch; a block is in the free
// lists exactly when it is free; every used block is in used under its
// offset; every lent block belongs to exactly one live stitch; Allocated is
// the sum of the live requests.
type Allocator struct {
	mu          sync.Mutex
	a           *Arena
	policy      Policy
	q           uint64
	stitch      bool
	minGrow     uint64
	growDivisor uint64

	head, tail *block
	free       tlsf
	freeBytes  uint64
	used       map[uint64]*block
	stitches   map[driver.Addr]*stitched
	stRes      *vaspace.Reservation
	stTab      *mapping.Table
	stats      AllocStats
	closed     bool
}

// Policy says how many bytes a request takes and where it may start.
type Policy uint8

const (
	// PolicyDefault: sizes round up to 256 bytes and starts are 256-byte
	// aligned, like device allocators (cudaMalloc returns 256-byte aligned
	// pointers).
	PolicyDefault Policy = iota
	// PolicyAscend: AscendCL's rule for carving one allocation into many
	// (seed 003): a piece of len bytes takes ALIGN_UP(len,32)+32 bytes and
	// starts 64-byte aligned.
	PolicyAscend
	// PolicyAscendMedia: the same footprint, 128-byte aligned starts, for
	// buffers handed to media processing (acldvppMalloc).
	PolicyAscendMedia
)

func (p Policy) String() string {
	switch p {
	case PolicyDefault:
		return "default"
	case PolicyAscend:
		return "ascend"
	case PolicyAscendMedia:
		return "ascend-media"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// Quantum is the policy's start alignment; every block is a multiple of it.
func (p Policy) Quantum() uint64 {
	switch p {
	case PolicyAscend:
		return 64
	case PolicyAscendMedia:
		return 128
	}
	return 256
}

// Footprint is the bytes a request of n bytes takes under the policy,
// before rounding to the quantum: n rounded up to 256 by default,
// ALIGN_UP(n,32)+32 under the AscendCL rule.
func (p Policy) Footprint(n uint64) uint64 {
	if p == PolicyDefault {
		return alignUp(n, 256)
	}
	return alignUp(n, 32) + 32
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

// AllocatorOptions configure an allocator.
type AllocatorOptions struct {
	// Arena configures the arena the allocator owns.
	Arena Options
	// Policy is the size and alignment rule.
	Policy Policy
	// NoStitch turns stitching off: a request no free range fits grows
	// the arena.
	NoStitch bool
	// MinGrow is the least the arena grows by when it must (default 5
	// chunks: 10 MiB at 2 MiB chunks), and GrowDivisor makes each growth at
	// least Committed/GrowDivisor (default 256). Larger steps mean fewer map
	// calls and more memory committed ahead of need. The defaults were
	// chosen on the three allocator traces in testdata: they keep peak
	// committed within 2% of peak allocated on each (see the README).
	MinGrow     uint64
	GrowDivisor uint64
}

// AllocStats are an allocator's figures.
type AllocStats struct {
	// Allocated is the sum of the sizes asked for by live allocations.
	Allocated, PeakAllocated uint64
	// Committed is the memory behind the arena (a stitched chunk is mapped
	// twice but counted once).
	Committed, PeakCommitted uint64
	// LargestFree is the largest free block of the arena.
	LargestFree uint64
	// MapCalls and UnmapCalls count chunk mappings made and removed, for
	// the arena and for stitches.
	MapCalls, UnmapCalls int
	// Stitches counts requests served by stitching; Grows counts arena
	// growths.
	Stitches, Grows int
	// Live is the number of live allocations.
	Live int
}

type blockState uint8

const (
	blockFree blockState = iota
	blockUsed
	blockLent // lent to a stitched allocation
)

// block is [off, off+size) of the arena.
type block struct {
	off, size    uint64
	state        blockState
	req          uint64 // bytes asked for (used blocks)
	prev, next   *block // address order
	fprev, fnext *block // free list
	lentTo       *stitched
}

func (b *block) end() uint64 { return b.off + b.size }

// stitched is an allocation served by stitching: rng of the stitch
// reservation maps, back to back, the chunks of the lent arena blocks.
type stitched struct {
	rng   vaspace.Range
	parts []*block
	req   uint64
}

// NewAllocator creates an arena with opts.Arena and an allocator over it,
// plus a second reservation of the same size for stitched allocations.
func NewAllocator(space *vaspace.Space, mem *physical.Memory, opts AllocatorOptions) (*Allocator, error) {
	if opts.Policy > PolicyAscendMedia {
		return nil, errors.Wrapf(driver.ErrInvalid, "arena: unknown allocator policy %d", opts.Policy)
	}
	a, err := New(space, mem, opts.Arena)
	if err != nil {
		return nil, err
	}
	if opts.MinGrow == 0 {
		opts.MinGrow = 5 * a.ChunkSize()
	}
	if opts.GrowDivisor == 0 {
		opts.GrowDivisor = 256
	}
	al := &Allocator{a: a, policy: opts.Policy, q: opts.Policy.Quantum(), stitch: !opts.NoStitch,
		minGrow: opts.MinGrow, growDivisor: opts.GrowDivisor,
		used: map[uint64]*block{}, stitches: map[driver.Addr]*stitched{}}
	if al.stitch {
		if al.stRes, err = space.Reserve(a.Max(), 0); err == nil {
			if al.stTab, err = mapping.New(al.stRes, mem); err != nil {
				err = errors.CombineErrors(err, al.stRes.Free())
			}
		}
		if err != nil {
			return nil, errors.CombineErrors(errors.Wrap(err, "arena: reserving the stitch range"), a.Close())
		}
	}
	return al, nil
}

// Arena is the arena the allocator carves.
func (al *Allocator) Arena() *Arena { return al.a }

// Policy is the allocator's size and alignment rule.
func (al *Allocator) Policy() Policy { return al.policy }

func (al *Allocator) errClosed(op string) error {
	return driver.Closed("arena: " + op + " on a closed allocator")
}

// Alloc returns the address of size fresh bytes aligned to align (0 means
// the policy's quantum; otherwise a power of two). When no free range fits
// it stitches whole free chunks, else grows the arena; if that fails
// nothing changes.
func (al *Allocator) Alloc(size, align uint64) (driver.Addr, error) {
	what := func() string { return fmt.Sprintf("arena: alloc %s aligned to %d", units.Bytes(size), align) }
	if size == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return 0, err
	}
	align = max(align, al.q)
	fp := alignUp(al.policy.Footprint(size), al.q)
	if fp < size || fp > al.a.Max() {
		return 0, errors.Wrapf(driver.ErrOutOfMemory, "%s: larger than the arena's maximum %s", what(), units.Bytes(al.a.Max()))
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return 0, al.errClosed("alloc")
	}
	if b := al.free.find((fp+align-al.q)/al.q, al.q); b != nil {
		return al.place(b, fp, align, size), nil
	}
	if al.stitch && fp >= al.a.ChunkSize() {
		p, ok, err := al.stitchLocked(fp, size)
		if err != nil {
			return 0, errors.Wrapf(err, "%s", what())
		}
		if ok {
			return p, nil
		}
	}
	b, err := al.growLocked(fp + align - al.q)
	if err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	return al.place(b, fp, align, size), nil
}

// place carves an allocation of fp bytes at an align-aligned start from the
// free block b, which is large enough, and returns its address.
func (al *Allocator) place(b *block, fp, align, req uint64) driver.Addr {
	al.removeFree(b)
	base := uint64(al.a.Base())
	start := alignUp(base+b.off, align) - base
	if start > b.off { // free the front gap
		front := &block{off: b.off, size: start - b.off}
		b.off, b.size = start, b.size-front.size
		al.linkBefore(front, b)
		al.addFree(front)
	}
	if b.size > fp { // free the rest
		rest := &block{off: b.off + fp, size: b.size - fp}
		b.size = fp
		al.linkAfter(rest, b)
		al.addFree(rest)
	}
	b.state, b.req = blockUsed, req
	al.used[b.off] = b
	al.noteAlloc(req)
	return al.a.Base() + driver.Addr(b.off)
}

func (al *Allocator) noteAlloc(req uint64) {
	al.stats.Allocated += req
	al.stats.PeakAllocated = max(al.stats.PeakAllocated, al.stats.Allocated)
}

// growLocked lengthens the arena so that its free tail holds at least n
// bytes, and returns that free tail block.
func (al *Allocator) growLocked(n uint64) (*block, error) {
	have := uint64(0)
	if al.tail != nil && al.tail.state == blockFree {
		have = al.tail.size
	}
	oldLen := al.a.Len()
	need := n - have
	// Grow ahead a little: at least MinGrow, and at least 1/GrowDivisor of
	// what is committed, so a run of allocations that each need new memory
	// does not map a chunk each. What this over-commits at a peak is at most
	// one such step. Ahead is only a preference: when the device or the
	// arena has no room for it, grow by exactly what is needed.
	want := max(need, al.minGrow, al.a.Committed()/al.growDivisor)
	if err := al.a.Grow(want); err != nil {
		if want == need || !errors.Is(err, driver.ErrOutOfMemory) {
			return nil, err
		}
		if err := al.a.Grow(need); err != nil {
			return nil, err
		}
	}
	// Use the rest of the last chunk too: it is committed already.
	if c := al.a.Committed(); c > al.a.Len() {
		if err := al.a.Grow(c - al.a.Len()); err != nil {
			return nil, errors.WithAssertionFailure(err)
		}
	}
	al.stats.Grows++
	if al.a.Len() == oldLen {
		return nil, errors.AssertionFailedf("arena: grew by %d bytes and the length did not change", n-have)
	}
	return al.extendTail(), nil
}

// extendTail makes the blocks cover the arena again after it grew: the
// free tail block lengthens, or a new free block follows the last one. It
// returns the free tail block.
func (al *Allocator) extendTail() *block {
	end := uint64(0)
	if al.tail != nil {
		end = al.tail.end()
	}
	added := al.a.Len() - end
	if added == 0 {
		return al.tail
	}
	if al.tail != nil && al.tail.state == blockFree {
		al.removeFree(al.tail)
		al.tail.size += added
		al.addFree(al.tail)
		return al.tail
	}
	b := &block{off: end, size: added}
	al.linkAfter(b, al.tail)
	al.addFree(b)
	return b
}

// wholeFree lists the arena's chunks that lie wholly inside free blocks,
// largest first, and their total size. It walks chunks and blocks together,
// both in address order: O(chunks + blocks), paid only when a request
// found no free range.
func (al *Allocator) wholeFree() ([]freeChunk, uint64) {
	var cands []freeChunk
	var total uint64
	b := al.head
	for _, ch := range al.a.chunkList() {
		for b != nil && b.end() <= ch.off {
			b = b.next
		}
		if b == nil {
			break
		}
		if b.state == blockFree && b.off <= ch.off && ch.end() <= b.end() {
			cands = append(cands, freeChunk{ch, b})
			total += ch.c.Size()
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].ch.c.Size() > cands[j].ch.c.Size() })
	return cands, total
}

type freeChunk struct {
	ch chunkAt
	b  *block
}

// stitchLocked serves a request of fp bytes by stitching whole free chunks.
// When they are not enough but hold more than the free tail a plain grow
// would extend, the arena grows by the remainder first — a fresh whole
// chunk — and that is stitched too, so the new memory committed is fp minus
// what is free in whole chunks rather than fp minus the free tail. ok is
// false when stitching does not pay; if that is found only after the
// arena grew (the stitch range had no room), the growth stays as free tail,
// which the plain grow that follows uses.
func (al *Allocator) stitchLocked(fp, req uint64) (driver.Addr, bool, error) {
	cands, total := al.wholeFree()
	if total < fp {
		tailFree := uint64(0)
		if al.tail != nil && al.tail.state == blockFree {
			tailFree = al.tail.size
		}
		if total <= tailFree || len(cands) == 0 {
			return 0, false, nil
		}
		// Grow exactly to a chunk boundary: the new chunk is whole and free.
		if err := al.a.Grow(fp - total); err != nil {
			return 0, false, err
		}
		if c := al.a.Committed(); c > al.a.Len() {
			if err := al.a.Grow(c - al.a.Len()); err != nil {
				return 0, false, errors.WithAssertionFailure(err)
			}
		}
		al.stats.Grows++
		al.extendTail()
		if cands, total = al.wholeFree(); total < fp {
			return 0, false, errors.AssertionFailedf("arena: grew for a stitch, still %d of %d bytes in whole free chunks", total, fp)
		}
	}
	var pick []freeChunk
	total = 0
	for _, c := range cands {
		if total >= fp {
			break
		}
		pick = append(pick, c)
		total += c.ch.c.Size()
	}
	if len(pick) < 2 {
		return 0, false, nil // one chunk: the free lists would have found it
	}
	rng, err := al.stRes.Carve(total, 0)
	if err != nil {
		return 0, false, nil // no room in the stitch range: grow instead
	}
	st := &stitched{rng: rng, req: req}
	var mapped []driver.Addr
	undo := func(cause error) (driver.Addr, bool, error) {
		for i := len(mapped) - 1; i >= 0; i-- {
			cause = errors.CombineErrors(cause, al.stTab.Unmap(mapped[i]))
			al.stats.UnmapCalls++
		}
		return 0, false, errors.CombineErrors(errors.Wrap(cause, "arena: stitching"), al.stRes.Uncarve(rng))
	}
	at := rng.Base
	for _, c := range pick {
		if err := al.stTab.Map(at, c.ch.c); err != nil {
			return undo(err)
		}
		al.stats.MapCalls++
		mapped = append(mapped, at)
		for d, acc := range al.a.accessCopy() {
			if err := al.stTab.SetAccess(at, c.ch.c.Size(), d, acc); err != nil {
				return undo(err)
			}
		}
		at += driver.Addr(c.ch.c.Size())
	}
	// Lend the chunks' arena ranges to the stitch.
	for _, c := range pick {
		st.parts = append(st.parts, al.lend(c.b, c.ch.off, c.ch.c.Size(), st))
	}
	al.stitches[rng.Base] = st
	al.stats.Stitches++
	al.noteAlloc(req)
	return rng.Base, true, nil
}

// lend cuts [off, off+size) out of the free block b (which holds it, though
// earlier lends may have split b: find the piece) and marks it lent.
func (al *Allocator) lend(b *block, off, size uint64, st *stitched) *block {
	for b.off > off {
		b = b.prev
	}
	for b.end() <= off {
		b = b.next
	}
	al.removeFree(b)
	if b.off < off {
		front := &block{off: b.off, size: off - b.off}
		b.off, b.size = off, b.size-front.size
		al.linkBefore(front, b)
		al.addFree(front)
	}
	if b.size > size {
		rest := &block{off: off + size, size: b.size - size}
		b.size = size
		al.linkAfter(rest, b)
		al.addFree(rest)
	}
	b.state, b.lentTo = blockLent, st
	return b
}

// Free ends the allocation at p. A pointer that is not the start of a live
// allocation — freed already, never allocated here, or inside one — is
// ErrNotAllocated, and nothing changes.
func (al *Allocator) Free(p driver.Addr) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("free")
	}
	base := al.a.Base()
	if p >= base {
		if b := al.used[uint64(p-base)]; b != nil {
			al.stats.Allocated -= b.req
			b.state, b.req = blockFree, 0
			delete(al.used, b.off)
			al.addFree(al.coalesce(b))
			return nil
		}
	}
	if st := al.stitches[p]; st != nil {
		return al.unstitchLocked(st)
	}
	return al.notAllocated(p)
}

// unstitchLocked unmaps a stitched allocation and returns its chunks' arena
// ranges to the free space.
func (al *Allocator) unstitchLocked(st *stitched) error {
	at := st.rng.Base
	for _, part := range st.parts {
		if err := al.stTab.Unmap(at); err != nil {
			return errors.WithAssertionFailure(errors.Wrapf(err, "arena: free of the stitched allocation at %s", st.rng.Base))
		}
		al.stats.UnmapCalls++
		at += driver.Addr(part.size)
	}
	if err := al.stRes.Uncarve(st.rng); err != nil {
		return errors.WithAssertionFailure(err)
	}
	for _, part := range st.parts {
		part.state, part.lentTo = blockFree, nil
		al.addFree(al.coalesce(part))
	}
	delete(al.stitches, st.rng.Base)
	al.stats.Allocated -= st.req
	return nil
}

// notAllocated explains why p is not a live allocation.
func (al *Allocator) notAllocated(p driver.Addr) error {
	what := fmt.Sprintf("arena: free %s", p)
	base := al.a.Base()
	if p >= base && p < base+driver.Addr(al.a.Len()) {
		off := uint64(p - base)
		for b := al.head; b != nil; b = b.next {
			if off >= b.end() {
				continue
			}
			switch {
			case b.state == blockFree:
				return errors.WithHint(errors.Wrapf(driver.ErrNotAllocated, "%s: that memory is free (freed twice?)", what),
					"free each allocation once")
			case b.state == blockLent:
				return errors.Wrapf(driver.ErrNotAllocated, "%s: that memory is lent to the stitched allocation at %s; free that one",
					what, b.lentTo.rng.Base)
			default:
				return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the allocation at %s of %s; free takes its start",
					what, base+driver.Addr(b.off), units.Bytes(b.req))
			}
		}
	}
	for _, st := range al.stitches {
		if st.rng.Contains(p) {
			return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the stitched allocation at %s; free takes its start",
				what, st.rng.Base)
		}
	}
	if al.stRes != nil && al.stRes.Range().Contains(p) {
		return errors.Wrapf(driver.ErrNotAllocated, "%s: no live stitched allocation starts there (freed twice?)", what)
	}
	return errors.Wrapf(driver.ErrNotAllocated, "%s: the address is not in this allocator's memory %s", what, al.a.res.Range())
}

// Size reports the size asked for by the live allocation at p.
func (al *Allocator) Size(p driver.Addr) (uint64, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return 0, al.errClosed("size")
	}
	if p >= al.a.Base() {
		if b := al.used[uint64(p-al.a.Base())]; b != nil {
			return b.req, nil
		}
	}
	if st := al.stitches[p]; st != nil {
		return st.req, nil
	}
	return 0, al.notAllocated(p)
}

// Bytes returns the live allocation at p as a slice of the size asked for,
// on drivers whose memory the process addresses (driver.HostMapper). It is
// valid until the allocation is freed.
func (al *Allocator) Bytes(p driver.Addr) ([]byte, error) {
	n, err := al.Size(p)
	if err != nil {
		return nil, err
	}
	hm, ok := al.a.drv.(driver.HostMapper)
	if !ok {
		return nil, errors.Wrapf(driver.ErrUnsupported, "arena: bytes of an allocation: the %s driver's memory is not addressable from the host", al.a.drv.Name())
	}
	return hm.HostBytes(p, n)
}

// Trim gives the arena's free tail back to the device: the chunks lying
// wholly inside it are unmapped. Free chunks inside the arena stay (the
// arena is contiguous); stitching reuses them.
func (al *Allocator) Trim() error { return al.TrimTo(0) }

// TrimTo releases whole chunks from the arena's free tail while more than
// keep bytes are committed (as cuMemPoolTrimTo: until fewer than keep are,
// or nothing more can be released safely). It never releases memory
// behind live allocations.
func (al *Allocator) TrimTo(keep uint64) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("trim")
	}
	t := al.tail
	if t == nil || t.state != blockFree {
		return nil
	}
	chunks := al.a.chunkList()
	cut := al.a.Committed()
	for i := len(chunks) - 1; i >= 0 && cut > keep && chunks[i].off >= t.off; i-- {
		cut = chunks[i].off
	}
	if cut >= al.a.Len() {
		return nil
	}
	if err := al.a.Shrink(al.a.Len() - cut); err != nil {
		return err
	}
	if err := al.a.Trim(); err != nil {
		return err
	}
	al.removeFree(t)
	if cut == t.off {
		al.unlink(t)
		return nil
	}
	t.size = cut - t.off
	al.addFree(t)
	return nil
}

// SetAccess sets what dev may do with all the allocator's memory: the
// arena's chunks and the stitched ranges, now and later.
func (al *Allocator) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("set access")
	}
	old := al.a.Access(dev)
	if err := al.a.SetAccess(dev, acc); err != nil {
		return err
	}
	for _, st := range al.stitches {
		if err := al.stTab.SetAccess(st.rng.Base, st.rng.Size, dev, acc); err != nil {
			return errors.CombineErrors(errors.Wrap(err, "arena: set access of a stitched allocation"), al.a.SetAccess(dev, old))
		}
	}
	return nil
}

// Stats returns the allocator's figures.
func (al *Allocator) Stats() AllocStats {
	al.mu.Lock()
	defer al.mu.Unlock()
	s := al.stats
	as := al.a.Stats()
	s.Committed, s.PeakCommitted = as.Committed, as.PeakCommitted
	s.MapCalls += as.MapCalls
	s.UnmapCalls += as.UnmapCalls
	s.LargestFree = al.free.largest()
	s.Live = len(al.used) + len(al.stitches)
	return s
}

// Close closes the arena and frees both reservations. It refuses
// (ErrBusy) while allocations are live: their memory may still be in use
// through slices and tensors, and unmapping it would turn a later touch
// into a fault. Free them first.
func (al *Allocator) Close() error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("close")
	}
	if n := len(al.used) + len(al.stitches); n > 0 {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "arena: close of an allocator: %d allocation(s) still live, %s in all",
				n, units.Bytes(al.stats.Allocated)),
			"free every allocation before closing its allocator")
	}
	var errs error
	if al.stTab != nil {
		errs = errors.CombineErrors(al.stTab.Close(), al.stRes.Free())
	}
	errs = errors.CombineErrors(errs, al.a.Close())
	if errs != nil {
		return errs
	}
	al.closed = true
	al.head, al.tail, al.used, al.stitches = nil, nil, nil, nil
	al.free = tlsf{}
	return nil
}

// Block list and free-list helpers.

func (al *Allocator) addFree(b *block) {
	b.state = blockFree
	al.free.insert(b, al.q)
	al.freeBytes += b.size
}

func (al *Allocator) removeFree(b *block) {
	al.free.remove(b, al.q)
	al.freeBytes -= b.size
}

// coalesce merges the newly free block b with free neighbours (taking them
// off the free lists) and returns the merged block, not yet listed.
func (al *Allocator) coalesce(b *block) *block {
	if p := b.prev; p != nil && p.state == blockFree {
		al.removeFree(p)
		p.size += b.size
		al.unlink(b)
		b = p
	}
	if n := b.next; n != nil && n.state == blockFree {
		al.removeFree(n)
		b.size += n.size
		al.unlink(n)
	}
	return b
}

func (al *Allocator) linkAfter(b, prev *block) {
	b.prev = prev
	if prev == nil {
		b.next, al.head = al.head, b
	} else {
		b.next, prev.next = prev.next, b
	}
	if b.next != nil {
		b.next.prev = b
	} else {
		al.tail = b
	}
}

func (al *Allocator) linkBefore(b, next *block) { al.linkAfter(b, next.prev) }

func (al *Allocator) unlink(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		al.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		al.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

// Check verifies every invariant in the type's doc, the arena's and the
// stitch table's, and returns every violation.
func (al *Allocator) Check() error {
	al.mu.Lock()
	defer al.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if al.closed {
		return nil
	}
	var at, allocated, freeBytes uint64
	used, lent := 0, map[*stitched]int{}
	var prev *block
	for b := al.head; b != nil; b = b.next {
		if b.prev != prev {
			fail("arena: block at %#x has a wrong back link", b.off)
		}
		if b.off != at || b.size == 0 || b.size%al.q != 0 {
			fail("arena: block [%#x, +%d) where %#x was expected, size a positive multiple of %d", b.off, b.size, at, al.q)
		}
		switch b.state {
		case blockFree:
			if prev != nil && prev.state == blockFree {
				fail("arena: free blocks at %#x and %#x touch", prev.off, b.off)
			}
			freeBytes += b.size
		case blockUsed:
			used++
			allocated += b.req
			if al.used[b.off] != b {
				fail("arena: used block at %#x is not indexed", b.off)
			}
		case blockLent:
			if b.lentTo == nil || al.stitches[b.lentTo.rng.Base] != b.lentTo {
				fail("arena: lent block at %#x belongs to no live stitch", b.off)
			}
			lent[b.lentTo]++
		}
		at, prev = b.end(), b
	}
	if al.tail != prev {
		fail("arena: tail is not the last block")
	}
	if at != al.a.Len() {
		fail("arena: blocks end at %#x, the arena is %#x long", at, al.a.Len())
	}
	if used != len(al.used) {
		fail("arena: %d used blocks, %d indexed", used, len(al.used))
	}
	listed := uint64(0)
	for fl := range al.free.heads {
		for sl := range al.free.heads[fl] {
			for b := al.free.heads[fl][sl]; b != nil; b = b.fnext {
				if b.state != blockFree {
					fail("arena: block at %#x is listed free but is not", b.off)
				}
				if f, s := bucket(b.size / al.q); f != fl || s != sl {
					fail("arena: free block at %#x is in the wrong list", b.off)
				}
				listed += b.size
			}
		}
	}
	if listed != freeBytes || freeBytes != al.freeBytes {
		fail("arena: free blocks hold %d bytes, the lists %d, the count %d", freeBytes, listed, al.freeBytes)
	}
	for p, st := range al.stitches {
		allocated += st.req
		if st.rng.Base != p || lent[st] != len(st.parts) {
			fail("arena: stitch at %s lends %d blocks, %d are marked", p, len(st.parts), lent[st])
		}
	}
	if allocated != al.stats.Allocated {
		fail("arena: live allocations hold %d bytes, Allocated says %d", allocated, al.stats.Allocated)
	}
	errs = errors.CombineErrors(errs, al.a.Check())
	if al.stTab != nil {
		errs = errors.CombineErrors(errs, al.stTab.Check())
	}
	return errs
}

// accessCopy returns the access granted on the arena's chunks.
func (a *Arena) accessCopy() map[driver.DeviceID]driver.Access {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.access)
}

// chunkList returns the arena's chunks in address order.
func (a *Arena) chunkList() []chunkAt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.chunks)
}
