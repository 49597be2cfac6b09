package physical

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
)

// Memory is the physical memory of one driver's devices: it creates chunks
// and keeps per-device usage. It does not own the driver: Close releases the
// chunks and leaves the driver open.
type Memory struct {
	d     driver.Driver
	devs  []driver.Device // d.Devices(), fixed for the driver's life
	share bool            // d.Supports(driver.FeatureShareable)

	mu     lockrank.Mutex[lockrank.Physical]
	closed bool
	// chunks holds every chunk whose memory is not yet returned, by handle.
	chunks table
	// usage[d] counts device d: Used is the sum of sizes of d's chunks in
	// chunks, Chunks their number, Peak the most Used has been.
	usage []Usage
}

// Usage is what one device holds.
type Usage struct {
	Device driver.DeviceID
	// Used is the bytes of chunks whose memory is not yet returned to the
	// device: live chunks, and released chunks still mapped.
	Used uint64
	// Peak is the highest Used has been.
	Peak uint64
	// Capacity is how many bytes of chunks the device can hold at once.
	Capacity uint64
	// Chunks is the number of chunks counted in Used.
	Chunks int
}

// New returns the Memory of d's devices, with nothing created yet. A
// Memory made with a nil driver (or a zero Memory) has no devices and
// refuses Create, Import, Close and Check with driver.ErrInvalid.
func New(d driver.Driver) *Memory {
	if isnil.Is(d) {
		return &Memory{}
	}
	m := &Memory{d: d, devs: d.Devices(), share: d.Supports(driver.FeatureShareable)}
	m.usage = make([]Usage, len(m.devs))
	for i, dev := range m.devs {
		m.usage[i] = Usage{Device: dev.ID, Capacity: dev.Capacity}
	}
	return m
}

// Driver returns the driver whose memory m manages; nil for a Memory
// without one.
func (m *Memory) Driver() driver.Driver {
	if m == nil {
		return nil
	}
	return m.d
}

// usable returns ErrInvalid for a Memory that has no driver.
func (m *Memory) usable(what func() string) error {
	if m == nil || m.d == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the memory has no driver", what()),
			"make a memory with physical.New(d) of an open driver")
	}
	return nil
}

// Create commits size bytes on device dev: a positive multiple of the
// device's minimum granularity. Running out is driver.ErrOutOfMemory, here
// and never later.
func (m *Memory) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (*Chunk, error) {
	what := func() string {
		kind := ""
		if opts.Shareable {
			kind = "shareable "
		}
		return fmt.Sprintf("physical: create %s%s on device %d", kind, units.Bytes(size), dev)
	}
	if err := m.usable(what); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.unlockAfter("create") // one defer: open-coded (two, with this many returns, are not)
	if m.closed {
		return nil, driver.Closed(what() + ": the memory is closed")
	}
	if err := driver.CheckDevice(what, dev, len(m.devs)); err != nil {
		return nil, err
	}
	if err := driver.CheckSize(what, size, m.devs[dev].MinGranularity); err != nil {
		return nil, err
	}
	if opts.Shareable && !m.share {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no shareable chunks", what(), m.d.Name())
	}
	h, err := m.d.Create(dev, size, opts)
	if err != nil {
		// The driver's message says what was asked and what was free.
		return nil, errors.Wrapf(err, "%s", what())
	}
	if h == 0 || m.chunks.get(h) != nil {
		return nil, errors.AssertionFailedf("%s: the driver returned handle %d, which is zero or already live", what(), h)
	}
	c := &Chunk{m: m, handle: h, dev: dev, size: size, shareable: opts.Shareable}
	m.addLocked(c)
	return c, nil
}

// addLocked books a new chunk.
func (m *Memory) addLocked(c *Chunk) {
	m.chunks.add(c)
	u := &m.usage[c.dev]
	u.Used += c.size
	u.Peak = max(u.Peak, u.Used)
	u.Chunks++
}

// Usage reports what device dev holds. It answers after Close too: chunks
// still mapped then keep their memory until unmapped.
func (m *Memory) Usage(dev driver.DeviceID) (Usage, error) {
	if m == nil {
		return Usage{}, errors.Wrap(driver.ErrInvalid, "physical: Memory.Usage on a nil memory")
	}
	if err := driver.CheckDevice(func() string { return "physical: usage" }, dev, len(m.devs)); err != nil {
		return Usage{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usage[dev], nil
}

// Chunks returns every chunk whose memory is not yet returned, by handle.
func (m *Memory) Chunks() []*Chunk {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sortedChunks()
}

func (m *Memory) sortedChunks() []*Chunk {
	cs := make([]*Chunk, 0, m.chunks.n)
	for c := range m.chunks.all {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b *Chunk) int { return cmp.Compare(a.handle, b.handle) })
	return cs
}

// Close releases every chunk not yet released and closes m: Create, Release
// and new mappings then return driver.ErrClosed. Chunks still mapped keep
// their memory (and stay counted in Used) until the mapping layer drops
// their last mapping, so unmapping, Usage, Chunks and Check still work.
// Should the driver refuse to release a chunk, Close releases the others,
// reports the refusals, and m is closed all the same.
func (m *Memory) Close() error {
	if err := m.usable(func() string { return "physical: close" }); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.checkAfter("close")
	if m.closed {
		return driver.Closed("physical: close: the memory is already closed")
	}
	m.closed = true
	var errs error
	for _, c := range m.sortedChunks() {
		if c.released {
			continue
		}
		if err := c.releaseLocked(); err != nil {
			errs = errors.CombineErrors(errs, err)
		}
	}
	if errs != nil {
		return errors.Wrapf(errs, "physical: close")
	}
	return nil
}

// Check walks every chunk and counter and returns every broken invariant as
// an errors.AssertionFailedf, combined. It also compares the books with the
// driver's, where the driver reports what a device holds (Used(dev), as the
// host, sim, CUDA and AscendCL drivers do): every chunk listed here is held
// by the driver, so a device's Used here can never be above the driver's.
// If it is, a chunk was released through the driver behind this Memory's
// back (or the driver was closed), and Check says so.
//
// The driver's figure counts the chunks of every Memory over it, so a
// chunk released behind the back of one Memory can hide behind the chunks
// of another, and a chunk still mapped keeps its memory in both books when
// released: Check sees what the driver's totals can show. The next Release
// of such a chunk finds out in any case (see Chunk.Release).
func (m *Memory) Check() error {
	if err := m.usable(func() string { return "physical: check" }); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.CombineErrors(m.checkLocked(), m.checkDriverLocked())
}

// deviceUsage is implemented by drivers that report what each device
// holds: chunks created or imported there and not yet returned.
type deviceUsage interface {
	Used(dev driver.DeviceID) uint64
}

// checkDriverLocked reports every live chunk the driver's own record
// (driver.Books) does not hold as it is here — released, or of another
// device or size — and every device whose books hold more than the
// driver does; m.mu is held, so no call of m changes the driver meanwhile,
// and other users of the driver only add to its figure. It is not part of
// checkLocked, which runs after every change under the invariants tag: a
// caller's own call on the driver is not a broken invariant of this
// package, and Check is where it is reported.
func (m *Memory) checkDriverLocked() error {
	var errs error
	if du, ok := m.d.(deviceUsage); ok {
		for d, u := range m.usage {
			if got := du.Used(driver.DeviceID(d)); u.Used > got {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf(
					"physical: device %d: these books hold %s in %d chunk(s), the %s driver only %s: a chunk was released through the driver (Driver.Release of a handle this memory tracks), or the driver closed, behind the memory's back; release chunks with Chunk.Release",
					d, units.Bytes(u.Used), u.Chunks, m.d.Name(), units.Bytes(got)))
			}
		}
	}
	b, ok := m.d.(driver.Books)
	if !ok {
		return errs
	}
	for c := range m.chunks.all {
		if c.released {
			continue // the driver may hold it for its mappings, or not at all
		}
		dev, size, err := b.ChunkInfo(c.handle)
		switch {
		case err != nil:
			errs = errors.CombineErrors(errs, errors.AssertionFailedf(
				"physical: %s is live here but the %s driver does not hold handle %d: it was released through the driver (Driver.Release), or the driver closed, behind the memory's back; release chunks with Chunk.Release (%s)",
				c, m.d.Name(), c.handle, err.Error()))
		case dev != c.dev || size != c.size:
			errs = errors.CombineErrors(errs, errors.AssertionFailedf(
				"physical: %s is handle %d here, the %s driver's handle %d is %s on device %d", c, c.handle, m.d.Name(), c.handle, units.Bytes(size), dev))
		}
	}
	return errs
}

// unlockAfter checks the books after op (invariants builds) and unlocks:
// the check, then the unlock, even if the check panics.
func (m *Memory) unlockAfter(op string) {
	defer m.mu.Unlock()
	m.checkAfter(op)
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (m *Memory) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("physical: "+op, m.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (m *Memory) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	used := make([]uint64, len(m.devs))
	count := make([]int, len(m.devs))
	listed := 0
	for c := range m.chunks.all {
		listed++
		if h := c.handle; m.chunks.get(h) != c || c.m != m {
			fail("physical: %s is listed under handle %d or belongs to another memory", c, h)
		}
		if c.dev < 0 || int(c.dev) >= len(m.devs) {
			fail("physical: %s is on a device the driver does not have", c)
			continue
		}
		if c.returned {
			fail("physical: %s is returned but still listed", c)
		}
		if c.released && c.maps == 0 {
			fail("physical: %s is released and unmapped but its memory is not returned", c)
		}
		if c.maps < 0 {
			fail("physical: %s counts %d mappings", c, c.maps)
		}
		if m.closed && !c.released {
			fail("physical: %s is not released after Close", c)
		}
		if g := m.devs[c.dev].MinGranularity; c.size == 0 || c.size%g != 0 {
			fail("physical: %s is not a multiple of the granularity %s", c, units.Bytes(g))
		}
		used[c.dev] += c.size
		count[c.dev]++
	}
	if listed != m.chunks.n {
		fail("physical: %d chunk(s) listed, %d counted", listed, m.chunks.n)
	}
	for d, u := range m.usage {
		if u.Device != driver.DeviceID(d) || u.Capacity != m.devs[d].Capacity {
			fail("physical: usage of device %d is recorded as device %d of capacity %d", d, u.Device, u.Capacity)
		}
		if u.Used != used[d] || u.Chunks != count[d] {
			fail("physical: device %d counts %d bytes in %d chunk(s), its chunks hold %d bytes in %d",
				d, u.Used, u.Chunks, used[d], count[d])
		}
		if u.Used > u.Peak {
			fail("physical: device %d uses %d bytes, above its peak %d", d, u.Used, u.Peak)
		}
		if u.Used > u.Capacity {
			fail("physical: device %d uses %d bytes, above its capacity %d", d, u.Used, u.Capacity)
		}
	}
	return errs
}
