package vmarena

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/sleep"
	"github.com/vmarena/vmarena/transfer"
)

// NewSleep makes a sleep manager on the Memory's driver, drawing from
// o.Device (as given: 0 is device 0; pass m.Device() for the Memory's):
// allocations under tags that sleep (their memory given back, their bytes
// kept in host memory, a file or dropped) and wake at the same addresses.
// Its tags reserve address space of their own, apart from the Memory's
// allocator. Close closes it if it is still open.
func (m *Memory) NewSleep(o sleep.Options) (*sleep.Manager, error) {
	if m.unmade() {
		return nil, unmade("NewSleep")
	}
	return add(m, "a sleep manager", func() (*sleep.Manager, error) { return sleep.New(m.drv, o) }, (*sleep.Manager).Close)
}

// NewPool makes a stream-ordered pool on props.Device (as given): its
// allocations are freed in stream order (pool.Pool's AllocAsync and
// FreeAsync) and reused without a driver call. Close destroys it if it
// is still alive, and refuses (ErrBusy) while it has live allocations.
func (m *Memory) NewPool(props pool.Props) (*pool.Pool, error) {
	if m.unmade() {
		return nil, unmade("NewPool")
	}
	return add(m, "a pool", func() (*pool.Pool, error) { return pool.New(m.space, m.mem, props) }, (*pool.Pool).Destroy)
}

// NewMultiDeviceArena makes an arena whose chunks lie on several of the
// Memory's devices, placed by opts.Placement (default: striped over all of
// them; open the Memory with Options.Devices > 1). Close closes it if it
// is still open.
func (m *Memory) NewMultiDeviceArena(opts multidev.Options) (*multidev.Arena, error) {
	if m.unmade() {
		return nil, unmade("NewMultiDeviceArena")
	}
	return add(m, "a multi-device arena", func() (*multidev.Arena, error) { return multidev.New(m.space, m.mem, opts) }, (*multidev.Arena).Close)
}

// NewTransfer makes a transfer engine (cfg.Kind "tcp", the default, or
// "ucx" in a build with UCX) listening at cfg.Listen, to register the
// tensors laid over this Memory's arenas, allocations and KV caches and
// to put and get them to and from peers. Close closes it, and with it
// its registrations and connections, before the objects made earlier.
func (m *Memory) NewTransfer(cfg transfer.Config) (*transfer.Engine, error) {
	if m.unmade() {
		return nil, unmade("NewTransfer")
	}
	return add(m, "a transfer engine", func() (*transfer.Engine, error) { return transfer.New(cfg) }, (*transfer.Engine).Close)
}

// A DeviceUsage is one device's memory as its driver's books count it.
type DeviceUsage struct {
	Device DeviceID
	// Used is what the device's live chunks hold: those of this Memory
	// and any other object or process's made through the same driver.
	Used uint64
	// Capacity is what the device may give out (Options.Capacity on host
	// and sim, the device's memory or its cap on cuda and acl).
	Capacity uint64
}

// Usage is each of the driver's devices' used bytes and capacity, read
// from the driver's own books (driver.Books). A driver without books
// (none that Open opens on Linux) is ErrUnsupported.
func (m *Memory) Usage() ([]DeviceUsage, error) {
	if m.unmade() {
		return nil, unmade("Usage")
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, driver.Closed("vmarena: usage: the Memory is closed")
	}
	b, ok := m.drv.(driver.Books)
	if !ok {
		return nil, errors.Wrapf(driver.ErrUnsupported, "vmarena: usage: the %s driver keeps no books to read", m.drv.Name())
	}
	devs := m.drv.Devices()
	u := make([]DeviceUsage, len(devs))
	for i, d := range devs {
		u[i] = DeviceUsage{Device: d.ID, Used: b.Used(d.ID), Capacity: d.Capacity}
	}
	return u, nil
}
