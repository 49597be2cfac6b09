// Package arena owns growable memory that never moves: an Arena reserves
// its maximum size of address space up front and commits physical chunks at
// its end on demand, so it grows and shrinks in place — its base address is
// fixed for its whole life, and growing costs the new chunk, not the arena.
// An Allocator serves Alloc/Free inside an arena (see allocator.go).
//
// Invariants of an Arena (checked by Check):
//   - chunks are mapped back to back from the base: chunk i covers
//     [off_i, off_i+size_i) with off_0 = 0 and off_{i+1} = off_i+size_i;
//     committed is the end of the last one;
//   - Len <= committed <= Max, and every byte of [Base, Base+Len) is mapped
//     and read-write for every device in Options.Access;
//   - every live View lies inside [0, Len): Shrink refuses to cut one, so
//     no view can ever reach an unmapped byte.
//
// It never touches memory itself and never maps outside its own
// reservation; memory reaches the caller only as views the arena tracks.
package arena

import (
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Options configure an arena.
type Options struct {
	// Device is the device whose memory backs the arena.
	Device driver.DeviceID
	// Max is the most the arena can grow to: the address space reserved up
	// front. It is rounded up to the driver's granularity.
	Max uint64
	// ChunkSize is the unit memory is committed in (default: the device's
	// recommended granularity); a multiple of its minimum granularity.
	ChunkSize uint64
	// MaxChunk is the largest chunk one Grow creates (default 512 ×
	// ChunkSize, 1 GiB at 2 MiB). A grow needing more maps several chunks.
	MaxChunk uint64
	// Access lists the devices given read-write access to the arena's
	// memory (default: Device alone).
	Access []driver.DeviceID

	// shareable makes every chunk shareable (pools created shareable).
	shareable bool
}

// chunkAt is one committed chunk, mapped at Base+off.
type chunkAt struct {
	off uint64
	c   *physical.Chunk
}

func (c chunkAt) end() uint64 { return c.off + c.c.Size() }

// Arena is growable memory with a fixed base. Safe for concurrent use.
type Arena struct {
	mem  *physical.Memory
	drv  driver.Driver
	res  *vaspace.Reservation
	tab  *mapping.Table
	opts Options

	mu        sync.Mutex
	access    map[driver.DeviceID]driver.Access // granted on every chunk
	chunks    []chunkAt
	committed uint64
	length    uint64
	stats     Stats
	views     map[*View]struct{}
	closed    bool
}

// Stats describe an arena.
type Stats struct {
	Len, Committed, Max uint64
	// PeakCommitted is the most the arena has had committed at once.
	PeakCommitted uint64
	// Chunks is the number of chunks committed now.
	Chunks int
	// MapCalls and UnmapCalls count the chunk mappings made and removed.
	MapCalls, UnmapCalls int
	// Views is the number of live views.
	Views int
}

// New reserves opts.Max of address space for an arena on opts.Device. No
// memory is committed until it grows.
func New(space *vaspace.Space, mem *physical.Memory, opts Options) (*Arena, error) {
	drv := space.Driver()
	if mem.Driver() != drv {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: the address space and the physical memory are on different drivers")
	}
	devs := drv.Devices()
	what := func() string {
		return fmt.Sprintf("arena: new arena of %s on device %d", units.Bytes(opts.Max), opts.Device)
	}
	if err := driver.CheckDevice(what, opts.Device, len(devs)); err != nil {
		return nil, err
	}
	dev := devs[opts.Device]
	if opts.ChunkSize == 0 {
		opts.ChunkSize = dev.RecommendedGranularity
	}
	if err := driver.CheckSize(what, opts.ChunkSize, dev.MinGranularity); err != nil {
		return nil, errors.Wrap(err, "arena: chunk size")
	}
	if opts.MaxChunk == 0 {
		opts.MaxChunk = 512 * opts.ChunkSize
	}
	if opts.MaxChunk%opts.ChunkSize != 0 {
		return nil, errors.Wrapf(driver.ErrMisaligned, "%s: MaxChunk %s is not a multiple of the chunk size %s",
			what(), units.Bytes(opts.MaxChunk), units.Bytes(opts.ChunkSize))
	}
	if opts.Max == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: Max is zero", what())
	}
	if len(opts.Access) == 0 {
		opts.Access = []driver.DeviceID{opts.Device}
	}
	for _, d := range opts.Access {
		if err := driver.CheckDevice(what, d, len(devs)); err != nil {
			return nil, err
		}
	}
	g := drv.Granularity()
	size := (opts.Max + g - 1) / g * g
	if size < opts.Max {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: Max overflows", what())
	}
	res, err := space.Reserve(size, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), res.Free())
	}
	opts.Max = size
	access := map[driver.DeviceID]driver.Access{}
	for _, d := range opts.Access {
		access[d] = driver.AccessReadWrite
	}
	return &Arena{mem: mem, drv: drv, res: res, tab: tab, opts: opts, views: map[*View]struct{}{},
		access: access, stats: Stats{Max: size}}, nil
}

// Base is the arena's first address; it never changes.
func (a *Arena) Base() driver.Addr { return a.res.Base() }

// Max is the most the arena can grow to.
func (a *Arena) Max() uint64 { return a.opts.Max }

// ChunkSize is the unit memory is committed in.
func (a *Arena) ChunkSize() uint64 { return a.opts.ChunkSize }

// Device is the device whose memory backs the arena.
func (a *Arena) Device() driver.DeviceID { return a.opts.Device }

// Len is the arena's length: [Base, Base+Len) is usable.
func (a *Arena) Len() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.length
}

// Committed is how many bytes of chunks back the arena (Len rounded up to
// whole chunks, plus any not yet trimmed).
func (a *Arena) Committed() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.committed
}

// Stats returns the arena's figures.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Len, s.Committed, s.Chunks, s.Views = a.length, a.committed, len(a.chunks), len(a.views)
	return s
}

func (a *Arena) errClosed(op string) error {
	return driver.Closed("arena: " + op + " on a closed arena")
}

// Grow lengthens the arena by n bytes, committing and mapping chunks at its
// end when Len passes what is committed. It costs the chunks it maps, not
// the arena's size. If a chunk cannot be committed, the chunks this call
// mapped are unmapped and released again: the arena is as it was, and the
// error says how much was asked and how much the device had.
func (a *Arena) Grow(n uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("grow")
	}
	return a.growLocked(n)
}

func (a *Arena) growLocked(n uint64) error {
	what := func() string {
		return fmt.Sprintf("arena: grow by %s from %s (committed %s, max %s)",
			units.Bytes(n), units.Bytes(a.length), units.Bytes(a.committed), units.Bytes(a.opts.Max))
	}
	if n == 0 {
		return nil
	}
	newLen := a.length + n
	if newLen < a.length || newLen > a.opts.Max {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: past the arena's maximum", what()),
			"create the arena with a larger Max: address space is cheap")
	}
	if newLen > a.committed {
		cs := a.opts.ChunkSize
		need := (newLen - a.committed + cs - 1) / cs * cs
		if err := a.commitLocked(need, what); err != nil {
			return err
		}
	}
	a.length = newLen
	return nil
}

// commitLocked maps need more bytes of chunks at the end, all or nothing.
func (a *Arena) commitLocked(need uint64, what func() string) error {
	// Refuse up front what the device cannot hold, mapping nothing; the
	// rollback below covers memory taken by others meanwhile.
	if u, err := a.mem.Usage(a.opts.Device); err == nil && need > u.Capacity-u.Used {
		return errors.WithHintf(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: needed %s more committed, device %d had %s free",
				what(), units.Bytes(need), a.opts.Device, units.Bytes(u.Capacity-u.Used)),
			"trim or free memory on device %d, or grow less", a.opts.Device)
	}
	start := len(a.chunks)
	startCommitted := a.committed
	for need > 0 {
		size := min(need, a.opts.MaxChunk)
		if err := a.mapChunkLocked(size); err != nil {
			asked := need + a.committed - startCommitted
			rerr := a.unmapFromLocked(start)
			if rerr != nil {
				rerr = errors.WithAssertionFailure(errors.Wrap(rerr, "arena: rolling back a failed grow"))
			}
			free := "unknown"
			if u, uerr := a.mem.Usage(a.opts.Device); uerr == nil {
				free = units.Bytes(u.Capacity - u.Used)
			}
			return errors.CombineErrors(errors.Wrapf(err, "%s: needed %s more committed, device %d had %s free",
				what(), units.Bytes(asked), a.opts.Device, free), rerr)
		}
		need -= size
	}
	a.stats.PeakCommitted = max(a.stats.PeakCommitted, a.committed)
	return nil
}

// mapChunkLocked creates a chunk of size bytes, maps it at the end of what
// is committed and grants access; on failure nothing is left behind.
func (a *Arena) mapChunkLocked(size uint64) error {
	c, err := a.mem.Create(a.opts.Device, size, driver.ChunkOptions{Shareable: a.opts.shareable})
	if err != nil {
		return err
	}
	at := a.Base() + driver.Addr(a.committed)
	if err := a.tab.Map(at, c); err != nil {
		return errors.CombineErrors(err, c.Release())
	}
	a.stats.MapCalls++
	for d, acc := range a.access {
		if err := a.tab.SetAccess(at, size, d, acc); err != nil {
			uerr := a.tab.Unmap(at)
			a.stats.UnmapCalls++
			return errors.CombineErrors(err, errors.CombineErrors(uerr, c.Release()))
		}
	}
	// The arena keeps the handle (the allocator's stitching maps the chunk
	// a second time) and releases it when it unmaps the chunk.
	a.chunks = append(a.chunks, chunkAt{off: a.committed, c: c})
	a.committed += size
	return nil
}

// unmapFromLocked unmaps chunks[i:], last first.
func (a *Arena) unmapFromLocked(i int) error {
	for j := len(a.chunks) - 1; j >= i; j-- {
		ch := a.chunks[j]
		if err := a.tab.Unmap(a.Base() + driver.Addr(ch.off)); err != nil {
			return err
		}
		a.stats.UnmapCalls++
		if err := ch.c.Release(); err != nil {
			return err
		}
		a.chunks = a.chunks[:j]
		a.committed = ch.off
	}
	return nil
}

// SetAccess sets what dev may do with the arena's memory, on every chunk
// committed now and every chunk committed later. If a chunk refuses, the
// chunks already changed are set back and nothing changes.
func (a *Arena) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("set access")
	}
	if err := driver.CheckDevice(func() string { return "arena: set access" }, dev, len(a.drv.Devices())); err != nil {
		return err
	}
	if err := driver.CheckAccess(func() string { return "arena: set access" }, acc); err != nil {
		return err
	}
	old := a.access[dev]
	for i, ch := range a.chunks {
		if err := a.tab.SetAccess(a.Base()+driver.Addr(ch.off), ch.c.Size(), dev, acc); err != nil {
			for _, back := range a.chunks[:i] {
				err = errors.CombineErrors(err, a.tab.SetAccess(a.Base()+driver.Addr(back.off), back.c.Size(), dev, old))
			}
			return errors.Wrap(err, "arena: set access")
		}
	}
	if acc == driver.AccessNone {
		delete(a.access, dev)
	} else {
		a.access[dev] = acc
	}
	return nil
}

// Access reports what dev may do with the arena's memory.
func (a *Arena) Access(dev driver.DeviceID) driver.Access {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.access[dev]
}

// ChunkAt is one chunk of an arena and where it is mapped.
type ChunkAt struct {
	Offset uint64
	Chunk  *physical.Chunk
}

// Chunks lists the arena's chunks in address order (for exporting them).
func (a *Arena) Chunks() []ChunkAt {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]ChunkAt, len(a.chunks))
	for i, c := range a.chunks {
		out[i] = ChunkAt{Offset: c.off, Chunk: c.c}
	}
	return out
}

// Shrink shortens the arena by n bytes. The chunks stay committed (a later
// Grow reuses them) until Trim. It refuses, changing nothing, when a live
// view reaches past the new end.
func (a *Arena) Shrink(n uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("shrink")
	}
	return a.shrinkLocked(n)
}

func (a *Arena) shrinkLocked(n uint64) error {
	if n > a.length {
		return errors.Wrapf(driver.ErrInvalid, "arena: shrink by %s: the arena is only %s long", units.Bytes(n), units.Bytes(a.length))
	}
	newLen := a.length - n
	for v := range a.views {
		if v.off+v.n > newLen {
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "arena: shrink to %s: the live view [%#x, +%s) reaches past it",
					units.Bytes(newLen), v.off, units.Bytes(v.n)),
				"release the views of the memory being given up first")
		}
	}
	a.length = newLen
	return nil
}

// Resize grows or shrinks the arena to n bytes.
func (a *Arena) Resize(n uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("resize")
	}
	if n >= a.length {
		return a.growLocked(n - a.length)
	}
	return a.shrinkLocked(a.length - n)
}

// Trim unmaps the chunks lying wholly past Len and returns their memory to
// the device. A chunk that Len reaches into stays whole.
func (a *Arena) Trim() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("trim")
	}
	i := len(a.chunks)
	for i > 0 && a.chunks[i-1].off >= a.length {
		i--
	}
	return a.unmapFromLocked(i)
}

// Append grows the arena by n bytes starting at the next multiple of align
// (0 or 1: no padding; otherwise a power of two) and returns a live view of
// them, in one step: a caller growing the arena at the same time cannot end
// up with the same bytes. On failure nothing changes.
func (a *Arena) Append(n, align uint64) (*View, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, a.errClosed("append")
	}
	if n == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: append of zero bytes")
	}
	if err := driver.CheckAlign(func() string { return "arena: append" }, align); err != nil {
		return nil, err
	}
	off := a.length
	if align > 1 {
		off = alignUp(a.length, align)
	}
	if off < a.length || off+n < off {
		return nil, errors.Wrapf(driver.ErrOutOfMemory, "arena: append of %s: past the arena's maximum", units.Bytes(n))
	}
	if err := a.growLocked(off - a.length + n); err != nil {
		return nil, err
	}
	v := &View{a: a, off: off, n: n}
	a.views[v] = struct{}{}
	return v, nil
}

// HostAddressable reports whether views of the arena can give bytes
// (View.Bytes): the driver's memory is addressable from this process.
func (a *Arena) HostAddressable() bool {
	_, ok := a.drv.(driver.HostMapper)
	return ok
}

// View is a tracked window [Base+off, Base+off+n) of an arena. While it is
// live the arena cannot shrink under it, so its bytes stay mapped.
type View struct {
	a      *Arena
	off, n uint64
	bytes  []byte
}

// View returns a live view of [off, off+n), which must lie inside Len.
func (a *Arena) View(off, n uint64) (*View, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, a.errClosed("view")
	}
	if n == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: view of zero bytes")
	}
	if off+n < off || off+n > a.length {
		return nil, errors.Wrapf(driver.ErrNotMapped, "arena: view [%#x, +%s): the arena is %s long",
			off, units.Bytes(n), units.Bytes(a.length))
	}
	v := &View{a: a, off: off, n: n}
	a.views[v] = struct{}{}
	return v, nil
}

// Addr is the view's first address.
func (v *View) Addr() driver.Addr { return v.a.Base() + driver.Addr(v.off) }

// Offset is the view's offset in its arena.
func (v *View) Offset() uint64 { return v.off }

// Len is the view's length in bytes.
func (v *View) Len() uint64 { return v.n }

// Bytes returns the view's memory as a slice, on drivers whose memory the
// process addresses (driver.HostMapper); others return ErrUnsupported. The
// slice is valid until Release.
func (v *View) Bytes() ([]byte, error) {
	v.a.mu.Lock()
	defer v.a.mu.Unlock()
	if _, live := v.a.views[v]; !live {
		return nil, driver.Closed("arena: bytes of a released view")
	}
	if v.bytes == nil {
		hm, ok := v.a.drv.(driver.HostMapper)
		if !ok {
			return nil, errors.Wrapf(driver.ErrUnsupported, "arena: bytes of a view: the %s driver's memory is not addressable from the host", v.a.drv.Name())
		}
		b, err := hm.HostBytes(v.Addr(), v.n)
		if err != nil {
			return nil, errors.Wrap(err, "arena: bytes of a view")
		}
		v.bytes = b
	}
	return v.bytes, nil
}

// Release ends the view. Releasing twice is ErrClosed.
func (v *View) Release() error {
	v.a.mu.Lock()
	defer v.a.mu.Unlock()
	if _, live := v.a.views[v]; !live {
		return driver.Closed("arena: release of a released view")
	}
	delete(v.a.views, v)
	v.bytes = nil
	return nil
}

// Close unmaps every chunk and frees the reservation. It refuses while
// views are live.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("close")
	}
	if len(a.views) > 0 {
		return errors.Wrapf(driver.ErrBusy, "arena: close: %d view(s) still live", len(a.views))
	}
	if err := a.unmapFromLocked(0); err != nil {
		return err
	}
	a.length = 0
	if err := a.tab.Close(); err != nil {
		return err
	}
	if err := a.res.Free(); err != nil {
		return err
	}
	a.closed = true
	return nil
}

// Check verifies the arena's invariants and its page table.
func (a *Arena) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var at uint64
	for i, ch := range a.chunks {
		if ch.off != at {
			fail("arena: chunk %d at %#x, expected %#x", i, ch.off, at)
		}
		at = ch.end()
	}
	if at != a.committed {
		fail("arena: chunks end at %#x, committed is %#x", at, a.committed)
	}
	if a.length > a.committed || a.committed > a.opts.Max {
		fail("arena: len %d, committed %d, max %d out of order", a.length, a.committed, a.opts.Max)
	}
	for v := range a.views {
		if v.off+v.n > a.length {
			fail("arena: view [%#x, +%d) past len %d", v.off, v.n, a.length)
		}
	}
	var maps []mapping.Mapping
	for m := range a.tab.Mappings() {
		maps = append(maps, m)
	}
	if len(maps) != len(a.chunks) || !slices.EqualFunc(maps, a.chunks, func(m mapping.Mapping, c chunkAt) bool {
		return m.Chunk == c.c && m.Range.Base == a.Base()+driver.Addr(c.off)
	}) {
		fail("arena: %d chunks recorded, the page table has %d mappings that differ", len(a.chunks), len(maps))
	}
	if !a.closed {
		errs = errors.CombineErrors(errs, a.tab.Check())
	}
	return errs
}
