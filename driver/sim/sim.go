// Package sim is a driver with no memory behind it: reservations, chunks,
// mappings and access are recorded exactly as the host driver records them
// (both keep the same ledger), capacity is whatever the caller says — eight
// 80 GiB GPUs on a 24 GiB machine — and every attempt to touch the bytes is
// refused with driver.ErrUnsupported.
//
// It exists to replay allocation traces and serving traces at the scale of
// real accelerators, and to plan for devices larger than this machine. It
// never makes a memory system call: its addresses are numbers from a
// simulated 47-bit address space that no process can dereference.
//
// It counts the calls that change its record — Reserve, Unreserve,
// Create, Release, Map, Unmap and SetAccess, one for each call that
// succeeded, per device where the call has one — and prices them with a
// table of per-call costs measured on a GPU (Options.Costs, A100 by
// default): Tally says how much driver time a framework would have spent
// on what it did (calls.go).
package sim

//go:generate go run ../internal/forward -docs forward.txt -out forward.go books=../internal/ledger:Ledger engine=../internal/queue:Engine

import (
	"fmt"
	"math"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/driver/internal/queue"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
)

// The simulated address space: [spaceBase, spaceBase+spaceSize), well clear
// of zero so that a zero Addr is never handed out.
const (
	spaceBase = 1 << 40
	spaceSize = 1<<47 - spaceBase
)

// AddressSpace is the bytes of simulated address space a sim driver
// reserves from (127 TiB): what ranges over it, together, can span.
const AddressSpace = spaceSize

// Options configure a sim driver. Zero fields take the defaults.
type Options struct {
	// Devices is the number of devices (default 1).
	Devices int
	// Capacity is each device's capacity (default 80 GiB).
	Capacity uint64
	// Granularity is each device's minimum granularity (default 2 MiB);
	// the recommended granularity is max(Granularity, 2 MiB).
	Granularity uint64
	// Costs prices the driver's calls (Tally); the zero value is A100. A
	// negative cost is ErrInvalid.
	Costs CallCosts
	// HostMemory bounds the host buffers HostAlloc lends, the live ones
	// together (default: the machine's physical memory on Linux, none
	// elsewhere). They are real memory of this process, so a bound past
	// what the machine has free lets an allocation run the process out of
	// memory as any other would; it is cut to the largest buffer Go can
	// make.
	HostMemory uint64
}

// Driver is the sim driver. It implements driver.Driver and
// driver.Streams. Its methods are safe for concurrent use.
type Driver struct {
	// books checks every call against the contract and records the
	// reservations, chunks, mappings and access it made.
	books   *ledger.Ledger
	backend *backend
	engine  *queue.Engine // the streams and events

	hb queue.HostBuffers // what HostAlloc handed out
	// host counts the bytes of the live host buffers, within hostMax
	// (Options.HostMemory).
	host struct {
		sync.Mutex
		live, max uint64
	}

	costs CallCosts // prices the calls counted (Tally)
	// calls serializes the calls that change the record (the ledger
	// serializes them too, under its write lock), so that the device the
	// backend noted during one is that call's, and guards the counts.
	// Lock order: calls, then the ledger's lock, which the books' methods
	// take; the backend, which runs under the ledger's lock, never takes
	// calls.
	calls struct {
		lockrank.Mutex[lockrank.SimCalls]
		space   Calls   // Reserve and Unreserve
		devices []Calls // the rest, indexed by DeviceID
	}
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Books   = (*Driver)(nil)
	_ driver.Streams = (*Driver)(nil)
)

// New returns a sim driver.
func New(opts Options) (*Driver, error) {
	if opts.Devices == 0 {
		opts.Devices = 1
	}
	if opts.Capacity == 0 {
		opts.Capacity = 80 * units.GiB
	}
	if opts.Granularity == 0 {
		opts.Granularity = 2 * units.MiB
	}
	if opts.Costs == (CallCosts{}) {
		opts.Costs = A100
	}
	if err := opts.Costs.check(); err != nil {
		return nil, err
	}
	g := opts.Granularity
	if g&(g-1) != 0 || g < 4*units.KiB {
		return nil, errors.Wrapf(driver.ErrInvalid, "sim: granularity %d is not a power of two of at least 4 KiB", g)
	}
	if opts.Devices < 0 || opts.Capacity%g != 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "sim: %d devices of %d bytes: need a positive count and a capacity that is a multiple of the granularity %s",
			opts.Devices, opts.Capacity, units.Bytes(g))
	}
	devs := make([]driver.Device, opts.Devices)
	for i := range devs {
		devs[i] = driver.Device{
			ID: driver.DeviceID(i), Name: fmt.Sprintf("sim%d", i), Kind: driver.KindSim,
			Capacity: opts.Capacity, MinGranularity: g, RecommendedGranularity: max(g, 2*units.MiB), NUMANode: -1,
			CopyAlign: 1,
		}
	}
	b := &backend{space: extent.New(spaceBase, spaceSize), noted: -1}
	l, err := ledger.New("sim", devs, b, true)
	if err != nil {
		return nil, err
	}
	d := &Driver{books: l, backend: b, costs: opts.Costs,
		engine: queue.New("sim", opts.Devices, func(_, _ driver.DeviceID) bool { return true })}
	d.calls.devices = make([]Calls, opts.Devices)
	d.host.max = opts.HostMemory
	if d.host.max == 0 {
		d.host.max = machineMemory()
	}
	if d.host.max == 0 {
		d.host.max = math.MaxUint64
	}
	d.host.max = min(d.host.max, math.MaxInt-hostAlign)
	return d, nil
}

// Close releases and unreserves everything and takes no more HostAlloc
// buffers, then waits for the streams to finish their work; the error
// reports stream work that failed and was not yet reported. As the host
// driver does, it refuses with ErrBusy, naming them, and changes nothing
// while anything is mapped or a HostAlloc buffer is live; each check is
// one step with the closing, so memory mapped or allocated while Close
// runs makes it refuse or is refused itself, and stream work that runs
// while Close waits finds the driver closed. A second Close is ErrClosed,
// as is every later call.
func (d *Driver) Close() error {
	if d.unmade() {
		return errUnmade("Close")
	}
	if err := d.closeBooks(); err != nil {
		return err
	}
	return d.engine.Close() // failures of stream work not yet reported
}

// closeBooks is Close's first half: the host buffers and then the books
// (queue.HostBuffers.CloseWith).
func (d *Driver) closeBooks() error {
	return d.hb.CloseWith("sim", d.engine, d.books, d.engine.Close)
}

// tearDown closes d whatever is mapped or allocated: for tests, whose
// subtests may end with memory mapped (Close refuses then).
func (d *Driver) tearDown() error {
	if d.engine.Closed() {
		return nil
	}
	err := d.engine.Close()
	d.hb.Close()   // Go memory: nothing to give back
	d.calls.Lock() // the ledger's unmaps reach the backend, which notes their device
	defer d.calls.Unlock()
	return errors.CombineErrors(err, ledger.TearDown(d.books))
}

// Name is "sim".
func (d *Driver) Name() string { return "sim" }

// Supports reports true for FeatureStreams and FeatureShareable (a chunk
// can be created shareable and the mark is recorded, though there is no
// Export), and false for FeatureHostAccess: there are no bytes to touch.
func (d *Driver) Supports(f driver.Feature) bool {
	if d.unmade() {
		return false
	}
	return f == driver.FeatureShareable || f == driver.FeatureStreams
}

// Reserve holds size bytes of the simulated address space (no process can
// dereference its addresses), aligned to align (0 means Granularity()). A
// free hint, aligned so, is honoured; otherwise the range lands elsewhere.
// A size or hint that is not a multiple of the granularity is
// ErrMisaligned, a zero size or an align that is not a power of two
// ErrInvalid, and no free range of that size ErrOutOfMemory.
func (d *Driver) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	if d.unmade() {
		return *new(driver.Addr), errUnmade("Reserve")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	base, err := d.books.Reserve(size, align, hint)
	if err == nil {
		d.calls.space.Reserve++
	}
	return base, err
}

// Unreserve gives back a range Reserve returned, passed exactly as it was
// returned: any other range is ErrNotReserved. While anything inside is
// mapped it refuses with ErrBusy, naming the mappings.
func (d *Driver) Unreserve(base driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unreserve")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	err := d.books.Unreserve(base, size)
	if err == nil {
		d.calls.space.Unreserve++
	}
	return err
}

// Create records a chunk of size bytes on device dev, counted against the
// device's capacity; no memory is committed. size must be a multiple of the
// device's MinGranularity (ErrMisaligned); an unknown device is
// ErrNoDevice, and a chunk the device's free capacity cannot hold
// ErrOutOfMemory, naming what is free.
func (d *Driver) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	if d.unmade() {
		return *new(driver.Handle), errUnmade("Create")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	h, err := d.books.Create(dev, size, opts)
	if err == nil {
		d.calls.devices[dev].Create++
	}
	return h, err
}

// Release gives up the chunk h; an unknown or released handle is
// ErrBadHandle. Its size goes back to the device's capacity at once, or,
// while the chunk is mapped, when its last mapping is unmapped.
func (d *Driver) Release(h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Release")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	// The chunk's device, while it is recorded: the ledger reaches the
	// backend on Release only when nothing maps the chunk.
	var dev driver.DeviceID
	if len(d.calls.devices) > 1 {
		_ = d.books.WithChunk("release", h, func(c *ledger.Chunk) error {
			dev = c.Device
			return nil
		}) // an unknown or released handle: Release says so below
	}
	err := d.books.Release(h)
	if err == nil {
		d.calls.devices[dev].Release++
	}
	return err
}

// Map records the whole chunk h at addr, inaccessible to every device until
// SetAccess. addr must be a multiple of the chunk's device granularity
// (ErrMisaligned), the chunk must fit inside one reservation
// (ErrNotReserved) and cover no other mapping (ErrOverlap); an unknown or
// released handle is ErrBadHandle. A chunk may be mapped at several
// addresses at once.
func (d *Driver) Map(addr driver.Addr, h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Map")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	d.backend.noted = -1
	err := d.books.Map(addr, h)
	if err == nil {
		d.calls.devices[d.notedDevice("map")].Map++
	}
	return err
}

// Unmap removes the mapping that starts at addr and is size bytes long; the
// range is reserved again. Nothing mapped at addr is ErrNotMapped, a range
// that is not exactly one mapping ErrPartial, an address outside every
// reservation ErrNotReserved. A released chunk's size goes back to its
// device with its last mapping.
func (d *Driver) Unmap(addr driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unmap")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	d.backend.noted = -1
	err := d.books.Unmap(addr, size)
	if err == nil {
		d.calls.devices[d.notedDevice("unmap")].Unmap++
	}
	return err
}

// SetAccess records what device dev may do over [addr, addr+size), which
// may span several mappings but must be mapped throughout (ErrNotMapped)
// and start and end on granule boundaries (ErrMisaligned); an unknown
// device is ErrNoDevice, an access value other than the three defined
// ErrInvalid.
func (d *Driver) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if d.unmade() {
		return errUnmade("SetAccess")
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	err := d.books.SetAccess(addr, size, dev, a)
	if err == nil {
		d.calls.devices[dev].SetAccess++
	}
	return err
}

// notedDevice is the device a Map or Unmap (op) that succeeded counts
// on: that of the chunk the backend noted it placed or removed. A
// successful call reached the backend (the ledger records a mapping only
// after the backend made it); were none noted, builds with the invariants
// tag fail there, and others count the call on device 0 rather than lose
// it.
func (d *Driver) notedDevice(op string) driver.DeviceID {
	if d.backend.noted < 0 {
		invariants.Fail("sim: "+op, errors.AssertionFailedf("sim: %s succeeded without reaching the backend", op))
		return 0
	}
	return d.backend.noted
}

// Read is ErrUnsupported: the sim driver has no memory behind its
// addresses. A range outside every reservation is ErrNotReserved first.
func (d *Driver) Read(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Read")
	}
	return d.touch("read", addr, p)
}

// Write is ErrUnsupported: the sim driver has no memory behind its
// addresses. A range outside every reservation is ErrNotReserved first.
func (d *Driver) Write(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Write")
	}
	return d.touch("write", addr, p)
}

func (d *Driver) touch(op string, addr driver.Addr, p []byte) error {
	return d.books.WithRange(op, addr, uint64(len(p)), driver.AccessNone, func(*ledger.Region) error {
		return errors.WithHint(errors.Wrap(driver.ErrUnsupported, "the sim driver has no memory behind its addresses"),
			"use the host driver to read and write bytes")
	})
}

// backend hands out simulated addresses and otherwise does nothing but
// note, for the count of a Map or Unmap, the device of the chunk it
// placed or removed.
type backend struct {
	space *extent.Set
	// noted is the device of the chunk the last Map or Unmap reached,
	// -1 before one does. Written under the ledger's lock within a call
	// the driver's calls mutex serializes, and read under that mutex.
	noted driver.DeviceID
}

func (b *backend) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, any, error) {
	if hint != 0 && uint64(hint)%align == 0 && b.space.AllocAt(uint64(hint), size) {
		return hint, nil, nil
	}
	at, ok := b.space.Alloc(size, align)
	if !ok {
		return 0, nil, errors.Wrapf(driver.ErrOutOfMemory, "the simulated address space has no free range of %s (largest %s)",
			units.Bytes(size), units.Bytes(b.space.Largest()))
	}
	return driver.Addr(at), nil, nil
}

func (b *backend) Unreserve(r *ledger.Region) error {
	return b.space.Free(uint64(r.Base), r.Size)
}

func (b *backend) Commit(*ledger.Chunk) error { return nil }
func (b *backend) Free(*ledger.Chunk) error   { return nil }
func (b *backend) Map(m *ledger.Mapping) error {
	b.noted = m.Chunk.Device
	return nil
}
func (b *backend) Unmap(m *ledger.Mapping) error {
	b.noted = m.Chunk.Device
	return nil
}
func (b *backend) Protect(*ledger.Region, driver.Addr, uint64, driver.Access, driver.Access) error {
	return nil
}
func (b *backend) Close() error { return nil }

// unmade reports whether d is nil or a zero Driver, not one sim.New made:
// every method then answers ErrInvalid (and zero values) instead of
// dereferencing the books it does not have.
func (d *Driver) unmade() bool { return d == nil || d.books == nil || d.engine == nil }

// errUnmade is the refusal of method op on a driver New did not make.
func errUnmade(op string) error {
	return errors.Wrapf(driver.ErrInvalid, "sim: %s: the driver was not made by sim.New (nil or zero Driver)", op)
}
