package sleep

import (
	"fmt"
	"sort"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
)

// A tagDriver stands between one tag's allocator and the real driver. Its
// chunk handles are its own: each names a real chunk while the tag is
// awake, and nothing while it sleeps. Putting the tag to sleep unmaps every
// mapping and releases every real chunk, but the allocator's books — which
// chunks back which addresses, with what access — stay as they are, so
// waking creates a real chunk for each handle again, maps it at the
// addresses it had and grants the access it had. The allocator never
// learns that its memory went away and came back.
//
// Awake, every call passes through to the real driver and is recorded.
// Asleep, calls that would need memory (Create, Map, SetAccess, Read,
// Write) are refused with ErrBusy; Unmap and Release, which a Free or a
// Close of the allocator may make, only edit the records: the real
// mapping and chunk are gone already, so nothing is given back twice.
//
// Invariants (check): asleep, no chunk has a real handle; awake, every
// chunk has one and every mapping is mapped in the real driver at its
// address with the recorded access; every mapping names a live chunk
// record, which lists it; a released chunk has at least one mapping (it is
// dropped with its last one).
type tagDriver struct {
	d   driver.Driver
	tag string

	// mu guards everything below. It is not a leaf: each call holds it
	// across the real driver's call (Create, Map, Unmap, Release,
	// SetAccess, Access; sleep and wake across all theirs), so that a
	// record and the real driver's state change together and a sleep or
	// wake is one step to every other call. The order is
	//
	//	Manager.mu → the tag allocator's locks → tagDriver.mu → the real driver's locks
	//
	// and nothing under mu calls back up it: the real driver never calls
	// into this package, and mu is never held across a call into the
	// Manager, the allocator or a tensor's lease.
	mu       lockrank.Mutex[lockrank.SleepTagDriver]
	next     driver.Handle
	chunks   map[driver.Handle]*vchunk
	maps     map[driver.Addr]*vmap // by start address
	asleep   bool
	refused  []driver.Handle // real chunks whose release was refused, retried by sleep, wake and close
	awakeMem uint64          // bytes of real chunks held now
	asleepB  uint64          // bytes of chunks given back by sleep, committed again by wake
	// reserved are the reservations made through the tag, by base: its
	// books (driver.Books) answer for them, asleep as awake.
	reserved map[driver.Addr]uint64
}

// A vchunk is one of the allocator's chunks: real names the real chunk
// while awake (0 asleep); maps are its mappings' start addresses.
type vchunk struct {
	dev      driver.DeviceID
	size     uint64
	opts     driver.ChunkOptions
	real     driver.Handle
	released bool // the allocator released it; it lives on only for its mappings
	maps     map[driver.Addr]struct{}
}

// A vmap is one mapping of a chunk and the access each device has to it.
type vmap struct {
	h      driver.Handle
	size   uint64
	access [driver.MaxDevices]driver.Access
}

func newTagDriver(d driver.Driver, tag string) *tagDriver {
	return &tagDriver{d: d, tag: tag, chunks: map[driver.Handle]*vchunk{}, maps: map[driver.Addr]*vmap{},
		reserved: map[driver.Addr]uint64{}}
}

func (t *tagDriver) busy(op string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrBusy, "sleep: %s in tag %q: the tag is asleep", op, t.tag),
		"wake the tag first")
}

func (t *tagDriver) Name() string             { return t.d.Name() }
func (t *tagDriver) Devices() []driver.Device { return t.d.Devices() }
func (t *tagDriver) Granularity() uint64      { return t.d.Granularity() }
func (t *tagDriver) Supports(f driver.Feature) bool {
	return f == driver.FeatureHostAccess && t.d.Supports(f)
}

func (t *tagDriver) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	base, err := t.d.Reserve(size, align, hint)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	t.reserved[base] = size
	t.mu.Unlock()
	return base, nil
}

func (t *tagDriver) Unreserve(base driver.Addr, size uint64) error {
	if err := t.d.Unreserve(base, size); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.reserved, base)
	t.mu.Unlock()
	return nil
}

// The tag's books (driver.Books) are its records — the chunks, mappings
// and reservations the allocator made through it — asleep as awake: what
// physical's, mapping's and vaspace's Checks compare theirs with. check
// compares them with the real driver's while awake.
var _ driver.Books = (*tagDriver)(nil)

// ChunkInfo is the device and size of the tag's live chunk h.
func (t *tagDriver) ChunkInfo(h driver.Handle) (driver.DeviceID, uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := t.chunk("chunk info", h)
	if err != nil {
		return 0, 0, err
	}
	return c.dev, c.size, nil
}

// MappingAt is the handle and size of the tag's mapping that starts at
// addr.
func (t *tagDriver) MappingAt(addr driver.Addr) (driver.Handle, uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.maps[addr]; m != nil {
		return m.h, m.size, nil
	}
	for base, size := range t.reserved {
		if addr >= base && uint64(addr-base) < size {
			return 0, 0, errors.Wrapf(driver.ErrNotMapped, "sleep: mapping at %s in tag %q: none starts there", addr, t.tag)
		}
	}
	return 0, 0, errors.Wrapf(driver.ErrNotReserved, "sleep: mapping at %s in tag %q: outside every reservation of the tag", addr, t.tag)
}

// Mapped is how many of the tag's mappings overlap [base, base+size) and
// their bytes.
func (t *tagDriver) Mapped(base driver.Addr, size uint64) (int, uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, bytes := 0, uint64(0)
	for a, m := range t.maps {
		if a < base+driver.Addr(size) && base < a+driver.Addr(m.size) {
			n, bytes = n+1, bytes+m.size
		}
	}
	return n, bytes, nil
}

// ReservationAt is the size of the tag's reservation that starts at base.
func (t *tagDriver) ReservationAt(base driver.Addr) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	size, ok := t.reserved[base]
	if !ok {
		return 0, errors.Wrapf(driver.ErrNotReserved, "sleep: reservation at %s in tag %q: none starts there", base, t.tag)
	}
	return size, nil
}

// Used is the bytes of the tag's chunks on dev, as the allocator over it
// sees them: those created and not yet gone (a released chunk lives on
// while mapped), asleep as awake — the real memory a sleeping tag gave
// back is the real driver's books'. A walk over the tag's chunks.
func (t *tagDriver) Used(dev driver.DeviceID) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, c := range t.chunks {
		if c.dev == dev {
			n += c.size
		}
	}
	return n
}

func (t *tagDriver) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asleep {
		return 0, t.busy("create a chunk")
	}
	h, err := t.d.Create(dev, size, opts)
	if err != nil {
		return 0, err
	}
	t.next++
	t.chunks[t.next] = &vchunk{dev: dev, size: size, opts: opts, real: h, maps: map[driver.Addr]struct{}{}}
	t.awakeMem += size
	return t.next, nil
}

func (t *tagDriver) chunk(op string, h driver.Handle) (*vchunk, error) {
	c := t.chunks[h]
	if c == nil || c.released {
		return nil, errors.Wrapf(driver.ErrBadHandle, "sleep: %s: chunk %d of tag %q is unknown or released", op, h, t.tag)
	}
	return c, nil
}

func (t *tagDriver) Release(h driver.Handle) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := t.chunk("release", h)
	if err != nil {
		return err
	}
	if !t.asleep {
		if err := t.d.Release(c.real); err != nil {
			return err
		}
	}
	c.released = true
	t.dropIfDone(h, c)
	return nil
}

// dropIfDone forgets a released chunk with no mapping left. Its memory
// went back when its last real mapping did (or at sleep).
func (t *tagDriver) dropIfDone(h driver.Handle, c *vchunk) {
	if !c.released || len(c.maps) > 0 {
		return
	}
	delete(t.chunks, h)
	if t.asleep {
		t.asleepB -= c.size
	} else {
		t.awakeMem -= c.size
	}
}

func (t *tagDriver) Map(addr driver.Addr, h driver.Handle) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asleep {
		return t.busy("map")
	}
	c, err := t.chunk("map", h)
	if err != nil {
		return err
	}
	if err := t.d.Map(addr, c.real); err != nil {
		return err
	}
	t.maps[addr] = &vmap{h: h, size: c.size}
	c.maps[addr] = struct{}{}
	return nil
}

func (t *tagDriver) Unmap(addr driver.Addr, size uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.maps[addr]
	if m == nil || m.size != size {
		if t.asleep {
			return errors.Wrapf(driver.ErrNotMapped, "sleep: unmap %s (%s) in tag %q: no such mapping", addr, units.Bytes(size), t.tag)
		}
		return t.d.Unmap(addr, size) // the real driver says what is wrong
	}
	if !t.asleep {
		if err := t.d.Unmap(addr, size); err != nil {
			return err
		}
	}
	delete(t.maps, addr)
	c := t.chunks[m.h]
	delete(c.maps, addr)
	t.dropIfDone(m.h, c)
	return nil
}

// covering returns the mappings that exactly cover [addr, addr+size), in
// order, or an error naming the first gap.
func (t *tagDriver) covering(op string, addr driver.Addr, size uint64) ([]*vmap, error) {
	var ms []*vmap
	for a, end := addr, addr+driver.Addr(size); a < end; {
		m := t.maps[a]
		if m == nil {
			return nil, errors.Wrapf(driver.ErrNotMapped, "sleep: %s [%s, %s) in tag %q: no mapping starts at %s (access is set over whole chunks)",
				op, addr, end, t.tag, a)
		}
		ms = append(ms, m)
		a += driver.Addr(m.size)
	}
	return ms, nil
}

func (t *tagDriver) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asleep {
		return t.busy("set access")
	}
	if err := driver.CheckDevice(func() string { return "sleep: set access" }, dev, len(t.d.Devices())); err != nil {
		return err
	}
	ms, err := t.covering("set access", addr, size)
	if err != nil {
		return err
	}
	if err := t.d.SetAccess(addr, size, dev, a); err != nil {
		return err
	}
	for _, m := range ms {
		m.access[dev] = a
	}
	return nil
}

func (t *tagDriver) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.asleep {
		return t.d.Access(addr, dev)
	}
	if err := driver.CheckDevice(func() string { return "sleep: access" }, dev, len(t.d.Devices())); err != nil {
		return 0, err
	}
	for start, m := range t.maps {
		if addr >= start && addr < start+driver.Addr(m.size) {
			return m.access[dev], nil
		}
	}
	return 0, errors.Wrapf(driver.ErrNotMapped, "sleep: access at %s in tag %q", addr, t.tag)
}

func (t *tagDriver) Read(addr driver.Addr, p []byte) error {
	if t.isAsleep() {
		return errors.Wrapf(driver.ErrAccessDenied, "sleep: read at %s: tag %q is asleep", addr, t.tag)
	}
	return t.d.Read(addr, p)
}

func (t *tagDriver) Write(addr driver.Addr, p []byte) error {
	if t.isAsleep() {
		return errors.Wrapf(driver.ErrAccessDenied, "sleep: write at %s: tag %q is asleep", addr, t.tag)
	}
	return t.d.Write(addr, p)
}

// hostTagDriver is the tagDriver over a real driver whose memory this
// process addresses (driver.HostMapper): through it the tag's allocator
// hands out its allocations' bytes (arena.Allocator.Bytes), which
// Manager.Tensor lays a leased tensor over. Asleep it refuses (ErrBusy):
// nothing is mapped. A slice it handed out before a sleep addresses
// unmapped memory until the wake maps the same addresses again, so the
// Manager revokes the tensors over it before the tag sleeps.
type hostTagDriver struct {
	*tagDriver
	hm driver.HostMapper
}

// forAllocator is the driver the tag's allocator is made over: t, or t
// with HostBytes where the real driver has it.
func (t *tagDriver) forAllocator() driver.Driver {
	if hm, ok := t.d.(driver.HostMapper); ok {
		return &hostTagDriver{tagDriver: t, hm: hm}
	}
	return t
}

func (h *hostTagDriver) HostBytes(addr driver.Addr, size uint64) ([]byte, error) {
	if h.isAsleep() {
		return nil, h.busy(fmt.Sprintf("host bytes at %s", addr))
	}
	return h.hm.HostBytes(addr, size)
}

// Close closes nothing: the real driver is the Manager's caller's. It
// retries the releases the real driver refused.
func (t *tagDriver) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.retryRefusedLocked()
}

func (t *tagDriver) isAsleep() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.asleep
}

func (t *tagDriver) retryRefusedLocked() error {
	var errs error
	kept := t.refused[:0]
	for _, h := range t.refused {
		if err := t.d.Release(h); err != nil {
			errs = errors.CombineErrors(errs, err)
			kept = append(kept, h)
		}
	}
	t.refused = kept
	return errs
}

// sorted lists the mappings by address, so sleep and wake work in a
// fixed order (and a rollback undoes a prefix).
func (t *tagDriver) sorted() []driver.Addr {
	as := make([]driver.Addr, 0, len(t.maps))
	for a := range t.maps {
		as = append(as, a)
	}
	sort.Slice(as, func(i, j int) bool { return as[i] < as[j] })
	return as
}

// sleep unmaps every mapping and releases every real chunk. An unmap the
// real driver refuses undoes the unmaps before it (mapping the chunks
// back, with their access: a chunk keeps its bytes while it is not
// released) and leaves the tag awake. A release it refuses is kept and
// retried by the next sleep, wake or Close: the tag is asleep either way.
func (t *tagDriver) sleep() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asleep {
		return nil
	}
	_ = t.retryRefusedLocked()
	as := t.sorted()
	for i, a := range as {
		m := t.maps[a]
		if err := t.d.Unmap(a, m.size); err != nil {
			err = errors.Wrapf(err, "sleep: unmap %s of tag %q", a, t.tag)
			for _, b := range as[:i] {
				err = errors.CombineErrors(err, t.mapBackLocked(b))
			}
			return err
		}
	}
	var errs error
	for _, c := range t.chunks {
		// A chunk the allocator released lived on only for its mappings:
		// their unmaps above gave its memory back.
		if !c.released {
			if err := t.d.Release(c.real); err != nil {
				errs = errors.CombineErrors(errs, errors.Wrapf(err, "sleep: release a chunk of tag %q (retried at wake)", t.tag))
				t.refused = append(t.refused, c.real)
			}
		}
		c.real = 0
		t.asleepB += c.size
		t.awakeMem -= c.size
	}
	t.asleep = true
	return errs
}

// mapBackLocked maps the chunk of the recorded mapping at a again (its
// real chunk is still held) and grants its access.
func (t *tagDriver) mapBackLocked(a driver.Addr) error {
	m := t.maps[a]
	c := t.chunks[m.h]
	if err := t.d.Map(a, c.real); err != nil {
		return err
	}
	return t.grantLocked(a, m)
}

func (t *tagDriver) grantLocked(a driver.Addr, m *vmap) error {
	for dev, acc := range m.access {
		if acc != driver.AccessNone {
			if err := t.d.SetAccess(a, m.size, driver.DeviceID(dev), acc); err != nil {
				return err
			}
		}
	}
	return nil
}

// wake creates a real chunk for every chunk, maps it at each of its
// addresses and grants the recorded access. If the real driver refuses
// any of it, what was done is undone — nothing leaks — and the tag stays
// asleep.
func (t *tagDriver) wake() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.asleep {
		return nil
	}
	if err := t.retryRefusedLocked(); err != nil {
		return errors.Wrapf(err, "sleep: wake tag %q: the real driver still refuses to release memory given back at sleep", t.tag)
	}
	hs := make([]driver.Handle, 0, len(t.chunks))
	for h := range t.chunks {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
	var mapped []driver.Addr
	undo := func(err error) error {
		for _, a := range mapped {
			err = errors.CombineErrors(err, t.d.Unmap(a, t.maps[a].size))
		}
		for _, h := range hs {
			if c := t.chunks[h]; c.real != 0 {
				err = errors.CombineErrors(err, t.d.Release(c.real))
				c.real = 0
			}
		}
		return err
	}
	for _, h := range hs {
		c := t.chunks[h]
		r, err := t.d.Create(c.dev, c.size, c.opts)
		if err != nil {
			return undo(errors.Wrapf(err, "sleep: wake tag %q: commit %s on device %d", t.tag, units.Bytes(c.size), c.dev))
		}
		c.real = r
		as := make([]driver.Addr, 0, len(c.maps))
		for a := range c.maps {
			as = append(as, a)
		}
		sort.Slice(as, func(i, j int) bool { return as[i] < as[j] })
		for _, a := range as {
			if err := t.d.Map(a, r); err != nil {
				return undo(errors.Wrapf(err, "sleep: wake tag %q: map at %s", t.tag, a))
			}
			mapped = append(mapped, a)
			if err := t.grantLocked(a, t.maps[a]); err != nil {
				return undo(errors.Wrapf(err, "sleep: wake tag %q: grant access at %s", t.tag, a))
			}
		}
	}
	var errs error
	for _, c := range t.chunks {
		t.awakeMem += c.size
		t.asleepB -= c.size
		if c.released { // as before sleep: held only by its mappings
			if err := t.d.Release(c.real); err != nil {
				errs = errors.CombineErrors(errs, err)
				t.refused = append(t.refused, c.real)
			}
		}
	}
	t.asleep = false
	return errs
}

// figures returns the bytes of real memory held and of memory given back.
func (t *tagDriver) figures() (awake, asleep uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.awakeMem, t.asleepB
}

// check reports every broken invariant of the type's doc.
func (t *tagDriver) check() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var held uint64
	for h, c := range t.chunks {
		held += c.size
		if t.asleep != (c.real == 0) {
			fail("sleep: tag %q: chunk %d has real handle %d while asleep is %v", t.tag, h, c.real, t.asleep)
		}
		if c.released && len(c.maps) == 0 {
			fail("sleep: tag %q: chunk %d is released and unmapped but still recorded", t.tag, h)
		}
		for a := range c.maps {
			if m := t.maps[a]; m == nil || m.h != h {
				fail("sleep: tag %q: chunk %d lists a mapping at %s that is not its", t.tag, h, a)
			}
		}
	}
	for a, m := range t.maps {
		c := t.chunks[m.h]
		if c == nil {
			fail("sleep: tag %q: the mapping at %s names chunk %d, which is not recorded", t.tag, a, m.h)
			continue
		}
		if _, ok := c.maps[a]; !ok || m.size != c.size {
			fail("sleep: tag %q: the mapping at %s is not listed by its chunk, or not of its size", t.tag, a)
		}
		if t.asleep {
			continue
		}
		for dev := range t.d.Devices() {
			got, err := t.d.Access(a, driver.DeviceID(dev))
			if err != nil || got != m.access[dev] {
				fail("sleep: tag %q: the driver gives device %d %s at %s, the record says %s (%v)", t.tag, dev, got, a, m.access[dev], err)
			}
		}
	}
	if b, ok := t.d.(driver.Books); ok && !t.asleep {
		for h, c := range t.chunks {
			if c.released {
				continue // the real driver holds it for its mappings
			}
			if dev, size, err := b.ChunkInfo(c.real); err != nil || dev != c.dev || size != c.size {
				fail("sleep: tag %q: chunk %d is real handle %d, %s on device %d; the driver says %s on device %d (%v): released behind the tag's back",
					t.tag, h, c.real, units.Bytes(c.size), c.dev, units.Bytes(size), dev, err)
			}
		}
		for a, m := range t.maps {
			c := t.chunks[m.h]
			if c == nil {
				continue // reported above
			}
			if h, size, err := b.MappingAt(a); err != nil || h != c.real || size != m.size {
				fail("sleep: tag %q: the mapping at %s is of real handle %d, the driver's of %d, %s (%v)", t.tag, a, c.real, h, units.Bytes(size), err)
			}
		}
	}
	if a, s := t.awakeMem, t.asleepB; (t.asleep && (a != 0 || s != held)) || (!t.asleep && (s != 0 || a != held)) {
		fail("sleep: tag %q: %d bytes awake and %d asleep recorded, the chunks hold %d (asleep %v)", t.tag, a, s, held, t.asleep)
	}
	return errs
}

func (t *tagDriver) String() string {
	return fmt.Sprintf("sleep driver of tag %q over %s", t.tag, t.d.Name())
}
