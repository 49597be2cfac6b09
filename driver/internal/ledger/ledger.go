// Package ledger is the driver-side record every vmarena backend keeps: the
// live reservations, chunks and mappings and the access each device has to
// each mapped granule. It checks every call against the rules in the driver
// package doc before the backend makes a system call, and records the result
// only after the call succeeded, so a failed call changes nothing.
//
// A Ledger implements all of driver.Driver except Name, Supports, Read and
// Write; a backend (driver/host, driver/sim) supplies the system calls
// through the Backend interface and adds those four methods. A driver keeps
// its Ledger in an unexported field and declares each method of the
// contract itself: the helpers exported here (WithRange, WithDeviceRanges,
// Busy, the callback forms of Export and Import) are for the drivers, and a
// caller that reached them could change the record behind the driver's back.
//
// Each mapping's access is kept run-length (internal/runs): granting,
// checking and walking a range cost the runs of equal access it crosses,
// never its granules, so a 1 GiB mapping granted whole is as cheap to
// record as a 2 MiB one.
//
// Chunks are kept by handle in a dense table of slots (handles.go), not a
// map: a handle is a slot's index plus one and the slot's generation, the
// next create takes the slot the last release emptied at the next
// generation, and so no handle is issued twice — a released or never
// issued handle is refused with ErrBadHandle — while the books a create,
// a map and a release touch stay the ones the last touched, at a million
// chunks as at ten. Handles count up 1, 2, 3… until a slot is reused.
//
// The ledger never touches memory and never makes a system call itself.
// Backend methods run with the ledger's lock held, so they see and leave a
// consistent record; they must not call back into the ledger.
package ledger

import (
	"fmt"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/runs"
	"github.com/vmarena/vmarena/internal/units"
)

// Backend makes the system calls behind the ledger's record. Each method
// either succeeds completely or fails having changed nothing.
type Backend interface {
	// Reserve returns size bytes of fresh address space aligned to align
	// (a power of two at least the driver granularity), at hint if it can,
	// and the backend's own record of it, kept in Region.Backing.
	Reserve(size, align uint64, hint driver.Addr) (driver.Addr, any, error)
	// Unreserve returns a range Reserve gave; nothing inside is mapped.
	Unreserve(r *Region) error
	// Commit provides c's memory and may set c.Backing.
	Commit(c *Chunk) error
	// Free returns c's memory: c is released and has no mappings left.
	Free(c *Chunk) error
	// Map places m.Chunk at m.Addr, inaccessible.
	Map(m *Mapping) error
	// Unmap returns [m.Addr, m.Addr+m.Size) to the reserved state.
	Unmap(m *Mapping) error
	// Close frees the backend's own resources; the ledger has already
	// unmapped, freed and unreserved everything.
	Close() error
}

// A backend also implements exactly one of Protector and DeviceProtector:
// how access reaches the hardware.

// Protector is a backend whose memory has one protection for every device
// (the host's page tables): the ledger keeps each device's access itself
// and asks the backend for the widest one any device has.
type Protector interface {
	// Protect changes the widest access any device has over
	// [addr, addr+size), inside r, from `from` to `to`; the range is
	// mapped throughout and from != to.
	Protect(r *Region, addr driver.Addr, size uint64, from, to driver.Access) error
}

// DeviceProtector is a backend whose hardware keeps each device's access
// itself (CUDA's cuMemSetAccess, AscendCL's aclrtMemSetAccess).
type DeviceProtector interface {
	// SetDeviceAccess changes what dev may do over [addr, addr+size),
	// which lies inside one mapping of r — or, when the backend is a
	// SpanningProtector that says so, over adjacent mappings — from `from`
	// to `to` (from != to).
	SetDeviceAccess(r *Region, addr driver.Addr, size uint64, dev driver.DeviceID, from, to driver.Access) error
}

// SpanningProtector is a DeviceProtector that may say its hardware call
// takes a range over several adjacent mappings (cuMemSetAccess does, as
// PyTorch's expandable segments use it; aclrtMemSetAccess takes exactly one
// mapping, see WholeMappingProtector): the ledger then makes one call a run of equal access across
// mappings, not one a mapping — a commit of many chunks is granted in one
// call. A backend may be both spanning and whole-mapping (cuMemSetAccess
// takes adjacent mappings, but only whole ones): each call then covers a
// run of adjacent whole mappings whose access changes alike.
type SpanningProtector interface {
	SpansMappings() bool
}

// WholeMappingProtector is a DeviceProtector that may say its hardware
// call takes exactly one whole mapping (aclrtMemSetAccess: the virPtr and
// size aclrtMapMem was given, never a piece of a mapping). The record
// still keeps each device's access per granule, and every read, write and
// copy the drivers make is checked against it; the hardware of each
// mapping gets, per device, the widest access the device has anywhere in
// the mapping (one call a mapping whose widest access changes).
type WholeMappingProtector interface {
	WholeMappings() bool
}

// OneBinder is a backend that may say its hardware binds one reservation
// to the memory of one device, and to local or imported memory, never
// both at once (AscendCL's aclrtMapMem): the ledger then refuses, with
// ErrUnsupported, a Map that would mix them, before the backend sees it.
type OneBinder interface {
	BindsOneDevice() bool
}

// Chunk is a physical chunk as the ledger records it.
type Chunk struct {
	Handle driver.Handle
	Device driver.DeviceID
	Size   uint64
	Opts   driver.ChunkOptions
	// Backing is the backend's own record (heap offset, file descriptor).
	Backing any

	released bool // the handle was released; memory waits for maps == 0
	maps     int  // live mappings of this chunk
	exported bool // exported once already (one shareable handle per chunk)
	imported bool // made from another process's shareable handle
}

// Mapping is one chunk mapped whole at Addr, inside Region.
type Mapping struct {
	Addr   driver.Addr
	Size   uint64
	Chunk  *Chunk
	Region *Region
	// gran is the granule of access: the chunk's device MinGranularity.
	gran uint64
	// access holds, per granule, 2 bits per device (device d at bits 2d
	// and 2d+1) with the driver.Access value that device has, run-length.
	access runs.List[uint64]
}

func (m *Mapping) end() driver.Addr { return m.Addr + driver.Addr(m.Size) }

// Region is one live range Reserve gave. Invariant: maps is sorted by
// Addr, its mappings lie inside [Base, Base+Size) and do not overlap.
type Region struct {
	Base driver.Addr
	Size uint64
	// Backing is the backend's own record (the base as a pointer).
	Backing any
	maps    ranges.List[driver.Addr, *Mapping] // by address
}

func (r *Region) end() driver.Addr { return r.Base + driver.Addr(r.Size) }

// Ledger is the record. Invariants (checked by Check): reservations is
// sorted by base and its ranges do not overlap; every chunk in chunks is
// either unreleased or released with maps > 0; chunk.maps equals the number
// of mappings of it; used[d] is the sum of sizes of the chunks of device d
// still in chunks.
type Ledger struct {
	name    string
	backend Backend
	// Exactly one of protect and perDevice is set: the backend's way of
	// putting access into the hardware.
	protect   Protector
	perDevice DeviceProtector
	spans     bool // perDevice calls may span adjacent mappings
	whole     bool // perDevice calls take exactly one whole mapping
	oneBind   bool // a reservation binds one device's memory, local or imported
	devs      []driver.Device
	gran      uint64
	share     bool

	mu           lockrank.RWMutex[lockrank.Ledger]
	closed       bool
	reservations ranges.List[driver.Addr, *Region]
	chunks       handles // by handle
	used         []uint64
}

// New returns a ledger for devices, with calls made through b. name prefixes
// every error message. shareable says whether the backend honours
// ChunkOptions.Shareable.
func New(name string, devs []driver.Device, b Backend, shareable bool) (*Ledger, error) {
	if len(devs) == 0 || len(devs) > driver.MaxDevices {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %d devices (1 to %d are supported)", name, len(devs), driver.MaxDevices)
	}
	l := &Ledger{
		name: name, backend: b, devs: append([]driver.Device(nil), devs...), share: shareable,
		used: make([]uint64, len(devs)),
	}
	l.protect, _ = b.(Protector)
	l.perDevice, _ = b.(DeviceProtector)
	if sp, ok := b.(SpanningProtector); ok && l.perDevice != nil {
		l.spans = sp.SpansMappings()
	}
	if wp, ok := b.(WholeMappingProtector); ok && l.perDevice != nil {
		l.whole = wp.WholeMappings()
	}
	if ob, ok := b.(OneBinder); ok {
		l.oneBind = ob.BindsOneDevice()
	}
	if (l.protect == nil) == (l.perDevice == nil) {
		return nil, errors.AssertionFailedf("%s: the backend %T must implement exactly one of ledger.Protector and ledger.DeviceProtector", name, b)
	}
	for i, d := range devs {
		g := d.MinGranularity
		if d.ID != driver.DeviceID(i) || g == 0 || g&(g-1) != 0 || d.RecommendedGranularity%g != 0 || d.RecommendedGranularity == 0 {
			return nil, errors.AssertionFailedf("%s: device %d is malformed: %+v", name, i, d)
		}
		l.gran = max(l.gran, g)
	}
	return l, nil
}

// Devices implements driver.Driver.
func (l *Ledger) Devices() []driver.Device { return append([]driver.Device(nil), l.devs...) }

// Granularity implements driver.Driver.
func (l *Ledger) Granularity() uint64 { return l.gran }

// Used reports the bytes committed on dev: chunks not yet returned.
func (l *Ledger) Used(dev driver.DeviceID) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if dev < 0 || int(dev) >= len(l.used) {
		return 0
	}
	return l.used[dev]
}

func (l *Ledger) errClosed(op string) error { return driver.Closed(fmt.Sprintf("%s: %s", l.name, op)) }

// Reserve implements driver.Driver.
func (l *Ledger) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	what := func() string { return fmt.Sprintf("%s: reserve %s", l.name, units.Bytes(size)) }
	if err := driver.CheckSize(what, size, l.gran); err != nil {
		return 0, err
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return 0, err
	}
	if err := driver.CheckAddr(func() string { return what() + " at hint" }, hint, l.gran); err != nil {
		return 0, err
	}
	align = max(align, l.gran)
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("reserve")
	if l.closed {
		return 0, l.errClosed("reserve")
	}
	base, backing, err := l.backend.Reserve(size, align, hint)
	if err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	r := &Region{Base: base, Size: size, Backing: backing}
	if uint64(base)%align != 0 {
		_ = l.backend.Unreserve(r)
		return 0, errors.AssertionFailedf("%s: backend returned [%s, %s), misaligned", what(), base, r.end())
	}
	if _, ok := l.reservations.Insert(base, r.end(), r); !ok {
		_ = l.backend.Unreserve(r)
		return 0, errors.AssertionFailedf("%s: backend returned [%s, %s), overlapping a live reservation", what(), base, r.end())
	}
	return base, nil
}

// Unreserve implements driver.Driver.
func (l *Ledger) Unreserve(base driver.Addr, size uint64) error {
	what := func() string { return fmt.Sprintf("%s: unreserve [%s, +%s)", l.name, base, units.Bytes(size)) }
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("unreserve")
	if l.closed {
		return l.errClosed("unreserve")
	}
	i, r := l.findReservation(base)
	if r == nil || r.Base != base {
		return errors.Wrapf(driver.ErrNotReserved, "%s: no reservation starts there", what())
	}
	if r.Size != size {
		return errors.Wrapf(driver.ErrNotReserved, "%s: the reservation there is %s, and unreserve takes it whole", what(), units.Bytes(r.Size))
	}
	if r.maps.Len() > 0 {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: %d mapping(s) still inside: %s", what(), r.maps.Len(), describeMaps(r)),
			"unmap everything inside a reservation before unreserving it")
	}
	if err := l.backend.Unreserve(r); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	l.reservations.Delete(i, i+1)
	return nil
}

func describeMaps(r *Region) string {
	var b strings.Builder
	for i, it := range r.maps.All() {
		m := it.Val
		if i == 4 {
			fmt.Fprintf(&b, ", and %d more", r.maps.Len()-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%s, %s) chunk %d", m.Addr, m.end(), m.Chunk.Handle)
	}
	return b.String()
}

// Create implements driver.Driver.
func (l *Ledger) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	what := func() string { return fmt.Sprintf("%s: create %s on device %d", l.name, units.Bytes(size), dev) }
	if err := driver.CheckDevice(what, dev, len(l.devs)); err != nil {
		return 0, err
	}
	d := l.devs[dev]
	if err := driver.CheckSize(what, size, d.MinGranularity); err != nil {
		return 0, err
	}
	if opts.Shareable && !l.share {
		return 0, errors.Wrapf(driver.ErrUnsupported, "%s: shareable chunks", what())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("create")
	if l.closed {
		return 0, l.errClosed("create")
	}
	if free := d.Capacity - l.used[dev]; size > free {
		return 0, errors.WithHintf(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: asked %s, device has %s free of %s",
				what(), units.Bytes(size), units.Bytes(free), units.Bytes(d.Capacity)),
			"release chunks on device %d, or create on another device", dev)
	}
	c := &Chunk{Handle: l.chunks.next(), Device: dev, Size: size, Opts: opts}
	if err := l.backend.Commit(c); err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	l.chunks.add(c)
	l.used[dev] += size
	return c.Handle, nil
}

// Export runs make, which produces the shareable handle of chunk h, once
// per chunk: a second export is ErrBusy, and a failed one can be retried.
func (l *Ledger) Export(h driver.Handle, make func(c *Chunk) (driver.Shareable, error)) (driver.Shareable, error) {
	what := func() string { return fmt.Sprintf("%s: export chunk %d", l.name, h) }
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("export")
	if l.closed {
		return driver.Shareable{}, l.errClosed("export")
	}
	c, err := l.chunk(what, h)
	if err != nil {
		return driver.Shareable{}, err
	}
	if !c.Opts.Shareable {
		return driver.Shareable{}, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: it was created without ChunkOptions.Shareable", what()),
			"create chunks meant for other processes shareable")
	}
	if c.exported {
		return driver.Shareable{}, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: exported already (one shareable handle per chunk per process)", what()),
			"keep the first shareable handle and duplicate it, or send it again")
	}
	sh, err := make(c)
	if err != nil {
		return driver.Shareable{}, errors.Wrapf(err, "%s", what())
	}
	c.exported = true
	return sh, nil
}

// Import records a chunk of size bytes on dev whose memory another process
// created; adopt sets its Backing. It counts against the device's capacity
// like a created chunk.
func (l *Ledger) Import(dev driver.DeviceID, size uint64, adopt func(c *Chunk) error) (driver.Handle, error) {
	what := func() string { return fmt.Sprintf("%s: import %s on device %d", l.name, units.Bytes(size), dev) }
	if err := driver.CheckDevice(what, dev, len(l.devs)); err != nil {
		return 0, err
	}
	d := l.devs[dev]
	if err := driver.CheckSize(what, size, d.MinGranularity); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("import")
	if l.closed {
		return 0, l.errClosed("import")
	}
	if free := d.Capacity - l.used[dev]; size > free {
		return 0, errors.Wrapf(driver.ErrOutOfMemory, "%s: device has %s free of %s", what(), units.Bytes(free), units.Bytes(d.Capacity))
	}
	c := &Chunk{Handle: l.chunks.next(), Device: dev, Size: size, Opts: driver.ChunkOptions{Shareable: true}, imported: true}
	if err := adopt(c); err != nil {
		return 0, errors.Wrapf(err, "%s", what())
	}
	l.chunks.add(c)
	l.used[dev] += size
	return c.Handle, nil
}

// WithChunk runs fn with the live chunk h, the record locked for reading:
// for driver calls about one chunk that change nothing the record keeps
// (AscendCL's allow-list of an exported chunk).
func (l *Ledger) WithChunk(op string, h driver.Handle, fn func(c *Chunk) error) error {
	what := func() string { return fmt.Sprintf("%s: %s chunk %d", l.name, op, h) }
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return l.errClosed(op)
	}
	c, err := l.chunk(what, h)
	if err != nil {
		return err
	}
	if err := fn(c); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}

// Exported reports whether c was exported.
func (c *Chunk) Exported() bool { return c.exported }

// chunk returns the live (unreleased) chunk h.
func (l *Ledger) chunk(what func() string, h driver.Handle) (*Chunk, error) {
	c, issued := l.chunks.get(h)
	if c == nil || c.released {
		state := "unknown"
		if issued {
			state = "already released"
		}
		return nil, errors.Wrapf(driver.ErrBadHandle, "%s: handle %d is %s", what(), h, state)
	}
	return c, nil
}

// Release implements driver.Driver.
func (l *Ledger) Release(h driver.Handle) error {
	what := func() string { return fmt.Sprintf("%s: release chunk %d", l.name, h) }
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("release")
	if l.closed {
		return l.errClosed("release")
	}
	c, err := l.chunk(what, h)
	if err != nil {
		return err
	}
	if c.maps == 0 {
		if err := l.backend.Free(c); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		l.forget(c)
		return nil
	}
	c.released = true // memory goes with the last mapping
	return nil
}

func (l *Ledger) forget(c *Chunk) {
	l.chunks.remove(c)
	l.used[c.Device] -= c.Size
}

// findReservation returns the reservation containing addr and its index.
func (l *Ledger) findReservation(addr driver.Addr) (int, *Region) {
	if i, ok := l.reservations.Find(addr); ok {
		return i, l.reservations.At(i).Val
	}
	return -1, nil
}

// regionOf returns the reservation containing addr, or nil.
func (l *Ledger) regionOf(addr driver.Addr) *Region {
	if it := l.reservations.Get(addr); it != nil {
		return it.Val
	}
	return nil
}

// reservationFor returns the reservation holding all of [addr, addr+size).
func (l *Ledger) reservationFor(what func() string, addr driver.Addr, size uint64) (*Region, error) {
	r := l.regionOf(addr)
	end := addr + driver.Addr(size)
	if r == nil {
		return nil, errors.Wrapf(driver.ErrNotReserved, "%s: %s is not inside any reservation", what(), addr)
	}
	if end < addr {
		return nil, errors.Wrapf(driver.ErrNotReserved, "%s: [%s, +%d) runs past the end of the address space, and of the reservation [%s, %s)",
			what(), addr, size, r.Base, r.end())
	}
	if end > r.end() {
		return nil, errors.Wrapf(driver.ErrNotReserved, "%s: [%s, %s) runs past the end of the reservation [%s, %s)",
			what(), addr, end, r.Base, r.end())
	}
	return r, nil
}

// Map implements driver.Driver.
func (l *Ledger) Map(addr driver.Addr, h driver.Handle) error {
	what := func() string { return fmt.Sprintf("%s: map chunk %d at %s", l.name, h, addr) }
	l.mu.Lock()
	defer l.unlockAfter("map") // one defer: open-coded (two, with this many returns, are not)
	if l.closed {
		return l.errClosed("map")
	}
	c, err := l.chunk(what, h)
	if err != nil {
		return err
	}
	gran := l.devs[c.Device].MinGranularity
	if err := driver.CheckAddr(what, addr, gran); err != nil {
		return err
	}
	r, err := l.reservationFor(what, addr, c.Size)
	if err != nil {
		return err
	}
	m := &Mapping{Addr: addr, Size: c.Size, Chunk: c, Region: r, gran: gran, access: runs.New[uint64](c.Size / gran)}
	overlaps := func(o *Mapping) error {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: [%s, %s) overlaps the mapping [%s, %s) of chunk %d",
				what(), addr, m.end(), o.Addr, o.end(), o.Chunk.Handle),
			"unmap it first: map never replaces a mapping")
	}
	if l.oneBind && r.maps.Len() > 0 {
		if it := r.maps.Overlap(addr, m.end()); it != nil {
			return overlaps(it.Val) // the overlap first, as below
		}
		// Every mapping of r is of one device and one origin: the first
		// says which.
		if o := r.maps.At(0).Val.Chunk; o.Device != c.Device || o.imported != c.imported {
			origin := func(c *Chunk) string {
				if c.imported {
					return "imported"
				}
				return "local"
			}
			return errors.WithHint(
				errors.Wrapf(driver.ErrUnsupported, "%s: the reservation [%s, %s) holds %s memory of device %d, and the runtime binds a reservation to one device's memory, local or imported, never both (chunk %d is %s memory of device %d)",
					what(), r.Base, r.end(), origin(o), o.Device, h, origin(c), c.Device),
				"reserve a range for each device, and one for imported chunks")
		}
	}
	// Booked first, under the lock, and taken out again if the backend
	// refuses: one search of the books, where a check and then an add
	// would search twice. (A chunk is never empty: Create and Import
	// check its size.)
	if it, ok := r.maps.Add(addr, m.end(), m); !ok {
		if it == nil {
			return errors.AssertionFailedf("%s: chunk %d is empty", what(), h)
		}
		return overlaps(it.Val)
	}
	if err := l.backend.Map(m); err != nil {
		r.maps.DeleteStart(addr)
		return errors.Wrapf(err, "%s", what())
	}
	c.maps++
	return nil
}

// Unmap implements driver.Driver.
func (l *Ledger) Unmap(addr driver.Addr, size uint64) error {
	what := func() string { return fmt.Sprintf("%s: unmap [%s, +%s)", l.name, addr, units.Bytes(size)) }
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("unmap")
	if l.closed {
		return l.errClosed("unmap")
	}
	r := l.regionOf(addr)
	if r == nil {
		return errors.Wrapf(driver.ErrNotReserved, "%s: %s is not inside any reservation", what(), addr)
	}
	it := r.maps.Get(addr)
	if it == nil {
		return errors.Wrapf(driver.ErrNotMapped, "%s: nothing is mapped at %s", what(), addr)
	}
	m := it.Val
	if m.Addr != addr || m.Size != size {
		return errors.WithHint(
			errors.Wrapf(driver.ErrPartial, "%s: the mapping there is [%s, %s)", what(), m.Addr, m.end()),
			"unmap takes a whole mapping: its start address and its full size")
	}
	if err := l.backend.Unmap(m); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	r.maps.DeleteStart(addr)
	c := m.Chunk
	c.maps--
	if c.released && c.maps == 0 {
		if err := l.backend.Free(c); err != nil {
			// The mapping is gone; the chunk stays recorded as released
			// so Close retries returning its memory.
			return errors.Wrapf(err, "%s: unmapped, but returning the memory of released chunk %d failed", what(), c.Handle)
		}
		l.forget(c)
	}
	return nil
}

// accessOf returns dev's access in access word w.
func accessOf(w uint64, dev driver.DeviceID) driver.Access {
	return driver.Access(w >> (2 * uint(dev)) & 3)
}

func withAccess(w uint64, dev driver.DeviceID, a driver.Access) uint64 {
	shift := 2 * uint(dev)
	return w&^(3<<shift) | uint64(a)<<shift
}

// widest is the union of the access of every device in w.
func widest(w uint64) driver.Access {
	var a uint64
	for ; w != 0; w >>= 2 {
		a |= w & 3
	}
	return driver.Access(a)
}

// run is a stretch of granules whose widest access goes from `from` to `to`.
type run struct {
	addr     driver.Addr
	size     uint64
	from, to driver.Access
}

// SetAccess implements driver.Driver.
func (l *Ledger) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	what := func() string {
		return fmt.Sprintf("%s: set access of device %d over [%s, +%s) to %s", l.name, dev, addr, units.Bytes(size), a)
	}
	if err := driver.CheckDevice(what, dev, len(l.devs)); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, a); err != nil {
		return err
	}
	if size == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	l.mu.Lock()
	defer l.unlockAfter("setAccess") // one defer: open-coded (two, with this many returns, are not)
	if l.closed {
		return l.errClosed("set access")
	}
	r, err := l.reservationFor(what, addr, size)
	if err != nil {
		return err
	}
	end := addr + driver.Addr(size)
	// Collect the mappings covering [addr, end), refusing gaps.
	var msBuf [4]*Mapping
	ms := msBuf[:0]
	at := addr
	for it := range r.maps.After(addr) {
		if at >= end {
			break
		}
		m := it.Val
		if m.Addr > at {
			return errors.Wrapf(driver.ErrNotMapped, "%s: [%s, %s) is not mapped", what(), at, min(end, m.Addr))
		}
		ms = append(ms, m)
		at = m.end()
	}
	if at < end {
		return errors.Wrapf(driver.ErrNotMapped, "%s: [%s, %s) is not mapped", what(), at, end)
	}
	first, last := ms[0], ms[len(ms)-1]
	if err := driver.CheckAddr(what, addr, first.gran); err != nil {
		return err
	}
	if err := driver.CheckAddr(func() string { return what() + " (end)" }, end, last.gran); err != nil {
		return err
	}
	// Plan the new access words, and the runs of granules the hardware
	// must change: where the widest access changes (Protector), or where
	// dev's own does, one mapping at a time (DeviceProtector).
	// The work is per run of granules with one access word, never per
	// granule.
	type update struct {
		m      *Mapping
		lo, hi uint64 // granules
	}
	var upsBuf [4]update // the common case, on the stack
	var runsBuf [4]run
	ups, runs := upsBuf[:0], runsBuf[:0]
	for _, m := range ms {
		lo, hi := max(addr, m.Addr), min(end, m.end())
		glo, ghi := uint64(lo-m.Addr)/m.gran, uint64(hi-m.Addr)/m.gran
		ups = append(ups, update{m, glo, ghi})
		if l.whole {
			// One call for the whole mapping: dev's widest access over
			// it, before and after.
			var from, to driver.Access
			_ = m.access.Each(0, m.Size/m.gran, func(g0, g1, old uint64) error {
				had := accessOf(old, dev)
				from |= had
				if g0 < glo || g1 > ghi {
					to |= had // granules outside the range keep theirs
				}
				if g0 < ghi && g1 > glo {
					to |= a
				}
				return nil
			})
			// A spanning backend takes a run of adjacent whole mappings
			// with the same change in one call (cuMemSetAccess).
			if n := len(runs); n > 0 && l.spans && runs[n-1].from == from && runs[n-1].to == to &&
				runs[n-1].addr+driver.Addr(runs[n-1].size) == m.Addr {
				runs[n-1].size += m.Size
			} else {
				runs = append(runs, run{m.Addr, m.Size, from, to})
			}
			continue
		}
		first := len(runs) // a DeviceProtector's runs merge across mappings only if it spans them
		_ = m.access.Each(glo, ghi, func(g0, g1, old uint64) error {
			from, to := widest(old), widest(withAccess(old, dev, a))
			if l.perDevice != nil {
				from, to = accessOf(old, dev), a
			}
			gaddr, size := m.Addr+driver.Addr(g0*m.gran), (g1-g0)*m.gran
			if n := len(runs); n > 0 && (l.perDevice == nil || l.spans || n > first) && runs[n-1].from == from && runs[n-1].to == to &&
				runs[n-1].addr+driver.Addr(runs[n-1].size) == gaddr {
				runs[n-1].size += size
			} else {
				runs = append(runs, run{gaddr, size, from, to})
			}
			return nil
		})
	}
	apply := func(rn run, from, to driver.Access) error {
		if l.perDevice != nil {
			return l.perDevice.SetDeviceAccess(r, rn.addr, rn.size, dev, from, to)
		}
		return l.protect.Protect(r, rn.addr, rn.size, from, to)
	}
	for i, rn := range runs {
		if rn.from == rn.to {
			continue
		}
		if err := apply(rn, rn.from, rn.to); err != nil {
			// Undo the runs already changed, so the call changes nothing.
			for _, done := range runs[:i] {
				if done.from == done.to {
					continue
				}
				if uerr := apply(done, done.to, done.from); uerr != nil {
					return errors.CombineErrors(errors.Wrapf(err, "%s", what()),
						errors.AssertionFailedf("%s: undoing [%s, +%d) failed: %v", what(), done.addr, done.size, uerr))
				}
			}
			return errors.Wrapf(err, "%s", what())
		}
	}
	for _, u := range ups {
		u.m.access.Set(u.lo, u.hi, func(w uint64) uint64 { return withAccess(w, dev, a) })
	}
	return nil
}

// Access implements driver.Driver.
func (l *Ledger) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	what := func() string { return fmt.Sprintf("%s: access of device %d at %s", l.name, dev, addr) }
	if err := driver.CheckDevice(what, dev, len(l.devs)); err != nil {
		return 0, err
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, l.errClosed("access")
	}
	m, err := l.mappingAt(what, addr)
	if err != nil {
		return 0, err
	}
	return accessOf(m.access.At(uint64(addr-m.Addr)/m.gran), dev), nil
}

func (l *Ledger) mappingAt(what func() string, addr driver.Addr) (*Mapping, error) {
	r := l.regionOf(addr)
	if r == nil {
		return nil, errors.Wrapf(driver.ErrNotReserved, "%s: %s is not inside any reservation", what(), addr)
	}
	it := r.maps.Get(addr)
	if it == nil {
		return nil, errors.Wrapf(driver.ErrNotMapped, "%s: nothing is mapped at %s", what(), addr)
	}
	return it.Val, nil
}

// WithRange runs fn with the record locked for reading, after checking that
// [addr, addr+n) lies inside one reservation and, unless want is
// AccessNone, that the widest access granted over every granule in it
// allows want. While fn runs no reservation can be freed and no mapping can
// change, so the range stays the driver's own and in the state checked.
func (l *Ledger) WithRange(op string, addr driver.Addr, n uint64, want driver.Access, fn func(r *Region) error) error {
	return l.withHostRange(op, addr, n, func(r *Region, what func() string) error {
		if want != driver.AccessNone {
			err := r.walkMapped(what, addr, addr+driver.Addr(n), nil, func(m *Mapping, w uint64, at, _ driver.Addr) error {
				if a := widest(w); !a.Allows(want) {
					return errDeniedEveryDevice(what, at, a, want)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if err := fn(r); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		return nil
	})
}

// withHostRange is what WithRange and WithHostSegments share: with the
// record locked for reading and open, and n not 0, it runs fn with the
// reservation [addr, addr+n) lies inside and the description of the
// access for errors.
func (l *Ledger) withHostRange(op string, addr driver.Addr, n uint64, fn func(r *Region, what func() string) error) error {
	what := func() string { return fmt.Sprintf("%s: %s %d bytes at %s", l.name, op, n, addr) }
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return l.errClosed(op)
	}
	if n == 0 {
		return nil
	}
	r, err := l.reservationFor(what, addr, n)
	if err != nil {
		return err
	}
	return fn(r, what)
}

// Segment is a stretch of a host access (Read, Write) that one device can
// make: Dev has at least the access asked for over all of it.
type Segment struct {
	Addr driver.Addr
	N    uint64
	Dev  driver.DeviceID
}

// WithHostSegments is WithRange for backends whose memory the host reaches
// only through a device's copy engine (CUDA, AscendCL): it checks the same
// things, then runs fn with the range cut into segments, each with a
// device that has want (not AccessNone) over all of it — the lowest-numbered
// such device, so a segment ends only where that choice changes. The
// record stays locked for reading while fn runs.
func (l *Ledger) WithHostSegments(op string, addr driver.Addr, n uint64, want driver.Access, fn func(segs []Segment) error) error {
	return l.withHostRange(op, addr, n, func(r *Region, what func() string) error {
		end := addr + driver.Addr(n)
		var segs []Segment
		err := r.walkMapped(what, addr, end, nil, func(m *Mapping, w uint64, at, runEnd driver.Addr) error {
			dev := driver.DeviceID(-1)
			for d := range l.devs {
				if accessOf(w, driver.DeviceID(d)).Allows(want) {
					dev = driver.DeviceID(d)
					break
				}
			}
			if dev < 0 {
				return errDeniedEveryDevice(what, at, widest(w), want)
			}
			lo, hi := max(addr, at), min(end, runEnd)
			if k := len(segs); k > 0 && segs[k-1].Dev == dev && segs[k-1].Addr+driver.Addr(segs[k-1].N) == lo {
				segs[k-1].N += uint64(hi - lo)
			} else {
				segs = append(segs, Segment{Addr: lo, N: uint64(hi - lo), Dev: dev})
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := fn(segs); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		return nil
	})
}

// walkMapped visits [addr, end), inside r, mapping by mapping — onMapping
// (when not nil) with the first address of the range in it — and run by
// run of granules with one access word — onRun with the word and the run's
// first and end addresses, whole granules, clipped to the granules the
// range touches — stopping at the first error. A part reserved but not
// mapped is ErrAccessDenied: no device may touch it.
func (r *Region) walkMapped(what func() string, addr, end driver.Addr,
	onMapping func(m *Mapping, at driver.Addr) error, onRun func(m *Mapping, word uint64, at, runEnd driver.Addr) error) error {
	at := addr
	for it := range r.maps.After(addr) {
		if at >= end {
			break
		}
		m := it.Val
		if m.Addr > at {
			return errors.Wrapf(driver.ErrAccessDenied, "%s: %s is reserved but not mapped", what(), at)
		}
		if onMapping != nil {
			if err := onMapping(m, at); err != nil {
				return err
			}
		}
		glo := uint64(at-m.Addr) / m.gran
		ghi := min(m.access.Len(), (uint64(end-m.Addr)+m.gran-1)/m.gran) // the granules starting before end
		err := m.access.Each(glo, ghi, func(g0, g1, w uint64) error {
			return onRun(m, w, m.Addr+driver.Addr(g0*m.gran), m.Addr+driver.Addr(g1*m.gran))
		})
		if err != nil {
			return err
		}
		at = m.end()
	}
	if at < end {
		return errors.Wrapf(driver.ErrAccessDenied, "%s: %s is reserved but not mapped", what(), at)
	}
	return nil
}

// errDeniedEveryDevice is the refusal of a host access at the granule at
// addr, where the widest access any device has is a and want is needed.
func errDeniedEveryDevice(what func() string, addr driver.Addr, a, want driver.Access) error {
	return errors.Wrapf(driver.ErrAccessDenied, "%s: the granule at %s is mapped with access %s for every device, %s is needed",
		what(), addr, a, want)
}

// Want is one range a device operation touches and the access it needs.
type Want struct {
	Addr   driver.Addr
	N      uint64
	Access driver.Access
}

// WithDeviceRanges runs fn with the record locked for reading, after
// checking that every range lies inside one reservation, is mapped
// throughout, that dev has the access each needs at every granule, and
// that memory of another device is reachable (peer(owner) is true). fn
// gets each range's reservation, in order.
func (l *Ledger) WithDeviceRanges(op string, dev driver.DeviceID, peer func(owner driver.DeviceID) bool,
	wants []Want, fn func(rs []*Region) error) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return l.errClosed(op)
	}
	rs := make([]*Region, len(wants))
	for i, w := range wants {
		what := func() string { return fmt.Sprintf("%s: %s %d bytes at %s on device %d", l.name, op, w.N, w.Addr, dev) }
		r, err := l.reservationFor(what, w.Addr, w.N)
		if err != nil {
			return err
		}
		rs[i] = r
		err = r.walkMapped(what, w.Addr, w.Addr+driver.Addr(w.N),
			func(m *Mapping, at driver.Addr) error {
				if owner := m.Chunk.Device; owner != dev && !peer(owner) {
					return errors.WithHintf(
						errors.Wrapf(driver.ErrAccessDenied, "%s: %s is memory of device %d, and peer access from device %d to it is not enabled",
							what(), at, owner, dev),
						"call EnablePeerAccess(%d, %d) first", dev, owner)
				}
				return nil
			},
			func(m *Mapping, word uint64, at, _ driver.Addr) error {
				if a := accessOf(word, dev); !a.Allows(w.Access) {
					return errors.Wrapf(driver.ErrAccessDenied, "%s: device %d has %s access at %s, %s is needed",
						what(), dev, a, at, w.Access)
				}
				return nil
			})
		if err != nil {
			return err
		}
	}
	if err := fn(rs); err != nil {
		return errors.Wrapf(err, "%s: %s on device %d", l.name, op, dev)
	}
	return nil
}

// Busy returns ErrBusy naming the live mappings, if any: memory something
// may still hang from (a slice, a tensor), which closing would unmap under
// it. nil when nothing is mapped or the ledger is closed.
func (l *Ledger) Busy() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.busyLocked()
}

func (l *Ledger) busyLocked() error {
	if l.closed {
		return nil
	}
	n := 0
	var where []string
	for _, ri := range l.reservations.All() {
		if m := ri.Val.maps.Len(); m > 0 {
			n += m
			if len(where) < 4 {
				where = append(where, fmt.Sprintf("%d in [%s, %s): %s", m, ri.Val.Base, ri.Val.end(), describeMaps(ri.Val)))
			}
		}
	}
	if n == 0 {
		return nil
	}
	return errors.WithHint(
		errors.Wrapf(driver.ErrBusy, "%s: close: %d mapping(s) still live — %s", l.name, n, strings.Join(where, "; ")),
		"memory may still be in use through slices and tensors: release them and close the tables, arenas, allocators and pools that map it first")
}

// TearDown unmaps every mapping and closes l: what Close does once nothing
// is mapped, whatever is. It exists for the tests of the drivers built on
// the ledger, whose subtests may end with memory mapped; no user-facing
// call reaches it.
func TearDown(l *Ledger) error {
	l.mu.Lock()
	var errs error
	if !l.closed {
		for _, ri := range l.reservations.All() {
			r := ri.Val
			for _, mi := range r.maps.All() {
				errs = errors.CombineErrors(errs, l.backend.Unmap(mi.Val))
				mi.Val.Chunk.maps--
			}
			r.maps.Clear()
		}
	}
	l.mu.Unlock()
	if err := l.Close(); err != nil && !errors.Is(err, driver.ErrClosed) {
		errs = errors.CombineErrors(errs, err)
	}
	return errs
}

// Close implements driver.Driver. It refuses with ErrBusy, changing
// nothing, while anything is mapped (unmapping memory a slice or tensor
// still reaches would turn its next touch into a fault); otherwise it
// releases every chunk and unreserves every reservation, then closes the
// backend.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.checkAfter("close")
	if l.closed {
		return l.errClosed("close")
	}
	if err := l.busyLocked(); err != nil {
		return err
	}
	l.closed = true
	var errs error
	for _, ri := range l.reservations.All() {
		errs = errors.CombineErrors(errs, l.backend.Unreserve(ri.Val)) // nothing is mapped: busyLocked said so
	}
	l.reservations.Clear()
	for c := range l.chunks.all {
		errs = errors.CombineErrors(errs, l.backend.Free(c))
		l.forget(c)
	}
	errs = errors.CombineErrors(errs, l.backend.Close())
	if errs != nil {
		return errors.Wrapf(errs, "%s: close", l.name)
	}
	return nil
}

// Check verifies every invariant of the record and returns all violations.
func (l *Ledger) Check() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.checkLocked()
}

// unlockAfter checks the books after op (invariants builds) and unlocks:
// the check, then the unlock, even if the check panics.
func (l *Ledger) unlockAfter(op string) {
	defer l.mu.Unlock()
	l.checkAfter(op)
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (l *Ledger) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail(l.name+": "+op, l.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (l *Ledger) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	maps := map[*Chunk]int{}
	if err := l.reservations.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: reservations", l.name))
	}
	for _, ri := range l.reservations.All() {
		r := ri.Val
		if ri.Start != r.Base || ri.End != r.end() {
			fail("%s: reservation [%s, %s) listed as [%s, %s)", l.name, r.Base, r.end(), ri.Start, ri.End)
		}
		if err := r.maps.Check(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: mappings", l.name))
		}
		var bound *Chunk // the first mapping's chunk, when a reservation binds one device
		for _, mi := range r.maps.All() {
			m := mi.Val
			if l.oneBind {
				if bound == nil {
					bound = m.Chunk
				} else if bound.Device != m.Chunk.Device || bound.imported != m.Chunk.imported {
					fail("%s: reservation at %s binds chunks %d and %d, of devices %d and %d (imported: %v, %v)", l.name, r.Base,
						bound.Handle, m.Chunk.Handle, bound.Device, m.Chunk.Device, bound.imported, m.Chunk.imported)
				}
			}
			if mi.Start != m.Addr || mi.End != m.end() {
				fail("%s: mapping [%s, %s) listed as [%s, %s)", l.name, m.Addr, m.end(), mi.Start, mi.End)
			}
			if m.Addr < r.Base || m.end() > r.end() {
				fail("%s: mapping [%s, %s) outside its reservation", l.name, m.Addr, m.end())
			}
			if c, _ := l.chunks.get(m.Chunk.Handle); c != m.Chunk {
				fail("%s: mapping at %s refers to chunk %d, which is not recorded", l.name, m.Addr, m.Chunk.Handle)
			}
			if m.access.Len()*m.gran != m.Size {
				fail("%s: mapping at %s has access for %d granules of %d bytes, it is %d bytes", l.name, m.Addr, m.access.Len(), m.gran, m.Size)
			}
			if err := m.access.Check(); err != nil {
				errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: access of the mapping at %s", l.name, m.Addr))
			}
			maps[m.Chunk]++
		}
	}
	used := make([]uint64, len(l.devs))
	errs = errors.CombineErrors(errs, l.chunks.check(l.name))
	for c := range l.chunks.all {
		h := c.Handle
		if c.maps != maps[c] {
			fail("%s: chunk %d counts %d mappings, %d exist", l.name, h, c.maps, maps[c])
		}
		if c.released && c.maps == 0 {
			fail("%s: chunk %d is released and unmapped but still recorded", l.name, h)
		}
		used[c.Device] += c.Size
	}
	for d := range used {
		if used[d] != l.used[d] {
			fail("%s: device %d counts %d bytes used, chunks hold %d", l.name, d, l.used[d], used[d])
		}
		if used[d] > l.devs[d].Capacity {
			fail("%s: device %d holds %d bytes, over its capacity %d", l.name, d, used[d], l.devs[d].Capacity)
		}
	}
	return errs
}
