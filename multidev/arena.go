package multidev

import (
	"fmt"
	"slices"
	"strings"
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

// chunkAt is one committed chunk and the grants over it.
type chunkAt struct {
	c *physical.Chunk
	// access[d] is what device d may do over the whole chunk.
	access []driver.Access
}

func (c chunkAt) dev() driver.DeviceID { return c.c.Device() }

// Arena is growable memory at a fixed base whose chunks lie on several
// devices. Safe for concurrent use.
type Arena struct {
	space   *vaspace.Space
	mem     *physical.Memory
	drv     driver.Driver
	streams driver.Streams // nil: no device reaches another's memory
	devs    []driver.Device
	res     *vaspace.Reservation
	tab     *mapping.Table
	opts    Options

	// The locks, in the order they are taken (see the package doc).
	ops     sync.Mutex
	writing sync.RWMutex
	moving  sync.RWMutex
	mu      sync.Mutex

	// chunks[i] is mapped at Base + i×ChunkSize; committed is
	// len(chunks)×ChunkSize and Len never exceeds it.
	chunks []chunkAt
	length uint64
	closed bool
}

// New reserves opts.Max of address space for an arena whose chunks are
// placed by opts.Placement. No memory is committed until it grows.
func New(space *vaspace.Space, mem *physical.Memory, opts Options) (*Arena, error) {
	drv := space.Driver()
	if mem.Driver() != drv {
		return nil, errors.Wrap(driver.ErrInvalid, "multidev: the address space and the physical memory are on different drivers")
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
	if err := driver.CheckSize(func() string { return what() + ": chunk size" }, cs, drv.Granularity()); err != nil {
		return nil, err
	}
	if b, ok := opts.Placement.(blocked); ok {
		if b.per == 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: zero bytes per device", what())
		}
		if b.per%cs != 0 {
			return nil, errors.Wrapf(driver.ErrMisaligned, "%s: %s per device is not a multiple of the chunk size %s",
				what(), units.Bytes(b.per), units.Bytes(cs))
		}
	}
	if ex, ok := opts.Placement.(explicit); ok && ex.fn == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the explicit placement has no function", what())
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
	res, err := space.Reserve(size, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), res.Free())
	}
	opts.Max = size
	a := &Arena{space: space, mem: mem, drv: drv, devs: devs, res: res, tab: tab, opts: opts}
	if s, ok := drv.(driver.Streams); ok && drv.Supports(driver.FeatureStreams) {
		a.streams = s
	}
	return a, nil
}

// Base is the arena's first address; it never changes.
func (a *Arena) Base() driver.Addr { return a.res.Base() }

// Max is the most the arena can grow to.
func (a *Arena) Max() uint64 { return a.opts.Max }

// ChunkSize is the size of every chunk.
func (a *Arena) ChunkSize() uint64 { return a.opts.ChunkSize }

// Placement is the arena's placement policy.
func (a *Arena) Placement() Placement { return a.opts.Placement }

// Len is the arena's length: [Base, Base+Len) may be read and written by
// the devices granted access.
func (a *Arena) Len() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.length
}

// Committed is the bytes of chunks mapped: Len rounded up to whole chunks,
// plus any not yet trimmed.
func (a *Arena) Committed() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.committedLocked()
}

func (a *Arena) committedLocked() uint64 { return uint64(len(a.chunks)) * a.opts.ChunkSize }

func (a *Arena) at(i int) driver.Addr { return a.Base() + driver.Addr(uint64(i)*a.opts.ChunkSize) }

func (a *Arena) errClosed(op string) error {
	return driver.Closed("multidev: " + op + " on a closed arena")
}

// Extent is a maximal run of chunks on one device.
type Extent struct {
	Range  vaspace.Range
	Device driver.DeviceID
}

// Layout lists the committed memory as maximal runs of chunks on one
// device, in address order (empty when nothing is committed or the arena is
// closed).
func (a *Arena) Layout() []Extent {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Extent
	cs := a.opts.ChunkSize
	for i, ch := range a.chunks {
		if n := len(out); n > 0 && out[n-1].Device == ch.dev() {
			out[n-1].Range.Size += cs
			continue
		}
		out = append(out, Extent{Range: vaspace.Range{Base: a.at(i), Size: cs}, Device: ch.dev()})
	}
	return out
}

// DeviceAt reports the device whose memory backs offset off.
func (a *Arena) DeviceAt(off uint64) (driver.DeviceID, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, a.errClosed("device at")
	}
	if off >= a.committedLocked() {
		return 0, errors.Wrapf(driver.ErrNotMapped, "multidev: device at offset %#x: the arena has %s committed",
			off, units.Bytes(a.committedLocked()))
	}
	return a.chunks[off/a.opts.ChunkSize].dev(), nil
}

// freeLocked returns the free bytes of every device, as physical memory
// counts them.
func (a *Arena) freeLocked() []uint64 {
	free := make([]uint64, len(a.devs))
	for d := range free {
		if u, err := a.mem.Usage(driver.DeviceID(d)); err == nil {
			free[d] = u.Capacity - u.Used
		}
	}
	return free
}

// describeFree says how much every device has free: "device 0 has 64 KiB
// free, device 1 has 0 B free".
func (a *Arena) describeFree() string {
	var b strings.Builder
	for d, f := range a.freeLocked() {
		if d > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "device %d has %s free", d, units.Bytes(f))
	}
	return b.String()
}

// Grow lengthens the arena by n bytes, mapping chunks at its end on the
// devices the placement names when Len passes what is committed. If a
// chunk cannot be placed, the chunks this call mapped are unmapped and
// released: the arena is as it was, and the error says what was asked and
// what each device had free.
func (a *Arena) Grow(n uint64) error {
	a.ops.Lock()
	defer a.ops.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("grow")
	}
	what := func() string {
		return fmt.Sprintf("multidev: grow by %s from %s (committed %s, max %s)",
			units.Bytes(n), units.Bytes(a.length), units.Bytes(a.committedLocked()), units.Bytes(a.opts.Max))
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
	if committed := a.committedLocked(); newLen > committed {
		cs := a.opts.ChunkSize
		need := int((newLen - committed + cs - 1) / cs)
		if err := a.commitLocked(need, what); err != nil {
			return err
		}
	}
	a.length = newLen
	return nil
}

// commitLocked maps need more chunks at the end, all or nothing.
func (a *Arena) commitLocked(need int, what func() string) error {
	start := len(a.chunks)
	free := a.freeLocked()
	for k := range need {
		i := start + k
		if err := a.placeLocked(i, free); err != nil {
			rerr := a.unmapFromLocked(start)
			if rerr != nil {
				rerr = errors.WithAssertionFailure(errors.Wrap(rerr, "multidev: rolling back a failed grow"))
			}
			return errors.CombineErrors(errors.Wrapf(err, "%s: needed %d more chunk(s) of %s; %s",
				what(), need, units.Bytes(a.opts.ChunkSize), a.describeFree()), rerr)
		}
	}
	return nil
}

// placeLocked creates chunk i on the first device of the placement's order
// with room (the first only, under FailWhenFull) and maps it; free is
// lowered by what it took. On failure nothing is left behind.
func (a *Arena) placeLocked(i int, free []uint64) error {
	cs := a.opts.ChunkSize
	off := uint64(i) * cs
	order := a.opts.Placement.Order(off, i, slices.Clone(free))
	where := func() string {
		return fmt.Sprintf("chunk %d at offset %#x, placed %s", i, off, a.opts.Placement)
	}
	if len(order) == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: the placement named no device", where())
	}
	for _, d := range order {
		if err := driver.CheckDevice(where, d, len(a.devs)); err != nil {
			return err
		}
	}
	var full []string
	for _, d := range order {
		if free[d] < cs {
			full = append(full, fmt.Sprintf("device %d has %s free", d, units.Bytes(free[d])))
			if a.opts.OnFull == FailWhenFull {
				break
			}
			continue
		}
		c, err := a.mem.Create(d, cs, driver.ChunkOptions{})
		if errors.Is(err, driver.ErrOutOfMemory) {
			// Memory taken by another physical memory on the driver: the
			// books said there was room, the device has none.
			free[d] = 0
			full = append(full, err.Error())
			if a.opts.OnFull == FailWhenFull {
				break
			}
			continue
		}
		if err != nil {
			return errors.Wrapf(err, "%s", where())
		}
		if err := a.tab.Map(a.at(i), c); err != nil {
			return errors.CombineErrors(errors.Wrapf(err, "%s", where()), c.Release())
		}
		a.chunks = append(a.chunks, chunkAt{c: c, access: make([]driver.Access, len(a.devs))})
		free[d] -= cs
		return nil
	}
	return errors.WithHintf(
		errors.Wrapf(driver.ErrOutOfMemory, "%s (%s): no room: %s", where(), a.opts.OnFull, strings.Join(full, "; ")),
		"trim or free memory on the devices named, or place chunks on others")
}

// unmapFromLocked unmaps and releases chunks[i:], last first.
func (a *Arena) unmapFromLocked(i int) error {
	for j := len(a.chunks) - 1; j >= i; j-- {
		if err := a.tab.Unmap(a.at(j)); err != nil {
			return err
		}
		c := a.chunks[j].c
		a.chunks = a.chunks[:j]
		if err := c.Release(); err != nil {
			return err
		}
	}
	return nil
}

// Shrink shortens the arena by n bytes. The chunks stay committed, with
// their grants, until Trim.
func (a *Arena) Shrink(n uint64) error {
	a.ops.Lock()
	defer a.ops.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("shrink")
	}
	if n > a.length {
		return errors.Wrapf(driver.ErrInvalid, "multidev: shrink by %s: the arena is only %s long",
			units.Bytes(n), units.Bytes(a.length))
	}
	a.length -= n
	return nil
}

// Trim unmaps the chunks lying wholly past Len and returns their memory to
// their devices; their grants go with them.
func (a *Arena) Trim() error {
	a.ops.Lock()
	defer a.ops.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("trim")
	}
	keep := int((a.length + a.opts.ChunkSize - 1) / a.opts.ChunkSize)
	if err := a.unmapFromLocked(keep); err != nil {
		return errors.Wrap(err, "multidev: trim")
	}
	return nil
}

// Close unmaps and releases every chunk and frees the reservation, after
// the reads and writes in flight. Later calls are ErrClosed.
func (a *Arena) Close() error {
	a.ops.Lock()
	defer a.ops.Unlock()
	a.writing.Lock()
	defer a.writing.Unlock()
	a.moving.Lock()
	defer a.moving.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errClosed("close")
	}
	if err := a.unmapFromLocked(0); err != nil {
		return errors.Wrap(err, "multidev: close")
	}
	a.length = 0
	if err := a.tab.Close(); err != nil {
		return errors.Wrap(err, "multidev: close")
	}
	if err := a.res.Free(); err != nil {
		return errors.Wrap(err, "multidev: close")
	}
	a.closed = true
	return nil
}
