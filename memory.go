package vmarena

import (
	stderrors "errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Options say which driver Open opens and where its allocator draws from.
// Zero fields take the defaults.
type Options struct {
	// Driver is the backend: "host" (the default: this machine's memory
	// behind logical devices), "sim" (books only, devices of any size),
	// "cuda" (NVIDIA GPUs) or "acl" (Ascend NPUs).
	Driver string
	// Devices is how many devices to open: on host and sim the number of
	// logical devices (default 1), on cuda and acl the first Devices of
	// the runtime's (default: every one).
	Devices int
	// Capacity is each device's capacity. Default: on host a safe share of
	// the machine's free memory, on sim 80 GiB, on cuda and acl the
	// device's memory (a Capacity there caps it).
	Capacity uint64
	// Granularity is each device's minimum granularity on host and sim
	// (default 2 MiB); cuda and acl report their devices' own.
	Granularity uint64
	// Library is the vendor library cuda or acl loads (default
	// $VMARENA_CUDA_LIBRARY or libcuda.so.1, $VMARENA_ACL_LIBRARY or
	// libascendcl.so).
	Library string
	// Device is the device the allocator, arenas and KV caches draw
	// from (default 0).
	Device DeviceID
	// Max is the most memory the allocator may hold committed (default:
	// the device's capacity).
	Max uint64
}

// drivers are the backends Options.Driver names.
var drivers = []string{"host", "sim", "cuda", "acl"}

// A Memory is an open driver with its address space, its physical memory
// and an allocator on one device, and everything made from it (NewArena,
// NewKVCache, NewPool, NewMultiDeviceArena, NewSleep, NewTransfer).
// Close closes them all, the latest made first, then the address space,
// the physical memory and the driver. Safe for concurrent use.
//
// Invariant: while the Memory is open, drv, space and mem are open, made
// holds the objects made from them not yet closed by Close (the
// allocator first), and every one of them lives on space and mem. mu is
// never held while something is closed: what Close closes may wait for
// the caller's code (a KV cache's Events, a host function ahead of a
// pool's free), which may call the Memory.
type Memory struct {
	drv   driver.Driver
	space *vaspace.Space
	mem   *physical.Memory
	al    *arena.Allocator
	dev   DeviceID

	// closeMu serialises Close; it is taken before mu, and held while
	// Close closes what it closes, mu not.
	closeMu sync.Mutex
	mu      sync.Mutex // guards made, lower, closing and closed
	made    []closer   // in the order made; Close goes from the end
	// lower are the space, the memory and the driver, in the order Close
	// closes them; a Close that fails part-way leaves the rest here.
	lower []closer
	// closing is set by the first Close: nothing more is made after it;
	// closed once everything is closed.
	closing, closed bool
}

// closer is one thing a Memory closes, named for its messages.
type closer struct {
	name  string
	close func() error
}

// Open opens the driver opts name, its address space and physical memory,
// and an allocator on opts.Device with the defaults of package arena:
// address space reserved far beyond Max, memory committed in the device's
// recommended granularity where allocations lie and given back when
// wholly free. Nothing is committed yet. Bad options are refused
// (ErrInvalid, ErrNoDevice), and a failure closes whatever Open had
// opened.
func Open(opts Options) (*Memory, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	drv, err := opts.open()
	if err != nil {
		return nil, errors.Wrapf(err, "vmarena: open the %s driver", opts.driver())
	}
	if n := len(drv.Devices()); int(opts.Device) >= n {
		err := errors.WithHintf(
			errors.Wrapf(driver.ErrNoDevice, "vmarena: open: Device %d, but the %s driver has %d device(s)", opts.Device, opts.driver(), n),
			"name a device from 0 to %d, or open more with Options.Devices", n-1)
		return nil, errors.CombineErrors(err, drv.Close())
	}
	m := &Memory{drv: drv, space: vaspace.New(drv), mem: physical.New(drv), dev: opts.Device}
	m.lower = []closer{
		{"the address space", m.space.Close},
		{"the physical memory", m.mem.Close},
		{"the " + opts.driver() + " driver", drv.Close},
	}
	m.al, err = arena.NewAllocator(m.space, m.mem, arena.AllocatorOptions{Device: opts.Device, Max: opts.Max})
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "vmarena: open"), m.Close())
	}
	m.made = []closer{{"the allocator", m.al.Close}}
	return m, nil
}

func (o Options) driver() string {
	if o.Driver == "" {
		return "host"
	}
	return o.Driver
}

// check refuses options no driver could take, naming the field.
func (o Options) check() error {
	name := o.driver()
	vendor := name == "cuda" || name == "acl"
	invalid := func(hint, format string, args ...any) error {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "vmarena: open: "+format, args...), hint)
	}
	switch {
	case !slices.Contains(drivers, name):
		return invalid("Options.Driver is host (the default), sim, cuda or acl", "unknown driver %q", o.Driver)
	case o.Devices < 0 || o.Devices > driver.MaxDevices:
		return invalid(fmt.Sprintf("Options.Devices is 0 (the default) to %d", driver.MaxDevices), "Devices %d", o.Devices)
	case o.Device < 0:
		return errors.WithHint(errors.Wrapf(driver.ErrNoDevice, "vmarena: open: Device %d", o.Device),
			"devices are numbered from 0")
	case vendor && o.Granularity != 0:
		return invalid("leave Options.Granularity 0 on cuda and acl: the driver reports the devices' own",
			"Granularity %s on the %s driver", units.Bytes(o.Granularity), name)
	case !vendor && o.Library != "":
		return invalid("Options.Library is for cuda and acl: leave it empty on host and sim",
			"Library %q on the %s driver", o.Library, name)
	}
	return nil
}

// open opens the driver.
func (o Options) open() (driver.Driver, error) {
	var ords []int
	for i := range o.Devices {
		ords = append(ords, i)
	}
	switch o.driver() {
	case "sim":
		return sim.New(sim.Options{Devices: o.Devices, Capacity: o.Capacity, Granularity: o.Granularity})
	case "cuda":
		return cuda.Open(cuda.Options{Library: o.Library, Devices: ords, Capacity: o.Capacity})
	case "acl":
		return acl.Open(acl.Options{Library: o.Library, Devices: ords, Capacity: o.Capacity})
	}
	return host.New(host.Options{Devices: o.Devices, Capacity: o.Capacity, Granularity: o.Granularity})
}

// unmade is the error of method called on a nil or zero Memory.
func unmade(method string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "vmarena: Memory.%s on a nil or zero value", method),
		"make one with vmarena.Open")
}

func (m *Memory) unmade() bool { return m == nil || m.drv == nil }

// Driver is the open driver: its devices, their capacity and granularity
// (Devices), and on sim the calls it counted (sim.Driver's Tally). The
// Memory closes it: do not close it yourself.
func (m *Memory) Driver() driver.Driver {
	if m.unmade() {
		return nil
	}
	return m.drv
}

// Device is the device the allocator, arenas and KV caches draw from.
func (m *Memory) Device() DeviceID {
	if m.unmade() {
		return 0
	}
	return m.dev
}

// Allocator is the allocator Open made on Options.Device: Alloc and Free,
// Bytes of an allocation (host memory), tensors (tensor.Empty), Stats,
// Trim. The Memory's Close closes it.
func (m *Memory) Allocator() *arena.Allocator {
	if m.unmade() {
		return nil
	}
	return m.al
}

// NewArena makes an arena on the Memory's device that can grow to max
// bytes (rounded up to whole chunks): a fixed base, memory committed as it
// grows (Grow, Append) and given back as it shrinks. Close closes it if
// it is still open.
func (m *Memory) NewArena(max uint64) (*arena.Arena, error) {
	if m.unmade() {
		return nil, unmade("NewArena")
	}
	return add(m, "an arena", func() (*arena.Arena, error) {
		return arena.New(m.space, m.mem, arena.Options{Device: m.dev, Max: max})
	}, (*arena.Arena).Close)
}

// NewKVCache makes a KV cache of cfg's shape (kvcache.Preset names some)
// on cfg.Device. Close closes it if it is still open.
func (m *Memory) NewKVCache(cfg kvcache.Config) (*kvcache.Cache, error) {
	if m.unmade() {
		return nil, unmade("NewKVCache")
	}
	return add(m, "a KV cache", func() (*kvcache.Cache, error) { return kvcache.New(m.space, m.mem, cfg) }, (*kvcache.Cache).Close)
}

// add makes an object with make under m's lock and records it for Close.
func add[T any](m *Memory, name string, make func() (T, error), close func(T) error) (T, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var zero T
	if m.closing {
		return zero, driver.Closed("vmarena: make " + name + ": the Memory is closed")
	}
	x, err := make()
	if err != nil {
		return zero, err
	}
	m.made = append(m.made, closer{name, func() error { return close(x) }})
	return x, nil
}

// Close closes everything the Memory made, the latest first (KV caches
// and arenas, then the allocator), and, once all of them are closed, the
// address space, the physical memory and the driver. One that refuses
// (ErrBusy: allocations, views or tensors still live) stops it before
// the layers under it, which would otherwise take memory from under what
// is still in use; the others are closed all the same, the errors
// combined, and Close may be called again once the refusal's cause is
// gone. Something closed already by hand counts as closed. Once all is
// closed, Close returns nil again.
//
// What Close closes may wait for code of the caller's (a KV cache tells
// its Events, a pool waits for the work ahead of its frees in flight),
// and that code may call the Memory meanwhile: Usage answers, the makers
// refuse (ErrClosed). A Close called there waits for the one running,
// which waits for it: Close must not be called from such code. Calls of
// Close from several goroutines run one at a time.
func (m *Memory) Close() error {
	if m.unmade() {
		return unmade("Close")
	}
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	// Only a Close changes made and lower once closing is set, and
	// closeMu lets one run at a time: what it reads here stays as read
	// until it stores what is left.
	m.mu.Lock()
	closed := m.closed
	m.closing = true
	made, lower := m.made, m.lower
	m.mu.Unlock()
	if closed {
		return nil
	}
	var left []closer
	var errs []error
	for i := len(made) - 1; i >= 0; i-- {
		if err := made[i].close(); err != nil && !errors.Is(err, driver.ErrClosed) {
			left = append(left, made[i])
			errs = append(errs, errors.Wrapf(err, "vmarena: close %s", made[i].name))
		}
	}
	slices.Reverse(left)
	m.mu.Lock()
	m.made = left
	m.mu.Unlock()
	if len(errs) > 0 {
		return errors.WithHint(combine(errs),
			"call Close again once what holds them is released: it carries on where it stopped")
	}
	// The lower layers go in order, each after the one above it: the
	// space before the memory (its Close refuses while anything is
	// mapped, so no chunk goes from under a mapping), the driver last.
	for len(lower) > 0 {
		c := lower[0]
		if err := c.close(); err != nil && !errors.Is(err, driver.ErrClosed) {
			m.mu.Lock()
			m.lower = lower
			m.mu.Unlock()
			return errors.Wrapf(err, "vmarena: close %s", c.name)
		}
		lower = lower[1:]
	}
	m.mu.Lock()
	m.lower, m.closed = nil, true
	m.mu.Unlock()
	return nil
}

// combine returns the one error, or all of them joined (errors.Is finds
// the sentinel of each, with either errors package).
func combine(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return stderrors.Join(errs...)
}
