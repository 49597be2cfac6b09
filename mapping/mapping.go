// Package mapping is the page table of one reservation: which physical
// chunk backs which range, and what each device may do there. It is the
// library's own view of the memory states named in the driver package doc
// (reserved, mapped, accessible), kept beside the driver's and checked
// against it by Check: each granule's access, and, where the driver keeps
// a record it answers from (driver.Books: every driver of this module),
// each mapping's handle and size, each chunk not released still live in
// the driver, and no mapping in the reservation that is not the table's —
// one made through the driver, or through another table, is reported.
//
// A reservation an owner keeps (vaspace.Space.ReserveFor: an arena
// range's, an imported pool's) takes a table only from its owner
// (NewFor); New refuses it with ErrBusy naming the owner.
//
// A Table owns the mappings inside its reservation and nothing else: it
// maps only inside that reservation, holds a reference on every chunk it
// maps (so a released chunk keeps its memory until its last mapping goes),
// and attaches itself to the reservation so the reservation cannot be freed
// while anything is mapped. Every change goes through the driver first and
// is recorded only when the driver succeeded, so a failed call leaves the
// table and the driver as they were, but for one case: an unmap (Unmap,
// UnmapRange, Close) of a mapping the driver no longer has (it answers
// ErrNotMapped or ErrNotReserved: unmapped through the driver behind the
// table's back) lets the mapping and its chunk reference go all the same,
// since the driver has, and the error, which wraps the driver's, says so.
//
// Every driver call a Table makes runs under the reservation's Hold: the
// reservation cannot be freed meanwhile, so a table never reaches into a
// range the kernel (or a simulated space) has since given to someone else.
//
// Reads and writes through a Table check the named device's access first
// (the host driver can only enforce the widest access of all devices), then
// let the driver move the bytes; a fault still becomes ErrAccessDenied. A
// Table never touches memory itself.
package mapping

import (
	"fmt"
	"iter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/mapref"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/runs"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// State is the state of a granule of a reservation.
type State uint8

const (
	// Reserved: address space only; any access faults.
	Reserved State = iota
	// Mapped: a chunk backs it, no device may touch it.
	Mapped
	// Accessible: mapped, and at least one device may read it.
	Accessible
)

func (s State) String() string {
	switch s {
	case Reserved:
		return "reserved"
	case Mapped:
		return "mapped"
	case Accessible:
		return "accessible"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// entry is one mapping: a chunk mapped whole at rng.Base. access holds per
// granule (of gran bytes) what each device may do, run-length: a mapping
// whose devices got their access over all of it is one run, whatever its
// size, so nothing on the map, grant or unmap path costs per granule.
type entry struct {
	tab    *Table
	rng    vaspace.Range
	chunk  *physical.Chunk
	gran   uint64
	access runs.List[accessRow]
	ndev   int
	// gone is the driver's answer when an unmap found the mapping no
	// longer there (unmapped through the driver behind the table's back):
	// the unmap let it go (unmapOp.Do).
	gone error
}

// mapOp and unmapOp are an entry's driver map and unmap, as the mapref.Op
// that physical runs under its lock: a conversion of the entry's pointer,
// where a closure would be allocated on every map and unmap. Both run
// under the table's lock and the reservation's Hold.
type (
	mapOp   entry
	unmapOp entry
)

func (o *mapOp) Do() error {
	return o.tab.res.Hold(func() error { return o.tab.drv.Map(o.rng.Base, o.chunk.Handle()) })
}

func (o *unmapOp) Do() error {
	err := o.tab.res.Hold(func() error { return o.tab.drv.Unmap(o.rng.Base, o.rng.Size) })
	if errors.Is(err, driver.ErrNotMapped) || errors.Is(err, driver.ErrNotReserved) {
		// The driver maps nothing there any more: the books follow it.
		o.gone = err
		return nil
	}
	return err
}

// accessRow is what each device may do at a granule (index = device).
type accessRow = [driver.MaxDevices]driver.Access

// granules is the number of granules of the mapping.
func (e *entry) granules() uint64 { return e.access.Len() }

// granule is what each device may do at granule g (index = device), a
// copy.
func (e *entry) granule(g uint64) []driver.Access {
	row := e.access.At(g)
	return append([]driver.Access(nil), row[:e.ndev]...)
}

// Table is the page table of one reservation. Invariant: maps is sorted by
// address, its ranges lie inside the reservation and do not overlap, and
// each entry holds one Acquire on its chunk.
type Table struct {
	res  *vaspace.Reservation
	mem  *physical.Memory
	drv  driver.Driver
	devs []driver.Device

	mu     lockrank.RWMutex[lockrank.Mapping]
	maps   ranges.List[driver.Addr, *entry]
	closed bool
}

// New returns an empty table for res, whose chunks come from mem. Both must
// be on the same driver. A reservation an owner keeps (vaspace.Space.
// ReserveFor: an arena range's, an imported pool's) is refused with
// ErrBusy naming the owner: its mappings are the owner's table's, and a
// second table would map chunks into it that the owner cannot see.
func New(res *vaspace.Reservation, mem *physical.Memory) (*Table, error) {
	return NewFor(nil, res, mem)
}

// NewFor is New by the owner o that keeps res (nil: a reservation nobody
// keeps); another owner's reservation is ErrBusy.
func NewFor(o *vaspace.Owner, res *vaspace.Reservation, mem *physical.Memory) (*Table, error) {
	if res == nil || mem == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "mapping: new table: the reservation or the physical memory is nil")
	}
	if !res.KeptFor(o) {
		if o == nil {
			return nil, errors.WithHint(errors.Wrapf(driver.ErrBusy, "mapping: new table over %s: it is kept by %s, whose table maps it", res, res.KeptBy()),
				"reserve a range of your own (vaspace.Space.Reserve)")
		}
		keeper := res.KeptBy()
		if keeper == "" {
			keeper = "nobody"
		}
		return nil, errors.Wrapf(driver.ErrBusy, "mapping: new table over %s for %s: it is kept by %s", res, o, keeper)
	}
	drv := res.Space().Driver()
	if drv == nil || mem.Driver() == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "mapping: new table: the reservation or the physical memory has no driver (made without vaspace.Reserve or physical.New?)")
	}
	if err := driver.CheckComparable(func() string { return "mapping: new table" }, drv); err != nil {
		return nil, err
	}
	if !driver.Same(mem.Driver(), drv) {
		return nil, errors.Wrap(driver.ErrInvalid, "mapping: the reservation and the physical memory are on different drivers")
	}
	t := &Table{res: res, mem: mem, drv: drv, devs: drv.Devices()}
	if len(t.devs) == 0 || len(t.devs) > driver.MaxDevices {
		return nil, errors.Wrapf(driver.ErrInvalid, "mapping: new table: the %s driver reports %d devices (1 to %d are supported)",
			drv.Name(), len(t.devs), driver.MaxDevices)
	}
	// Attach under Hold: a reservation freed meanwhile refuses, so a table
	// is never attached to a dead range.
	if err := res.Hold(func() error { return res.Attach(t) }); err != nil {
		return nil, errors.Wrap(err, "mapping: new table")
	}
	return t, nil
}

// Reservation is the table's reservation.
func (t *Table) Reservation() *vaspace.Reservation {
	if t.unmade() {
		return nil
	}
	return t.res
}

// Occupied implements vaspace.Occupant: every live mapping.
func (t *Table) Occupied() []vaspace.Use {
	if t.unmade() {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	uses := make([]vaspace.Use, t.maps.Len())
	for i, it := range t.maps.All() {
		uses[i] = vaspace.Use{Range: it.Val.rng, What: it.Val.chunk.String()}
	}
	return uses
}

func (t *Table) errClosed(op string) error {
	return driver.Closed("mapping: " + op + " on a closed table")
}

// index returns the index of the first entry that ends after addr.
func (t *Table) index(addr driver.Addr) int { return t.maps.Search(addr) }

// n is the number of entries; at(i) the i-th in address order (nil past
// the last).
func (t *Table) n() int { return t.maps.Len() }

func (t *Table) at(i int) *entry {
	if i >= t.maps.Len() {
		return nil
	}
	return t.maps.At(i).Val
}

// inside checks that [addr, addr+size) lies in the table's reservation.
func (t *Table) inside(what func() string, addr driver.Addr, size uint64) error {
	r := t.res.Range()
	want := vaspace.Range{Base: addr, Size: size}
	if want.End() < addr || !r.ContainsRange(want) {
		return errors.Wrapf(driver.ErrNotReserved, "%s: %s is not inside the table's reservation %s", what(), want, r)
	}
	return nil
}

// Map maps the whole chunk c at addr, inaccessible to every device.
func (t *Table) Map(addr driver.Addr, c *physical.Chunk) error {
	if t.unmade() {
		return unmade("Table.Map", "New")
	}
	if c == nil {
		return errors.Wrapf(driver.ErrInvalid, "mapping: map at %s: the chunk is nil", addr)
	}
	what := func() string { return fmt.Sprintf("mapping: map %s at %s", c, addr) }
	if c.Memory() != t.mem {
		return errors.Wrapf(driver.ErrBadHandle, "%s: the chunk belongs to another physical memory", what())
	}
	t.mu.Lock()
	defer t.unlockAfter("map") // one defer: open-coded (two, with this many returns, are not)
	if t.closed {
		return t.errClosed("map")
	}
	if err := t.inside(what, addr, c.Size()); err != nil {
		return err
	}
	end := addr + driver.Addr(c.Size())
	gran := t.devs[c.Device()].MinGranularity
	e := &entry{tab: t, rng: vaspace.Range{Base: addr, Size: c.Size()}, chunk: c, gran: gran,
		access: runs.New[accessRow](c.Size() / gran), ndev: len(t.devs)}
	// Booked first, under the lock, and taken out again if the driver
	// refuses: one search of the books, where a check and then an add
	// would search twice.
	if it, ok := t.maps.Add(addr, end, e); !ok {
		if it == nil {
			return errors.AssertionFailedf("%s: the chunk is empty", what())
		}
		o := it.Val
		return errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: %s overlaps the mapping %s of %s",
				what(), vaspace.Range{Base: addr, Size: c.Size()}, o.rng, o.chunk),
			"unmap it first: map never replaces a mapping")
	}
	if err := mapref.Map(c, (*mapOp)(e)); err != nil {
		t.maps.DeleteStart(addr)
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}

// Unmap removes the mapping that starts at addr, returning its range to the
// reserved state and dropping the table's reference on its chunk. A
// mapping the driver no longer has is removed from the books all the same,
// with an error wrapping the driver's (see the package doc).
func (t *Table) Unmap(addr driver.Addr) error {
	if t.unmade() {
		return unmade("Table.Unmap", "New")
	}
	what := func() string { return fmt.Sprintf("mapping: unmap at %s", addr) }
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.checkAfter("unmap")
	if t.closed {
		return t.errClosed("unmap")
	}
	if err := t.inside(what, addr, 1); err != nil {
		return err
	}
	it := t.maps.Get(addr)
	if it == nil {
		return errors.Wrapf(driver.ErrNotMapped, "%s: nothing is mapped there", what())
	}
	if e := it.Val; e.rng.Base != addr {
		return errors.WithHint(
			errors.Wrapf(driver.ErrPartial, "%s: it is inside the mapping %s of %s", what(), e.rng, e.chunk),
			"unmap takes a whole mapping, by its start address")
	}
	return t.unmap(what, it.Val)
}

// UnmapRange removes every mapping inside r. A mapping that r cuts is
// ErrPartial, and then nothing is unmapped.
func (t *Table) UnmapRange(r vaspace.Range) error {
	if t.unmade() {
		return unmade("Table.UnmapRange", "New")
	}
	what := func() string { return fmt.Sprintf("mapping: unmap %s", r) }
	if !r.Valid() {
		return errors.Wrapf(driver.ErrInvalid, "%s: the range runs past the end of the address space", what())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.checkAfter("unmapRange")
	if t.closed {
		return t.errClosed("unmap")
	}
	if err := t.inside(what, r.Base, r.Size); err != nil {
		return err
	}
	lo, hi := t.index(r.Base), t.index(r.End())
	for _, i := range []int{lo, hi} {
		if e := t.at(i); e != nil && e.rng.Overlaps(r) && !r.ContainsRange(e.rng) {
			return errors.Wrapf(driver.ErrPartial, "%s: it cuts the mapping %s of %s", what(), e.rng, e.chunk)
		}
	}
	var gone error // mappings the driver no longer had, let go
	for i := hi - 1; i >= lo; i-- {
		if e := t.at(i); e != nil && r.ContainsRange(e.rng) {
			if err := t.unmap(what, e); err != nil {
				gone = errors.CombineErrors(gone, err)
				if e.gone == nil {
					return gone
				}
			}
		}
	}
	return gone
}

// unmap unmaps the entry e and drops it from the books. A mapping the
// driver no longer has is dropped too (the books follow the driver), and
// the error, which wraps the driver's, says so: e.gone is then set.
func (t *Table) unmap(what func() string, e *entry) error {
	if err := mapref.Unmap(e.chunk, (*unmapOp)(e)); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	t.maps.DeleteStart(e.rng.Base)
	if e.gone != nil {
		return errors.WithHint(
			errors.Wrapf(e.gone, "%s: the driver no longer maps %s of %s (unmapped through the driver behind the table's back?); the table has let it go",
				what(), e.rng, e.chunk),
			"unmap with Table.Unmap, never with Driver.Unmap")
	}
	return nil
}

// SetAccess sets what dev may do over [addr, addr+size), which must be
// mapped throughout; it may span several mappings.
func (t *Table) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if t.unmade() {
		return unmade("Table.SetAccess", "New")
	}
	what := func() string {
		return fmt.Sprintf("mapping: set access of device %d over [%s, +%s) to %s", dev, addr, units.Bytes(size), a)
	}
	if err := driver.CheckDevice(what, dev, len(t.devs)); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, a); err != nil {
		return err
	}
	if size == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	t.mu.Lock()
	defer t.unlockAfter("setAccess") // one defer: open-coded (two, with this many returns, are not)
	if t.closed {
		return t.errClosed("set access")
	}
	if err := t.inside(what, addr, size); err != nil {
		return err
	}
	end := addr + driver.Addr(size)
	var buf [4]*entry // the common case, on the stack
	es, err := t.covering(what, addr, end, buf[:0])
	if err != nil {
		return err
	}
	if err := driver.CheckAddr(what, addr, es[0].gran); err != nil {
		return err
	}
	if err := driver.CheckAddr(func() string { return what() + " (end)" }, end, es[len(es)-1].gran); err != nil {
		return err
	}
	if err := t.res.Hold(func() error { return t.drv.SetAccess(addr, size, dev, a) }); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	for _, e := range es {
		lo, hi := max(addr, e.rng.Base), min(end, e.rng.End())
		e.access.Set(uint64(lo-e.rng.Base)/e.gran, uint64(hi-e.rng.Base)/e.gran, func(row accessRow) accessRow {
			row[dev] = a
			return row
		})
	}
	return nil
}

// covering appends to es the entries covering [addr, end), or returns
// ErrNotMapped naming the first gap.
func (t *Table) covering(what func() string, addr, end driver.Addr, es []*entry) ([]*entry, error) {
	at := addr
	for it := range t.maps.After(addr) {
		if at >= end {
			break
		}
		e := it.Val
		if e.rng.Base > at {
			return nil, errors.Wrapf(driver.ErrNotMapped, "%s: [%s, %s) is not mapped", what(), at, min(end, e.rng.Base))
		}
		es = append(es, e)
		at = e.rng.End()
	}
	if at < end {
		return nil, errors.Wrapf(driver.ErrNotMapped, "%s: [%s, %s) is not mapped", what(), at, end)
	}
	return es, nil
}

// Entry is what backs one address.
type Entry struct {
	// Mapping is the whole mapping the address falls in.
	Mapping vaspace.Range
	Chunk   *physical.Chunk
	// Offset is the address's offset inside the chunk.
	Offset uint64
	// Access is what each device may do at the address (index = device).
	Access []driver.Access
}

// Lookup reports what backs addr: ErrNotMapped if nothing does.
func (t *Table) Lookup(addr driver.Addr) (Entry, error) {
	if t.unmade() {
		return Entry{}, unmade("Table.Lookup", "New")
	}
	what := func() string { return fmt.Sprintf("mapping: lookup %s", addr) }
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return Entry{}, t.errClosed("lookup")
	}
	if err := t.inside(what, addr, 1); err != nil {
		return Entry{}, err
	}
	it := t.maps.Get(addr)
	if it == nil {
		return Entry{}, errors.Wrapf(driver.ErrNotMapped, "%s: nothing is mapped there", what())
	}
	e := it.Val
	off := uint64(addr - e.rng.Base)
	return Entry{Mapping: e.rng, Chunk: e.chunk, Offset: off,
		Access: e.granule(off / e.gran)}, nil
}

// Mapping is one live mapping, as Mappings lists them.
type Mapping struct {
	Range vaspace.Range
	Chunk *physical.Chunk
}

// Mappings lists the live mappings in address order. It iterates over a
// copy taken when called, so the table may change while it runs.
func (t *Table) Mappings() iter.Seq[Mapping] {
	if t.unmade() {
		return nil
	}
	t.mu.RLock()
	ms := make([]Mapping, t.n())
	for i, it := range t.maps.All() {
		ms[i] = Mapping{Range: it.Val.rng, Chunk: it.Val.chunk}
	}
	t.mu.RUnlock()
	return func(yield func(Mapping) bool) {
		for _, m := range ms {
			if !yield(m) {
				return
			}
		}
	}
}

// Span is a maximal stretch of the reservation in one state with one chunk
// and the same access for every device throughout.
type Span struct {
	Range vaspace.Range
	State State
	// Chunk and ChunkOffset say what backs the start of the span (nil when
	// reserved).
	Chunk       *physical.Chunk
	ChunkOffset uint64
	// Access is per device (nil when reserved).
	Access []driver.Access
}

// Spans lists the whole reservation, reserved gaps included, in address
// order: the memory map the demo prints. Like Mappings it iterates over a
// copy.
func (t *Table) Spans() iter.Seq[Span] {
	if t.unmade() {
		return nil
	}
	t.mu.RLock()
	var spans []Span
	at := t.res.Base()
	for _, it := range t.maps.All() {
		e := it.Val
		if e.rng.Base > at {
			spans = append(spans, Span{Range: vaspace.Range{Base: at, Size: uint64(e.rng.Base - at)}, State: Reserved})
		}
		_ = e.access.Each(0, e.granules(), func(g0, g1 uint64, row accessRow) error {
			acc := row[:e.ndev]
			state := Mapped
			for _, a := range acc {
				if a != driver.AccessNone {
					state = Accessible
				}
			}
			spans = append(spans, Span{Range: vaspace.Range{Base: e.rng.Base + driver.Addr(g0*e.gran), Size: (g1 - g0) * e.gran},
				State: state, Chunk: e.chunk, ChunkOffset: g0 * e.gran, Access: append([]driver.Access(nil), acc...)})
			return nil
		})
		at = e.rng.End()
	}
	if end := t.res.Range().End(); at < end {
		spans = append(spans, Span{Range: vaspace.Range{Base: at, Size: uint64(end - at)}, State: Reserved})
	}
	t.mu.RUnlock()
	return func(yield func(Span) bool) {
		for _, s := range spans {
			if !yield(s) {
				return
			}
		}
	}
}

// describeAccess reads well after "has": "no access", "read access".
func describeAccess(a driver.Access) string {
	if a == driver.AccessNone {
		return "no access"
	}
	return a.String() + " access"
}

// Read copies len(p) bytes at addr into p on behalf of dev, which must have
// read access over the whole range.
func (t *Table) Read(dev driver.DeviceID, addr driver.Addr, p []byte) error {
	if t.unmade() {
		return unmade("Table.Read", "New")
	}
	return t.touch("read", dev, addr, p, driver.AccessRead, t.drv.Read)
}

// Write copies p to addr on behalf of dev, which must have read-write
// access over the whole range. A refused write changes no byte.
func (t *Table) Write(dev driver.DeviceID, addr driver.Addr, p []byte) error {
	if t.unmade() {
		return unmade("Table.Write", "New")
	}
	return t.touch("write", dev, addr, p, driver.AccessReadWrite, t.drv.Write)
}

func (t *Table) touch(op string, dev driver.DeviceID, addr driver.Addr, p []byte, want driver.Access,
	move func(driver.Addr, []byte) error) error {
	what := func() string { return fmt.Sprintf("mapping: %s %d bytes at %s for device %d", op, len(p), addr, dev) }
	if err := driver.CheckDevice(what, dev, len(t.devs)); err != nil {
		return err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return t.errClosed(op)
	}
	if len(p) == 0 {
		return nil
	}
	if err := t.inside(what, addr, uint64(len(p))); err != nil {
		return err
	}
	end := addr + driver.Addr(len(p))
	at := addr
	for it := range t.maps.After(addr) {
		if at >= end {
			break
		}
		e := it.Val
		if e.rng.Base > at {
			return errors.Wrapf(driver.ErrAccessDenied, "%s: %s is reserved but not mapped", what(), at)
		}
		glo, ghi := uint64(at-e.rng.Base)/e.gran, min(e.granules(), (uint64(end-e.rng.Base)+e.gran-1)/e.gran)
		err := e.access.Each(glo, ghi, func(g0, _ uint64, row accessRow) error {
			if a := row[dev]; !a.Allows(want) {
				return errors.Wrapf(driver.ErrAccessDenied, "%s: device %d has %s at %s, %s access is needed",
					what(), dev, describeAccess(a), e.rng.Base+driver.Addr(g0*e.gran), want)
			}
			return nil
		})
		if err != nil {
			return err
		}
		at = e.rng.End()
	}
	if at < end {
		return errors.Wrapf(driver.ErrAccessDenied, "%s: %s is reserved but not mapped", what(), at)
	}
	if err := t.res.Hold(func() error { return move(addr, p) }); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}

// Close unmaps every mapping and detaches the table from its reservation.
// The reservation itself stays; free it with its Free. Mappings the driver
// no longer has are let go (see the package doc): Close then closes the
// table and returns an error saying so; if the driver refuses to unmap one
// it has, the table stays open.
func (t *Table) Close() error {
	if t.unmade() {
		return unmade("Table.Close", "New")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.errClosed("close")
	}
	var errs error
	for i := t.n() - 1; i >= 0; i-- {
		errs = errors.CombineErrors(errs, t.unmap(func() string { return "mapping: close" }, t.at(i)))
	}
	if t.n() > 0 {
		return errs // the driver refused to unmap some: the table stays open
	}
	t.closed = true
	t.res.Detach(t)
	return errs // nil, or mappings the driver no longer had, let go
}

// Check compares the table with the driver and with its own invariants and
// returns every inconsistency: entries sorted, inside the reservation and
// not overlapping; each entry's chunk live in the table's memory with at
// least one mapping; and the driver reporting the same access for every
// device at every granule. For an open table it also checks its
// reservation (vaspace.Reservation.Check), which asks the driver whether
// the range is still reserved: a range unreserved through the driver from
// under the table (and the arena range or imported pool that owns it) is
// reported here.
func (t *Table) Check() error {
	if t.unmade() {
		return unmade("Table.Check", "New")
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	errs := t.checkLocked()
	if !t.closed {
		if err := t.res.Check(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "mapping: the table's reservation"))
		}
		errs = errors.CombineErrors(errs, t.checkBooksLocked())
	}
	return errs
}

// checkBooksLocked compares the table with the driver's own record, where
// the driver keeps one (driver.Books): each mapping is the driver's
// mapping at its address, of its chunk's handle and size, a chunk not
// released is live in the driver, and the driver has no other mapping in
// the reservation — none made through the driver
// or through another table over the same range behind this one's back.
// It is not part of checkLocked, which runs after every change under the
// invariants tag: a caller's own call on the driver is not a broken
// invariant of this package, and Check is where it is reported.
func (t *Table) checkBooksLocked() error {
	b, ok := t.drv.(driver.Books)
	if !ok {
		return nil
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	for _, it := range t.maps.All() {
		e := it.Val
		h, size, err := b.MappingAt(e.rng.Base)
		switch {
		case err != nil:
			fail("mapping: the table maps %s at %s, the %s driver has no mapping starting there: it was unmapped through the driver behind the table's back (%s)", e.chunk, e.rng.Base, t.drv.Name(), err.Error())
		case h != e.chunk.Handle() || size != e.rng.Size:
			fail("mapping: the table maps %s at %s, the %s driver handle %d of %s: it was remapped through the driver behind the table's back", e.chunk, e.rng.Base, t.drv.Name(), h, units.Bytes(size))
		}
		if !e.chunk.Released() {
			if _, _, err := b.ChunkInfo(e.chunk.Handle()); err != nil {
				fail("mapping: the table maps %s at %s, which the %s driver holds only for the mapping: it was released through the driver behind the physical memory's back (%s)", e.chunk, e.rng.Base, t.drv.Name(), err.Error())
			}
		}
	}
	n, bytes, err := b.Mapped(t.res.Base(), t.res.Size())
	if err != nil {
		fail("mapping: the %s driver cannot list the mappings in %s: %s", t.drv.Name(), t.res.Range(), err.Error())
	} else if n != t.maps.Len() {
		fail("mapping: the %s driver has %d mapping(s) (%s) in %s, the table %d: chunks were mapped into it through the driver, or through another table over the same reservation, behind this table's back",
			t.drv.Name(), n, units.Bytes(bytes), t.res.Range(), t.maps.Len())
	}
	return errs
}

// unlockAfter checks the books after op (invariants builds) and unlocks:
// the check, then the unlock, even if the check panics.
func (t *Table) unlockAfter(op string) {
	defer t.mu.Unlock()
	t.checkAfter(op)
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (t *Table) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("mapping: "+op, t.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (t *Table) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	perChunk := map[*physical.Chunk]int{}
	if err := t.maps.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrap(err, "mapping"))
	}
	for _, it := range t.maps.All() {
		e := it.Val
		if it.Start != e.rng.Base || it.End != e.rng.End() {
			fail("mapping: %s is listed as [%s, %s)", e.rng, it.Start, it.End)
		}
		if !t.res.Range().ContainsRange(e.rng) {
			fail("mapping: %s is outside the reservation %s", e.rng, t.res.Range())
		}
		if e.rng.Size != e.chunk.Size() {
			fail("mapping: %s maps %s of a different size", e.rng, e.chunk)
		}
		perChunk[e.chunk]++
		if err := e.access.Check(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "mapping: access of %s", e.rng))
		}
		// Every granule against the driver (the table's runs could hide a
		// granule the driver disagrees on).
		_ = e.access.Each(0, e.granules(), func(g0, g1 uint64, row accessRow) error {
			for g := g0; g < g1; g++ {
				gaddr := e.rng.Base + driver.Addr(g*e.gran)
				for d := range t.devs {
					got, err := t.drv.Access(gaddr, driver.DeviceID(d))
					if err != nil {
						fail("mapping: the driver does not see the mapping at %s: %v", gaddr, err)
						break
					}
					if got != row[d] {
						fail("mapping: at %s device %d has %s in the table, %s in the driver", gaddr, d, row[d], got)
					}
				}
			}
			return nil
		})
	}
	for c, n := range perChunk {
		if c.Mappings() < n {
			fail("mapping: %s counts %d mappings, this table alone holds %d", c, c.Mappings(), n)
		}
	}
	return errs
}
