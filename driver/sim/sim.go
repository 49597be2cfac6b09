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
package sim

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/driver/internal/queue"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/units"
)

// The simulated address space: [spaceBase, spaceBase+spaceSize), well clear
// of zero so that a zero Addr is never handed out.
const (
	spaceBase = 1 << 40
	spaceSize = 1<<47 - spaceBase
)

// Options configure a sim driver. Zero fields take the defaults.
type Options struct {
	// Devices is the number of devices (default 1).
	Devices int
	// Capacity is each device's capacity (default 80 GiB).
	Capacity uint64
	// Granularity is each device's minimum granularity (default 2 MiB);
	// the recommended granularity is max(Granularity, 2 MiB).
	Granularity uint64
}

// Driver is the sim driver. It implements driver.Driver.
type Driver struct {
	*ledger.Ledger
	*queue.Engine

	mu   sync.Mutex
	host map[*byte]int // HostAlloc buffers: first byte -> length
}

var (
	_ driver.Driver  = (*Driver)(nil)
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
	l, err := ledger.New("sim", devs, &backend{space: extent.New(spaceBase, spaceSize)}, true)
	if err != nil {
		return nil, err
	}
	return &Driver{Ledger: l, Engine: queue.New("sim", opts.Devices, func(_, _ driver.DeviceID) bool { return true }),
		host: map[*byte]int{}}, nil
}

// Close implements driver.Driver: streams finish, then the books close.
func (d *Driver) Close() error {
	if d.Engine.Closed() {
		return driver.Closed("sim: close: closed already")
	}
	err := d.Engine.Close() // failures of stream work not yet reported
	return errors.CombineErrors(err, d.Ledger.Close())
}

// The sim driver's streams run host functions, record and wait on events
// like any driver's; copies and fills have no memory to touch.

func (d *Driver) unsupported(op string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "sim: %s: the sim driver has no memory behind its addresses", op),
		"use the host driver to move bytes")
}

// CopyHtoD implements driver.Streams: ErrUnsupported.
func (d *Driver) CopyHtoD(driver.Addr, []byte, driver.Stream) error {
	return d.unsupported("copy to device")
}

// CopyDtoH implements driver.Streams: ErrUnsupported.
func (d *Driver) CopyDtoH([]byte, driver.Addr, driver.Stream) error {
	return d.unsupported("copy from device")
}

// CopyDtoD implements driver.Streams: ErrUnsupported.
func (d *Driver) CopyDtoD(_, _ driver.Addr, _ uint64, _ driver.Stream) error {
	return d.unsupported("copy device to device")
}

// Memset implements driver.Streams: ErrUnsupported.
func (d *Driver) Memset(driver.Addr, byte, uint64, driver.Stream) error { return d.unsupported("fill") }

// HostAlloc implements driver.Streams with Go memory aligned to 64 bytes
// (nothing is pinned: there is no device to copy to).
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.Closed() {
		return nil, driver.Closed("sim: host alloc")
	}
	if size == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "sim: host alloc of zero bytes")
	}
	raw := make([]byte, size+64)
	off := (64 - uintptr(unsafe.Pointer(&raw[0]))%64) % 64
	b := raw[off : off+uintptr(size) : off+uintptr(size)]
	d.mu.Lock()
	defer d.mu.Unlock()
	d.host[&b[0]] = len(b)
	return b, nil
}

// HostFree implements driver.Streams.
func (d *Driver) HostFree(b []byte) error {
	if d.Closed() {
		return driver.Closed("sim: host free")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(b) == 0 || d.host[&b[0]] != len(b) {
		return errors.Wrap(driver.ErrInvalid, "sim: host free of a buffer HostAlloc did not give (or not whole, or freed already)")
	}
	delete(d.host, &b[0])
	return nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return "sim" }

// Supports implements driver.Driver: sim chunks can be marked shareable (the
// mark is recorded), but there are no bytes to touch.
func (d *Driver) Supports(f driver.Feature) bool {
	return f == driver.FeatureShareable || f == driver.FeatureStreams
}

// Read implements driver.Driver: always ErrUnsupported, since the sim driver
// has no memory.
func (d *Driver) Read(addr driver.Addr, p []byte) error { return d.touch("read", addr, p) }

// Write implements driver.Driver: always ErrUnsupported.
func (d *Driver) Write(addr driver.Addr, p []byte) error { return d.touch("write", addr, p) }

func (d *Driver) touch(op string, addr driver.Addr, p []byte) error {
	return d.WithRange(op, addr, uint64(len(p)), driver.AccessNone, func(*ledger.Region) error {
		return errors.WithHint(errors.Wrap(driver.ErrUnsupported, "the sim driver has no memory behind its addresses"),
			"use the host driver to read and write bytes")
	})
}

// backend hands out simulated addresses and otherwise does nothing.
type backend struct {
	space *extent.Set
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
func (b *backend) Map(*ledger.Mapping) error  { return nil }
func (b *backend) Unmap(*ledger.Mapping) error {
	return nil
}
func (b *backend) Protect(*ledger.Region, driver.Addr, uint64, driver.Access, driver.Access) error {
	return nil
}
func (b *backend) Close() error { return nil }
