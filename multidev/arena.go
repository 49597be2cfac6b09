package multidev

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Options configure an arena.
type Options struct {
	// Max is the most the arena can grow to: the address space reserved up
	// front, rounded up to a whole number of chunks.
	Max uint64
	// ChunkSize is the size of every chunk (default: the largest
	// recommended granularity of the devices the placement names, all of
	// them for Explicit). It must be a multiple of the driver's
	// granularity, so a chunk can be created on any device.
	ChunkSize uint64
	// Placement decides which device backs each chunk (default: Striped
	// over every device of the driver).
	Placement Placement
	// OnFull says what a grow does when a device has no room.
	OnFull OnFull
}

// Arena is growable memory at a fixed base whose chunks lie on several
// devices: an arena.Arena whose placement spreads it, with grants that
// respect reachability and migration between devices. Safe for concurrent
// use.
type Arena struct {
	a       *arena.Arena
	drv     driver.Driver
	streams driver.Streams // nil: no device reaches another's memory
	ndev    int

	// grants serialises Grant and Migrate — the calls that check
	// reachability against the layout and then change grants or the
	// layout — so no chunk moves between a check and its use. It is taken
	// before the arena's locks.
	grants lockrank.Mutex[lockrank.MultidevGrants]
}

// New reserves opts.Max of address space for an arena whose chunks are
// placed by opts.Placement. No memory is committed until it grows.
func New(space *vaspace.Space, mem *physical.Memory, opts Options) (*Arena, error) {
	if space == nil || mem == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "multidev: new arena: the address space or the physical memory is nil")
	}
	drv := space.Driver()
	if drv == nil || mem.Driver() == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "multidev: new arena: the address space or the physical memory has no driver (made with vaspace.New and physical.New of an open driver?)")
	}
	devs := drv.Devices()
	if opts.Placement == nil {
		all := make([]driver.DeviceID, len(devs))
		for i := range all {
			all[i] = driver.DeviceID(i)
		}
		opts.Placement = Striped(all...)
	}
	what := func() string {
		return fmt.Sprintf("multidev: new arena of %s, %s", units.Bytes(opts.Max), opts.Placement)
	}
	used := make([]driver.DeviceID, len(devs))
	for i := range used {
		used[i] = driver.DeviceID(i)
	}
	if l, ok := opts.Placement.(listed); ok {
		used = l.devices()
		if len(used) == 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: the placement names no device", what())
		}
		for i, d := range used {
			if err := driver.CheckDevice(what, d, len(devs)); err != nil {
				return nil, err
			}
			if slices.Contains(used[:i], d) {
				return nil, errors.Wrapf(driver.ErrInvalid, "%s: the placement names device %d twice", what(), d)
			}
		}
	}
	if opts.ChunkSize == 0 {
		for _, d := range used {
			opts.ChunkSize = max(opts.ChunkSize, devs[d].RecommendedGranularity)
		}
	}
	cs := opts.ChunkSize
	if b, ok := opts.Placement.(blocked); ok {
		if b.per == 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: zero bytes per device", what())
		}
		if cs != 0 && b.per%cs != 0 {
			return nil, errors.Wrapf(driver.ErrMisaligned, "%s: %s per device is not a multiple of the chunk size %s",
				what(), units.Bytes(b.per), units.Bytes(cs))
		}
	}
	if ex, ok := opts.Placement.(explicit); ok && ex.fn == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the explicit placement has no function", what())
	}
	a, err := arena.New(space, mem, arena.Options{Max: opts.Max, ChunkSize: cs, MaxChunk: cs,
		Placement: opts.Placement, OnFull: opts.OnFull, Access: []driver.DeviceID{}})
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	m := &Arena{a: a, drv: drv, ndev: len(devs)}
	if s, ok := drv.(driver.Streams); ok && drv.Supports(driver.FeatureStreams) {
		m.streams = s
	}
	return m, nil
}

// Base is the arena's first address; it never changes.
func (m *Arena) Base() driver.Addr {
	if m.unmade() {
		return 0
	}
	return m.a.Base()
}

// Max is the most the arena can grow to.
func (m *Arena) Max() uint64 {
	if m.unmade() {
		return 0
	}
	return m.a.Max()
}

// ChunkSize is the size of every chunk.
func (m *Arena) ChunkSize() uint64 {
	if m.unmade() {
		return 0
	}
	return m.a.ChunkSize()
}

// Placement is the arena's placement policy.
func (m *Arena) Placement() Placement {
	if m.unmade() {
		return nil
	}
	return m.a.Placement()
}

// Len is the arena's length: [Base, Base+Len) may be read and written by
// the devices granted access.
func (m *Arena) Len() uint64 {
	if m.unmade() {
		return 0
	}
	return m.a.Len()
}

// Committed is the bytes of chunks mapped: Len rounded up to whole chunks,
// plus any not yet trimmed.
func (m *Arena) Committed() uint64 {
	if m.unmade() {
		return 0
	}
	return m.a.Committed()
}

// Stats returns the arena's figures.
func (m *Arena) Stats() arena.Stats {
	if m.unmade() {
		return arena.Stats{}
	}
	return m.a.Stats()
}

// Extent is a maximal run of chunks on one device.
type Extent struct {
	Range  vaspace.Range
	Device driver.DeviceID
}

// Layout lists the committed memory as maximal runs of chunks on one
// device, in address order (empty when nothing is committed or the arena is
// closed).
func (m *Arena) Layout() []Extent {
	if m.unmade() {
		return nil
	}
	var out []Extent
	for _, e := range m.a.Layout() {
		out = append(out, Extent{Range: vaspace.Range{Base: m.Base() + driver.Addr(e.Offset), Size: e.Size}, Device: e.Device})
	}
	return out
}

// DeviceAt reports the device whose memory backs offset off.
func (m *Arena) DeviceAt(off uint64) (driver.DeviceID, error) {
	if m.unmade() {
		return 0, unmade("Arena.DeviceAt", "New")
	}
	d, err := m.a.DeviceAt(off)
	return d, errors.Wrap(err, "multidev")
}

// Grow lengthens the arena by n bytes, mapping chunks at its end on the
// devices the placement names when Len passes what is committed. If a
// chunk cannot be placed, the chunks this call mapped are unmapped and
// released: the arena is as it was, and the error says what was asked and
// what each device had free.
func (m *Arena) Grow(n uint64) error {
	if m.unmade() {
		return unmade("Arena.Grow", "New")
	}
	err := m.a.Grow(n)
	m.checkAfter("grow", err)
	return errors.Wrap(err, "multidev")
}

// Shrink shortens the arena by n bytes. The chunks stay committed, with
// their grants, until Trim.
func (m *Arena) Shrink(n uint64) error {
	if m.unmade() {
		return unmade("Arena.Shrink", "New")
	}
	return errors.Wrap(m.a.Shrink(n), "multidev")
}

// Trim unmaps the chunks lying wholly past Len and returns their memory to
// their devices; their grants go with them.
func (m *Arena) Trim() error {
	if m.unmade() {
		return unmade("Arena.Trim", "New")
	}
	return errors.Wrap(m.a.Trim(), "multidev: trim")
}

// Close unmaps and releases every chunk and frees the reservation, after
// the reads and writes in flight. Later calls are ErrClosed.
func (m *Arena) Close() error {
	if m.unmade() {
		return unmade("Arena.Close", "New")
	}
	m.grants.Lock()
	defer m.grants.Unlock()
	return errors.Wrap(m.a.Close(), "multidev: close")
}

// checkAfter runs Check after a change that succeeded, in invariants
// builds.
func (m *Arena) checkAfter(op string, err error) {
	if invariants.Enabled && err == nil {
		invariants.Fail("multidev: "+op, m.Check())
	}
}

// Check verifies the arena's invariants — its arena's, and that every
// device holding a grant over another device's memory can reach it — and
// returns every violation.
func (m *Arena) Check() error {
	if m.unmade() {
		return unmade("Arena.Check", "New")
	}
	errs := m.a.Check()
	cs := m.ChunkSize()
	for _, e := range m.a.Layout() {
		for off := e.Offset; off < e.Offset+e.Size; off += cs {
			for d := range m.ndev {
				dev := driver.DeviceID(d)
				acc, err := m.a.AccessAt(dev, off)
				if err != nil || acc == driver.AccessNone || dev == e.Device {
					continue
				}
				if ok, err := m.Reachable(dev, e.Device); err != nil || !ok {
					errs = errors.CombineErrors(errs, errors.AssertionFailedf(
						"multidev: device %d holds %s access over the chunk at %#x on device %d, which it cannot reach (%v)",
						d, acc, off, e.Device, err))
				}
			}
		}
	}
	return errs
}
