package arena

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// SparseOptions configure a Sparse.
type SparseOptions struct {
	// Max is the address space reserved up front, rounded up to a whole
	// number of chunks (so at least one: an arena whose Max is below its
	// chunk size still grows, to one chunk).
	Max uint64
	// ChunkSize is the unit of commit and decommit: offsets and sizes of
	// Commit, Decommit, Grant and Move are multiples of it (default: the
	// recommended granularity of Device, or the largest of every device's
	// when a Placement is given). It must be a multiple of the driver's
	// granularity.
	ChunkSize uint64
	// MaxChunk is the largest physical chunk one commit creates, a multiple
	// of ChunkSize (default ChunkSize). Larger chunks mean fewer driver
	// calls; a chunk is decommitted, moved and granted whole.
	MaxChunk uint64
	// Device backs every chunk when Placement is nil.
	Device driver.DeviceID
	// Placement chooses the device of each chunk (default: Device alone).
	Placement Placement
	// OnFull says what a commit does when the placement's first choice has
	// no room.
	OnFull OnFull
	// Access lists the devices given read-write access to every chunk
	// committed (default: Device, when Placement is nil; no device
	// otherwise — grant ranges with Grant).
	Access []driver.DeviceID
	// Shareable creates every chunk shareable: exportable to other
	// processes (physical.Chunk.Export).
	Shareable bool
	// Pool, when set, keeps the chunks a decommit gives back, unreleased,
	// and a commit maps one of them (of the device and size it needs)
	// before it creates any: see Pool. It is of the range's physical
	// memory; not with Shareable.
	Pool *Pool
}

// slot is one chunk mapped in a Sparse.
type slot struct {
	c *physical.Chunk
	// lender is nil when this range owns the chunk (created it, releases it
	// on decommit); otherwise the chunk is borrowed from lender, where it
	// is lentFrom, pinned while borrowed (so that slot stays in the
	// lender's list, with this chunk, until given back).
	lender   *Sparse
	lentFrom *slot
	// access[d] is what device d may do over the whole chunk.
	access []driver.Access
	// views and borrowers pin the slot: it cannot be decommitted, moved or
	// closed while either is positive. views counts every live view over
	// the slot, readViews those of them that are read-only
	// (ViewReadOnly): the others keep it writable, these readable. Both
	// are guarded by the range's mu; borrowers rises under the range's mu
	// (pin) but falls without it (unpin, from a borrower holding its own
	// mu), so it is atomic: a range's mu is never held while another's is
	// taken.
	views, readViews int
	borrowers        atomic.Int32
}

func (sl *slot) dev() driver.DeviceID { return sl.c.Device() }

// Sparse is a reserved range [Base, Base+Max) of address space in which any
// chunk-aligned sub-range can be committed or decommitted, in any order.
// It is the one core under everything in the library that grows (see the
// package doc). Safe for concurrent use.
type Sparse struct {
	space *vaspace.Space
	mem   *physical.Memory
	drv   driver.Driver
	devs  []driver.Device
	res   *vaspace.Reservation
	own   *vaspace.Owner // keeps res: nobody else can free it (vaspace.Space.ReserveFor)
	tab   *mapping.Table
	opts  SparseOptions

	// The locks, in the order they are taken:
	//   ops      serialises changes of the range's layout (commit, decommit,
	//            access, move, borrow, close), so a Move can copy without mu;
	//   writing  held for reading by Write, for writing by Move while it
	//            copies and swaps: no write is lost to a move;
	//   moving   held for reading by Read and Write, for writing by Move
	//            while it swaps mappings, and by Close;
	//   mu       guards the fields below.
	// A borrower's ops is taken before its lender's mu (to pin what it
	// borrows); no range's mu is held while another range's mu is taken
	// (giving back is an atomic unpin), so two ranges that borrow from
	// each other cannot deadlock.
	ops     sync.Mutex
	writing sync.RWMutex
	moving  sync.RWMutex
	mu      lockrank.Mutex[lockrank.SparseMu]

	// slots are the mapped chunks by offset: sorted, disjoint, each
	// [off, off+size) with off and size multiples of ChunkSize.
	slots ranges.List[uint64, *slot]
	// owned is the bytes of chunks this range owns (committed memory);
	// borrowed the bytes of chunks it borrows.
	owned, borrowed uint64
	// access[d] is what device d gets on every chunk committed from now on.
	access []driver.Access
	views  map[*View]struct{}
	stats  SparseStats
	closed bool
	// unmapped is set when Close closed the page table but the driver
	// refused to free the reservation: a retry of Close only frees it.
	unmapped bool

	// stale are the scratch ranges of failed moves that could not be
	// closed (the driver refused an unmap there): they still map, and so
	// pin, chunks of this range. The next Move, Decommit or Close closes
	// them first. Guarded by ops, not mu.
	stale []*Sparse
	// unreleased are chunks unmapped from the range whose release the
	// driver refused: no longer the range's (nor counted as committed),
	// their memory goes back when the next Decommit or Close releases
	// them. Guarded by ops.
	unreleased []*physical.Chunk

	// scratch is a commit's working memory, kept between commits so a
	// commit of one chunk allocates only what it keeps (the slot and the
	// lower layers' records). Guarded by ops and mu; emptied (pointers
	// cleared) after each use.
	scratch struct {
		holes, parts []span
		pieces       []piece
		free         []uint64
		made         []ranges.Item[uint64, *slot]
	}
}

// SparseStats are a Sparse's figures.
type SparseStats struct {
	// Committed is the memory of the chunks the range owns; PeakCommitted
	// the most it has been. Borrowed is the size of chunks borrowed from
	// other ranges (mapped here, owned there).
	Committed, PeakCommitted, Borrowed uint64
	// Chunks is the number of chunks mapped now, owned or borrowed.
	Chunks int
	// MapEvents counts contiguous ranges mapped at once (one Commit of a
	// run of holes is one event per hole; a borrow is one): how PyTorch
	// counts its segment_map events. UnmapEvents likewise.
	MapEvents, UnmapEvents int
	// ChunkMaps and ChunkUnmaps count driver Map and Unmap calls (one per
	// chunk); Creates and Releases the chunks created and released;
	// Reused and Pooled the chunks a commit took from the pool
	// (SparseOptions.Pool) and a decommit gave it; Grants
	// the driver SetAccess calls that gave new mappings the range's access
	// (one a device and map event).
	ChunkMaps, ChunkUnmaps, Creates, Releases, Grants int
	Reused, Pooled                                    int
	// Decommits counts Decommit calls that gave memory back, and
	// DecommittedBytes the memory they gave.
	Decommits        int
	DecommittedBytes uint64
	// Moves counts migrations and MovedBytes the memory they moved.
	Moves      int
	MovedBytes uint64
	// Relocations counts map events of chunks relocated into the range
	// from elsewhere (see relocate.go), and RelocatedBytes their memory.
	Relocations    int
	RelocatedBytes uint64
	// Views is the number of live views, read-only ones included.
	Views int
}

// NewSparse reserves opts.Max of address space. No memory is committed.
func NewSparse(space *vaspace.Space, mem *physical.Memory, opts SparseOptions) (*Sparse, error) {
	if space == nil || mem == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new range: the address space or the physical memory is nil")
	}
	drv := space.Driver()
	if drv == nil || mem.Driver() == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new range: the address space or the physical memory has no driver (made with vaspace.New and physical.New of an open driver?)")
	}
	if err := driver.CheckComparable(func() string { return "arena: new range" }, drv); err != nil {
		return nil, err
	}
	if !driver.Same(mem.Driver(), drv) {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new range: the address space and the physical memory are on different drivers")
	}
	if opts.Placement != nil && isnil.Is(opts.Placement) {
		return nil, errors.Wrapf(driver.ErrInvalid, "arena: new range: the placement is a nil %T", opts.Placement)
	}
	devs := drv.Devices()
	what := func() string {
		where := fmt.Sprintf("on device %d", opts.Device)
		if opts.Placement != nil {
			where = placementString(opts.Placement)
		}
		return fmt.Sprintf("arena: new range of %s %s", units.Bytes(opts.Max), where)
	}
	if opts.Placement == nil {
		if err := driver.CheckDevice(what, opts.Device, len(devs)); err != nil {
			return nil, err
		}
		if opts.ChunkSize == 0 {
			opts.ChunkSize = devs[opts.Device].RecommendedGranularity
		}
		if opts.Access == nil {
			opts.Access = []driver.DeviceID{opts.Device}
		}
		opts.Placement = OneDevice(opts.Device)
	} else if opts.ChunkSize == 0 {
		for _, d := range devs {
			opts.ChunkSize = max(opts.ChunkSize, d.RecommendedGranularity)
		}
	}
	cs := opts.ChunkSize
	if err := driver.CheckSize(func() string { return what() + ": chunk size" }, cs, drv.Granularity()); err != nil {
		return nil, err
	}
	if opts.MaxChunk == 0 {
		opts.MaxChunk = cs
	}
	if opts.MaxChunk%cs != 0 {
		return nil, errors.Wrapf(driver.ErrMisaligned, "%s: MaxChunk %s is not a multiple of the chunk size %s",
			what(), units.Bytes(opts.MaxChunk), units.Bytes(cs))
	}
	if opts.OnFull > FailWhenFull {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: OnFull %d is neither SkipFull (0) nor FailWhenFull (1)", what(), opts.OnFull)
	}
	if opts.Max == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: Max is zero", what())
	}
	size := (opts.Max + cs - 1) / cs * cs
	if size < opts.Max {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: Max overflows", what())
	}
	access := make([]driver.Access, len(devs))
	for _, d := range opts.Access {
		if err := driver.CheckDevice(what, d, len(devs)); err != nil {
			return nil, err
		}
		access[d] = driver.AccessReadWrite
	}
	if opts.Pool != nil && (opts.Pool.unmade() || opts.Pool.mem != mem) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the pool is not one of the range's physical memory (made by NewPool of it?)", what())
	}
	if opts.Pool != nil && opts.Shareable {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: a range of shareable chunks cannot pool them", what()),
			"leave Pool nil for a shareable range: an exported chunk is named by its handle")
	}
	if opts.Shareable && !drv.Supports(driver.FeatureShareable) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no shareable chunks", what(), drv.Name())
	}
	own := vaspace.NewOwner("an arena range")
	res, err := space.ReserveFor(own, size, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	tab, err := mapping.NewFor(own, res, mem)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), res.FreeFor(own))
	}
	opts.Max = size
	opts.Access = slices.Clone(opts.Access)
	return &Sparse{space: space, mem: mem, drv: drv, devs: devs, res: res, own: own, tab: tab, opts: opts,
		access: access, views: map[*View]struct{}{}}, nil
}

// Base is the range's first address; it never changes.
func (s *Sparse) Base() driver.Addr {
	if s.unmade() {
		return 0
	}
	return s.res.Base()
}

// Max is the size of the range.
func (s *Sparse) Max() uint64 {
	if s.unmade() {
		return 0
	}
	return s.opts.Max
}

// ChunkSize is the unit of commit and decommit.
func (s *Sparse) ChunkSize() uint64 {
	if s.unmade() {
		return 0
	}
	return s.opts.ChunkSize
}

// Placement is the range's placement policy.
func (s *Sparse) Placement() Placement {
	if s.unmade() {
		return nil
	}
	return s.opts.Placement
}

// Driver is the driver whose memory backs the range.
func (s *Sparse) Driver() driver.Driver {
	if s.unmade() {
		return nil
	}
	return s.drv
}

// Range is [Base, Base+Max).
func (s *Sparse) Range() vaspace.Range {
	if s.unmade() {
		return vaspace.Range{}
	}
	return s.res.Range()
}

// Committed is the memory of the chunks the range owns.
func (s *Sparse) Committed() uint64 {
	if s.unmade() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owned
}

// Stats returns the range's figures.
func (s *Sparse) Stats() SparseStats {
	if s.unmade() {
		return SparseStats{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Sparse) statsLocked() SparseStats {
	st := s.stats
	st.Committed, st.Borrowed, st.Chunks, st.Views = s.owned, s.borrowed, s.slots.Len(), len(s.views)
	return st
}

// HostAddressable reports whether the range's memory is addressable from
// this process (View.Bytes works).
func (s *Sparse) HostAddressable() bool {
	if s.unmade() {
		return false
	}
	_, ok := s.drv.(driver.HostMapper)
	return ok
}

func (s *Sparse) errClosed(op string) error {
	return driver.Closed("arena: " + op + " on a closed range")
}

// checkSpan checks that [off, off+n) is non-empty, whole chunks and inside
// the range.
func (s *Sparse) checkSpan(what func() string, off, n uint64) error {
	cs := s.opts.ChunkSize
	if n == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	if off%cs != 0 || n%cs != 0 {
		return errors.WithHintf(
			errors.Wrapf(driver.ErrMisaligned, "%s: the range is not whole chunks of %s", what(), units.Bytes(cs)),
			"offsets and sizes are multiples of the chunk size, %s", units.Bytes(cs))
	}
	if off+n < off || off+n > s.opts.Max {
		return errors.Wrapf(driver.ErrNotReserved, "%s: past the range's end at %s", what(), units.Bytes(s.opts.Max))
	}
	return nil
}

// span is [start, end) of a range's offsets.
type span struct{ start, end uint64 }

func (sp span) size() uint64 { return sp.end - sp.start }

// holesLocked returns the uncommitted parts of [start, end), in order.
func (s *Sparse) holesLocked(start, end uint64) []span {
	return s.holesInto(nil, start, end)
}

// holesInto appends the uncommitted parts of [start, end), in order, to
// holes.
func (s *Sparse) holesInto(holes []span, start, end uint64) []span {
	at := start
	for it := range s.slots.After(start) {
		if it.Start >= end {
			break
		}
		if it.Start > at {
			holes = append(holes, span{at, it.Start})
		}
		at = max(at, it.End)
	}
	if at < end {
		holes = append(holes, span{at, end})
	}
	return holes
}

// Commit makes [off, off+n) — whole chunks — committed: every part of it
// not committed yet gets new chunks on the devices the placement chooses,
// mapped, with the range's access granted. Parts already committed are left
// as they are. All or nothing: a commit the devices cannot hold is refused
// before any chunk is created, and one that fails part-way (memory taken by
// others meanwhile) unmaps and releases what it made, leaving the range as
// it was; the error names what was asked and what each device had.
//
// Each uncommitted stretch is one map event: its chunks, at most MaxChunk
// each, are taken from the pool (SparseOptions.Pool) or created, and
// mapped one by one (a driver creates and maps one
// handle a call), then each device named in the range's access is granted
// the whole stretch in one call.
func (s *Sparse) Commit(off, n uint64) error {
	if s.unmade() {
		return unmade("Sparse.Commit", "NewSparse")
	}
	return s.commitCut(off, n, nil)
}

// commitCut is Commit with the chunks of each uncommitted stretch chosen by
// cut (nil: at most MaxChunk each, from the stretch's start): the
// allocator gives each allocation's interior a chunk of its own.
func (s *Sparse) commitCut(off, n uint64, cut func(hole span) []span) error {
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string {
		return fmt.Sprintf("arena: commit [%#x, +%s) (committed %s, max %s)", off, units.Bytes(n), units.Bytes(s.owned), units.Bytes(s.opts.Max))
	}
	if s.closed {
		return s.errClosed("commit")
	}
	if err := s.checkSpan(what, off, n); err != nil {
		return err
	}
	holes := s.holesInto(s.scratch.holes[:0], off, off+n)
	err := s.commitLocked(what, holes, cut)
	s.scratch.holes = holes[:0]
	if invariants.Enabled {
		invariants.Fail("arena: commit", s.checkLocked())
	}
	return err
}

// piece is one chunk a commit will create.
type piece struct {
	off, size uint64
	dev       driver.DeviceID
}

// commitLocked fills the holes with new chunks, cut by cut, all or nothing.
func (s *Sparse) commitLocked(what func() string, holes []span, cut func(span) []span) error {
	if len(holes) == 0 {
		return nil
	}
	pieces, release, err := s.planLocked(what, holes, cut)
	defer func() { s.scratch.pieces = pieces[:0] }()
	if err != nil {
		return err
	}
	// Pooled chunks of other sizes the plan counted on as room: released
	// now that the plan holds (a refused plan released nothing).
	for _, r := range release {
		if err := s.opts.Pool.release(pieces[0].dev, r.size, r.n); err != nil {
			return errors.Wrapf(err, "%s: release %d pooled chunks of %s for chunks of another size", what(), r.n, units.Bytes(r.size))
		}
	}
	made := s.scratch.made[:0]
	defer func() {
		clear(made) // the slots are the list's, or released
		s.scratch.made = made[:0]
	}()
	undo := func(cause error) error {
		for i := len(made) - 1; i >= 0; i-- {
			it := made[i]
			uerr := s.tab.Unmap(s.Base() + driver.Addr(it.Start))
			s.stats.ChunkUnmaps++
			cause = errors.CombineErrors(cause, errors.CombineErrors(uerr, s.dropChunk(it.Val.c)))
		}
		return cause
	}
	var asked uint64
	for _, p := range pieces {
		asked += p.size
	}
	// The plan went by this range's books; memory taken by others on the
	// same driver shows only when a create fails. Such a device is full:
	// the piece goes where the placement would put it next, by the free
	// memory the devices have then (the chunks made so far counted as
	// used), read only once a create has failed: a commit that fails no
	// create reads it once, in the plan. (The plan is done with the
	// scratch free list: it is this loop's now.)
	var free []uint64
	for _, p := range pieces {
		for {
			sl, err := s.makeLocked(p)
			if err == nil {
				if free != nil {
					free[p.dev] -= min(free[p.dev], p.size)
				}
				made = append(made, ranges.Item[uint64, *slot]{Start: p.off, End: p.off + p.size, Val: sl})
				break
			}
			if errors.Is(err, driver.ErrOutOfMemory) {
				if free == nil {
					free = s.freeInto(s.scratch.free[:0])
				}
				free[p.dev] = 0
				if d, cerr := s.chooseLocked(p.off, p.size, free); cerr == nil {
					p.dev = d
					continue
				}
			}
			return undo(errors.Wrapf(err, "%s: needed %s more committed, and the chunk at %#x on device %d failed (%s as this range counts it)",
				what(), units.Bytes(asked), p.off, p.dev, s.describeFree()))
		}
	}
	// The range's access, one call a device and hole: the holes are mapped
	// throughout now.
	for _, h := range holes {
		if err := s.grantNewLocked(h); err != nil {
			return undo(errors.Wrapf(err, "%s", what()))
		}
	}
	for _, it := range made {
		copy(it.Val.access, s.access)
	}
	for _, h := range holes {
		lo := slices.IndexFunc(made, func(it ranges.Item[uint64, *slot]) bool { return it.Start >= h.start })
		hi := slices.IndexFunc(made, func(it ranges.Item[uint64, *slot]) bool { return it.Start >= h.end })
		if hi < 0 {
			hi = len(made)
		}
		if !s.slots.AddRun(made[lo:hi]) {
			return errors.AssertionFailedf("%s: the new chunks of [%#x, %#x) overlap the range's", what(), h.start, h.end)
		}
	}
	for _, it := range made {
		s.owned += it.Size()
	}
	s.stats.PeakCommitted = max(s.stats.PeakCommitted, s.owned)
	s.stats.MapEvents += len(holes)
	return nil
}

// grantNewLocked grants the range's access over h, newly mapped
// throughout, one driver call a device with access. The caller unmaps h
// if it fails (which takes whatever was granted with it).
func (s *Sparse) grantNewLocked(h span) error { return s.grantRowLocked(h, s.access) }

// grantRowLocked is grantNewLocked of access[d] for each device d.
func (s *Sparse) grantRowLocked(h span, access []driver.Access) error {
	for d, acc := range access {
		if acc == driver.AccessNone {
			continue
		}
		if err := s.tab.SetAccess(s.Base()+driver.Addr(h.start), h.size(), driver.DeviceID(d), acc); err != nil {
			return err
		}
		s.stats.Grants++
	}
	return nil
}

// planLocked cuts the holes into chunks (by cut, or at most MaxChunk each)
// and chooses the device of every chunk, counting free memory as it goes;
// it refuses — before anything is created — a commit the devices cannot
// hold. A chunk the pool holds of the size is taken; where the device
// has no room for a new one, the pool's chunks of other sizes on it are
// room too (the device counts them as used, and they are only a cache):
// release lists those the commit must release before it creates, by
// size (a range with a pool has one device).
func (s *Sparse) planLocked(what func() string, holes []span, cut func(span) []span) ([]piece, []sizeCount, error) {
	free := s.freeInto(s.scratch.free[:0])
	defer func() { s.scratch.free = free[:0] }()
	pieces := s.scratch.pieces[:0]
	var taken []sizeCount   // the pooled chunks the plan leaves, by size
	var release []sizeCount // the pooled chunks to release, by size
	var asked uint64
	for _, h := range holes {
		asked += h.size()
	}
	for _, h := range holes {
		var parts []span
		if cut != nil {
			parts = cut(h)
			if err := s.checkCut(h, parts); err != nil {
				return pieces, nil, errors.Wrapf(err, "%s", what())
			}
		} else {
			parts = s.scratch.parts[:0]
			for off := h.start; off < h.end; {
				size := min(h.end-off, s.opts.MaxChunk)
				parts = append(parts, span{off, off + size})
				off += size
			}
			s.scratch.parts = parts[:0]
		}
		for _, p := range parts {
			// A chunk the pool holds for the device is no new memory.
			if d, ok := s.fromPoolLocked(p.size(), &taken); ok {
				pieces = append(pieces, piece{p.start, p.size(), d})
				continue
			}
			dev, err := s.chooseLocked(p.start, p.size(), free)
			if err != nil && s.roomInPoolLocked(p.size(), free, &taken, &release) {
				dev, err = s.chooseLocked(p.start, p.size(), free)
			}
			if err != nil {
				return pieces, nil, errors.WithHint(
					errors.Wrapf(err, "%s: needed %s more committed; %s", what(), units.Bytes(asked), s.describeFree()),
					"decommit or free memory on the devices named, or commit less")
			}
			free[dev] -= p.size()
			pieces = append(pieces, piece{p.start, p.size(), dev})
		}
	}
	return pieces, release, nil
}

// roomInPoolLocked plans the release of pooled chunks of the range's one
// device, of sizes the plan has not taken, the largest first, until the
// device's free memory (free, which it raises) holds size, and reports
// whether it does. The chunks go from taken (what the plan may still
// take, by size) to release. It plans nothing when they would not make
// the room.
func (s *Sparse) roomInPoolLocked(size uint64, free []uint64, taken, release *[]sizeCount) bool {
	o, ok := s.opts.Placement.(oneDevice)
	if s.opts.Pool == nil || !ok || free[o.dev] >= size {
		return false
	}
	sizes := s.opts.Pool.sizesOn(o.dev)
	for i := range sizes {
		if j := slices.IndexFunc(*taken, func(t sizeCount) bool { return t.size == sizes[i].size }); j >= 0 {
			sizes[i].n = (*taken)[j].n
		}
	}
	room := free[o.dev]
	var plan []sizeCount
	for _, sc := range sizes {
		if room >= size {
			break
		}
		n := min(sc.n, int((size-room+sc.size-1)/sc.size))
		if n > 0 {
			plan = append(plan, sizeCount{sc.size, n})
			room += uint64(n) * sc.size
		}
	}
	if room < size {
		return false
	}
	for _, r := range plan {
		j := slices.IndexFunc(*taken, func(t sizeCount) bool { return t.size == r.size })
		if j < 0 {
			*taken = append(*taken, sizeCount{r.size, s.opts.Pool.count(o.dev, r.size)})
			j = len(*taken) - 1
		}
		(*taken)[j].n -= r.n
		if k := slices.IndexFunc(*release, func(t sizeCount) bool { return t.size == r.size }); k >= 0 {
			(*release)[k].n += r.n
		} else {
			*release = append(*release, r)
		}
	}
	free[o.dev] = room
	return true
}

// sizeCount is a number of chunks of one size.
type sizeCount struct {
	size uint64
	n    int
}

// fromPoolLocked reports whether a chunk of size bytes on the range's one
// device (a range with a placement of several devices counts no pooled
// chunk in its plan) is left in the pool after those the plan has taken
// (taken, which it counts it in).
func (s *Sparse) fromPoolLocked(size uint64, taken *[]sizeCount) (driver.DeviceID, bool) {
	o, ok := s.opts.Placement.(oneDevice)
	if s.opts.Pool == nil || !ok {
		return 0, false
	}
	i := slices.IndexFunc(*taken, func(t sizeCount) bool { return t.size == size })
	if i < 0 {
		*taken = append(*taken, sizeCount{size, s.opts.Pool.count(o.dev, size)})
		i = len(*taken) - 1
	}
	if (*taken)[i].n == 0 {
		return 0, false
	}
	(*taken)[i].n--
	return o.dev, true
}

// checkCut checks that parts tile h with whole chunks, in order.
func (s *Sparse) checkCut(h span, parts []span) error {
	at := h.start
	for _, p := range parts {
		if p.start != at || p.end <= p.start || p.end > h.end || p.start%s.opts.ChunkSize != 0 || p.end%s.opts.ChunkSize != 0 {
			return errors.AssertionFailedf("arena: the chunks %v do not tile the hole [%#x, %#x) with whole chunks", parts, h.start, h.end)
		}
		at = p.end
	}
	if at != h.end {
		return errors.AssertionFailedf("arena: the chunks %v do not tile the hole [%#x, %#x)", parts, h.start, h.end)
	}
	return nil
}

// chooseLocked returns the device for a chunk of size bytes at off: the
// first of the placement's order with room (the first only, under
// FailWhenFull).
func (s *Sparse) chooseLocked(off, size uint64, free []uint64) (driver.DeviceID, error) {
	i := int(off / s.opts.ChunkSize)
	where := func() string {
		return fmt.Sprintf("chunk %d at offset %#x, placed %s", i, off, placementString(s.opts.Placement))
	}
	var one [1]driver.DeviceID
	var order []driver.DeviceID
	if o, ok := s.opts.Placement.(oneDevice); ok {
		// The default: no call out, nothing to copy.
		one[0] = o.dev
		order = one[:]
	} else {
		var err error
		// A copy: Order may keep free.
		if order, err = placementOrder(s.opts.Placement, off, i, slices.Clone(free)); err != nil {
			return 0, errors.Wrapf(err, "%s", where())
		}
	}
	if len(order) == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: the placement named no device", where())
	}
	for _, d := range order {
		if err := driver.CheckDevice(where, d, len(s.devs)); err != nil {
			return 0, err
		}
	}
	var full []string
	for _, d := range order {
		if free[d] >= size {
			return d, nil
		}
		full = append(full, fmt.Sprintf("device %d has %s free", d, units.Bytes(free[d])))
		if s.opts.OnFull == FailWhenFull {
			break
		}
	}
	return 0, errors.Wrapf(driver.ErrOutOfMemory, "%s (%s): no room for %s: %s", where(), s.opts.OnFull, units.Bytes(size), strings.Join(full, ", "))
}

// makeLocked creates the chunk of p and maps it, inaccessible (the caller
// grants the range's access over the whole hole at once); on failure
// nothing is left behind.
func (s *Sparse) makeLocked(p piece) (*slot, error) {
	c := s.opts.Pool.takeFor(s, p.dev, p.size)
	if c == nil {
		var err error
		if c, err = s.mem.Create(p.dev, p.size, driver.ChunkOptions{Shareable: s.opts.Shareable}); err != nil {
			return nil, err
		}
		s.stats.Creates++
	}
	at := s.Base() + driver.Addr(p.off)
	if err := s.tab.Map(at, c); err != nil {
		return nil, errors.CombineErrors(err, s.dropChunk(c))
	}
	s.stats.ChunkMaps++
	return newSlot(c, len(s.devs)), nil
}

// slotFew is a slot and its access row in one allocation, for ranges on
// up to four devices (nearly all): one allocation a commit, not two.
type slotFew struct {
	sl  slot
	acc [4]driver.Access
}

// newSlot returns a slot of c with no access for any of ndev devices.
func newSlot(c *physical.Chunk, ndev int) *slot {
	if ndev <= len(slotFew{}.acc) {
		f := &slotFew{sl: slot{c: c}}
		f.sl.access = f.acc[:ndev:ndev]
		return &f.sl
	}
	return &slot{c: c, access: make([]driver.Access, ndev)}
}

// freeLocked returns the free bytes of every device, as physical memory
// counts them.
func (s *Sparse) freeLocked() []uint64 {
	return s.freeInto(nil)
}

// freeInto is freeLocked into buf's memory.
func (s *Sparse) freeInto(buf []uint64) []uint64 {
	free := slices.Grow(buf[:0], len(s.devs))[:len(s.devs)]
	for d := range free {
		free[d] = 0
		if u, err := s.mem.Usage(driver.DeviceID(d)); err == nil {
			free[d] = u.Capacity - u.Used
		}
	}
	return free
}

// describeFree says what the devices the placement can use have free:
// "device 0 had 64 KiB free, device 1 had 0 B free".
func (s *Sparse) describeFree() string {
	var b strings.Builder
	for d, f := range s.freeLocked() {
		if o, ok := s.opts.Placement.(oneDevice); ok && o.dev != driver.DeviceID(d) {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "device %d had %s free", d, units.Bytes(f))
	}
	return b.String()
}

// Decommit gives back the memory of every chunk in [off, off+n) — whole
// chunks: the chunks are unmapped and released (kept by the range's pool,
// when it has one and they fit; given back to their lender, when
// borrowed), and the range there is reserved address space again. Parts not committed are skipped. It refuses, changing nothing,
// when a chunk reaches out of the range (ErrPartial: chunks go whole) or
// when a live view or a borrower pins one (ErrBusy, naming it).
func (s *Sparse) Decommit(off, n uint64) error {
	if s.unmade() {
		return unmade("Sparse.Decommit", "NewSparse")
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	_ = s.closeStale()     // what stays pinned is refused below, as lent
	_ = s.releaseRefused() // what the driver refuses again waits for the next
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string {
		return fmt.Sprintf("arena: decommit [%#x, +%s)", off, units.Bytes(n))
	}
	if s.closed {
		return s.errClosed("decommit")
	}
	if err := s.checkSpan(what, off, n); err != nil {
		return err
	}
	err := s.decommitLocked(what, off, off+n)
	if invariants.Enabled {
		invariants.Fail("arena: decommit", s.checkLocked())
	}
	return err
}

func (s *Sparse) decommitLocked(what func() string, start, end uint64) error {
	if it := s.slots.Get(start); it != nil && it.Start == start && it.End == end {
		return s.decommitOneLocked(what, *it)
	}
	lo, hi := s.slots.Overlapping(start, end)
	if lo == hi {
		return nil
	}
	if err := s.wholeLocked(what, lo, hi, start, end); err != nil {
		return err
	}
	if err := s.unpinnedLocked(what, lo, hi); err != nil {
		return err
	}
	var gave uint64
	runs := 0
	prevEnd := uint64(0)
	// Unmap last first; the books drop what was unmapped, in one move of
	// the list, even when a later unmap fails: what is left is always a
	// prefix of the slots asked for.
	// One walk of the list, last first (nothing changes it until the
	// deletion after the walk), not a descent of the tree a slot.
	done := hi
	var err error
	for i, p := range s.slots.Backward(hi) {
		if i < lo {
			break
		}
		it := *p
		var unmapped bool
		unmapped, err = s.unmapSlotLocked(it.Start, it.Val)
		if unmapped {
			done = i
			if it.Val.lender == nil {
				gave += it.Size()
			}
			if i == hi-1 || it.End != prevEnd {
				runs++
			}
			prevEnd = it.Start
		}
		if err != nil {
			break
		}
	}
	s.slots.Delete(done, hi)
	s.countDecommit(gave, runs)
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}

// decommitOneLocked is decommitLocked of exactly the slot it (the common
// case: one chunk, say a KV cache's page), found and dropped by key.
func (s *Sparse) decommitOneLocked(what func() string, it ranges.Item[uint64, *slot]) error {
	if err := s.pinnedLocked(what, &it); err != nil {
		return err
	}
	unmapped, err := s.unmapSlotLocked(it.Start, it.Val)
	gave, runs := uint64(0), 0
	if unmapped {
		s.slots.DeleteStart(it.Start)
		if it.Val.lender == nil {
			gave = it.Size()
		}
		runs = 1
	}
	s.countDecommit(gave, runs)
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}

// committedEnd returns where the committed chunks in [lo, hi) end (lo
// when there are none): after a decommit of [lo, hi) the driver refused
// part-way, what is left of it is [lo, committedEnd).
func (s *Sparse) committedEnd(lo, hi uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, b := s.slots.Overlapping(lo, hi)
	if a == b {
		return lo
	}
	return min(s.slots.At(b-1).End, hi)
}

// countDecommit counts a decommit of gave bytes in runs contiguous ranges.
func (s *Sparse) countDecommit(gave uint64, runs int) {
	s.stats.UnmapEvents += runs
	if gave > 0 {
		s.stats.Decommits++
		s.stats.DecommittedBytes += gave
	}
}

// wholeLocked checks that slots [lo, hi) lie inside [start, end).
func (s *Sparse) wholeLocked(what func() string, lo, hi int, start, end uint64) error {
	first := s.slots.At(lo)
	last := first
	if hi-1 > lo {
		last = s.slots.At(hi - 1)
	}
	for _, it := range [2]*ranges.Item[uint64, *slot]{first, last} {
		if it.Start < start || it.End > end {
			return errors.WithHint(
				errors.Wrapf(driver.ErrPartial, "%s: it cuts the chunk at [%#x, +%s)", what(), it.Start, units.Bytes(it.Size())),
				"chunks go whole: widen the range to the chunk's bounds")
		}
	}
	return nil
}

// unpinnedLocked refuses, naming the first, slots of [lo, hi) that a view
// or a borrower pins.
func (s *Sparse) unpinnedLocked(what func() string, lo, hi int) error {
	for i, it := range s.slots.From(lo) {
		if i >= hi {
			break
		}
		if err := s.pinnedLocked(what, it); err != nil {
			return err
		}
	}
	return nil
}

// pinnedLocked refuses the slot it if a view or a borrower pins it.
func (s *Sparse) pinnedLocked(what func() string, it *ranges.Item[uint64, *slot]) error {
	switch {
	case it.Val.views > 0:
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: %d live view(s) pin the chunk at [%#x, +%s)", what(), it.Val.views, it.Start, units.Bytes(it.Size())),
			"release the views of the memory being given up first")
	case it.Val.borrowers.Load() > 0:
		return errors.Wrapf(driver.ErrBusy, "%s: the chunk at [%#x, +%s) is lent to another range (stitched or being moved)",
			what(), it.Start, units.Bytes(it.Size()))
	}
	return nil
}

// unmapSlotLocked unmaps sl at off, then releases its chunk (or gives it
// to the pool) or gives it back to its lender, and counts it off; unmapped says whether the slot is
// gone from the range (the caller drops it from the list), even when the
// error is the release's: a chunk whose release the driver refuses waits
// in unreleased. The caller holds ops.
func (s *Sparse) unmapSlotLocked(off uint64, sl *slot) (unmapped bool, err error) {
	if err := s.tab.Unmap(s.Base() + driver.Addr(off)); err != nil {
		return false, err
	}
	s.stats.ChunkUnmaps++
	size := sl.c.Size()
	if sl.lender != nil {
		s.borrowed -= size
		return true, unpin(sl)
	}
	s.owned -= size
	if s.opts.Pool.put(sl.c) {
		s.stats.Pooled++
		return true, nil
	}
	s.stats.Releases++
	if err := sl.c.Release(); err != nil {
		s.unreleased = append(s.unreleased, sl.c)
		return true, errors.Wrapf(err, "arena: the chunk at %#x is unmapped; its memory goes back at the range's next decommit or close", off)
	}
	return true, nil
}

// dropChunk gives c, an unmapped chunk of the range's, to the pool, or
// releases it.
func (s *Sparse) dropChunk(c *physical.Chunk) error {
	if s.opts.Pool.put(c) {
		s.stats.Pooled++
		return nil
	}
	s.stats.Releases++
	return c.Release()
}

// releaseRefused releases the chunks whose release the driver refused
// before, keeping those it refuses again. The caller holds ops.
func (s *Sparse) releaseRefused() error {
	var errs error
	kept := s.unreleased[:0]
	for _, c := range s.unreleased {
		if err := c.Release(); err != nil {
			errs = errors.CombineErrors(errs, err)
			kept = append(kept, c)
		}
	}
	clear(s.unreleased[len(kept):])
	s.unreleased = kept
	return errs
}

// Extent is a maximal run of committed chunks on one device, all owned or
// all borrowed.
type Extent struct {
	// Offset and Size are in bytes from the range's base.
	Offset, Size uint64
	Device       driver.DeviceID
	Borrowed     bool
}

// Layout lists the committed memory as maximal runs on one device, in
// address order.
func (s *Sparse) Layout() []Extent {
	if s.unmade() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Extent
	for _, it := range s.slots.All() {
		d, b := it.Val.dev(), it.Val.lender != nil
		if n := len(out); n > 0 && out[n-1].Device == d && out[n-1].Borrowed == b && out[n-1].Offset+out[n-1].Size == it.Start {
			out[n-1].Size += it.Size()
			continue
		}
		out = append(out, Extent{Offset: it.Start, Size: it.Size(), Device: d, Borrowed: b})
	}
	return out
}

// DeviceAt reports the device whose memory backs offset off.
func (s *Sparse) DeviceAt(off uint64) (driver.DeviceID, error) {
	if s.unmade() {
		return 0, unmade("Sparse.DeviceAt", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, s.errClosed("device at")
	}
	i, ok := s.slots.Find(off)
	if !ok {
		return 0, errors.Wrapf(driver.ErrNotMapped, "arena: device at offset %#x: nothing is committed there", off)
	}
	return s.slots.At(i).Val.dev(), nil
}

// Close decommits everything and frees the reservation. It refuses
// (ErrBusy) while views are live or another range borrows a chunk. When
// the driver refuses an unmap or the reservation's free, the range stays
// open with what it could not give back, and Close may be called again.
func (s *Sparse) Close() error {
	if s.unmade() {
		return unmade("Sparse.Close", "NewSparse")
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	if err := s.closeStale(); err != nil {
		return errors.Wrap(err, "arena: close of a range: the scratch range of a failed move still maps its chunks")
	}
	if err := s.releaseRefused(); err != nil {
		return errors.Wrap(err, "arena: close of a range: releasing the chunks whose release was refused before")
	}
	s.writing.Lock()
	defer s.writing.Unlock()
	s.moving.Lock()
	defer s.moving.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("close")
	}
	what := func() string { return "arena: close of a range" }
	if len(s.views) > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: %d view(s) still live", what(), len(s.views)),
			"release every view first")
	}
	if err := s.unpinnedLocked(what, 0, s.slots.Len()); err != nil {
		return err
	}
	if err := s.decommitLocked(what, 0, s.opts.Max); err != nil {
		return err
	}
	if !s.unmapped {
		if err := s.tab.Close(); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		s.unmapped = true
	}
	if err := s.res.FreeFor(s.own); err != nil {
		// A range the driver no longer held (unreserved behind the range's
		// back) is let go all the same: the range is closed.
		s.closed = s.res.Freed()
		return errors.Wrapf(err, "%s", what())
	}
	s.closed = true
	return nil
}

// Closed reports whether the range is closed.
func (s *Sparse) Closed() bool {
	if s.unmade() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Check verifies the range's invariants, its page table against them and
// the page table against the driver, and returns every violation.
func (s *Sparse) Check() error {
	if s.unmade() {
		return unmade("Sparse.Check", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := s.checkLocked()
	if !s.closed && !s.unmapped {
		errs = errors.CombineErrors(errs, s.tab.Check())
	}
	return errs
}

// checkLocked checks everything but the driver: the slots, the counts, the
// views and the page table's mappings and access.
func (s *Sparse) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if s.closed {
		if s.slots.Len() > 0 || s.owned > 0 || s.borrowed > 0 {
			fail("arena: a closed range keeps %d chunks", s.slots.Len())
		}
		return errs
	}
	if err := s.slots.Check(); err != nil {
		errs = errors.CombineErrors(errs, err)
	}
	cs := s.opts.ChunkSize
	var owned, borrowed uint64
	views, readViews := map[uint64]int{}, map[uint64]int{}
	for v := range s.views {
		lo, hi := s.slots.Overlapping(v.off, v.off+v.n)
		for i := lo; i < hi; i++ {
			views[s.slots.At(i).Start]++
			if v.readOnly {
				readViews[s.slots.At(i).Start]++
			}
		}
		if len(s.holesLocked(v.off, v.off+v.n)) > 0 {
			fail("arena: view [%#x, +%d) covers memory that is not committed", v.off, v.n)
		}
	}
	maps := map[driver.Addr]*physical.Chunk{}
	for m := range s.tab.Mappings() {
		maps[m.Range.Base] = m.Chunk
	}
	for _, it := range s.slots.All() {
		sl := it.Val
		if it.Start%cs != 0 || it.Size()%cs != 0 || it.End > s.opts.Max {
			fail("arena: chunk [%#x, %#x) is not whole chunks of %d inside the range", it.Start, it.End, cs)
		}
		if sl.c.Size() != it.Size() {
			fail("arena: chunk [%#x, %#x) holds %s of another size", it.Start, it.End, sl.c)
		}
		if sl.lender == nil {
			owned += it.Size()
			if sl.c.Memory() != s.mem || sl.c.Released() {
				fail("arena: owned %s at %#x is released or of another memory", sl.c, it.Start)
			}
		} else {
			borrowed += it.Size()
			if sl.borrowers.Load() > 0 {
				fail("arena: borrowed %s at %#x is lent on", sl.c, it.Start)
			}
		}
		if sl.views != views[it.Start] || sl.readViews != readViews[it.Start] {
			fail("arena: chunk at %#x counts %d views (%d read-only), %d (%d) cover it",
				it.Start, sl.views, sl.readViews, views[it.Start], readViews[it.Start])
		}
		at := s.Base() + driver.Addr(it.Start)
		if maps[at] != sl.c {
			fail("arena: chunk at %#x is %s, the page table maps %v there", it.Start, sl.c, maps[at])
			continue
		}
		delete(maps, at)
		e, err := s.tab.Lookup(at)
		if err != nil || !slices.Equal(e.Access, sl.access) {
			fail("arena: chunk at %#x grants %v, the page table %v (%v)", it.Start, sl.access, e.Access, err)
		}
	}
	if len(maps) > 0 {
		fail("arena: the page table maps %d chunk(s) the range does not list", len(maps))
	}
	if owned != s.owned || borrowed != s.borrowed {
		fail("arena: chunks hold %d owned and %d borrowed bytes, the counts say %d and %d", owned, borrowed, s.owned, s.borrowed)
	}
	if s.owned > s.stats.PeakCommitted {
		fail("arena: committed %d above its peak %d", s.owned, s.stats.PeakCommitted)
	}
	return errs
}
