package drivertest

import (
	"bytes"
	stderrors "errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// fixture is one leaf subtest's driver and the facts about it that every
// check uses. Its helpers fail the test on any unexpected error, so a test
// reads as the sequence of calls it makes.
type fixture struct {
	t    *testing.T
	d    driver.Driver
	devs []driver.Device
	gran uint64 // d.Granularity(): the unit of reservations
	// oneDevice: the driver's reservations each bind one device's memory
	// (OneDeviceBinder).
	oneDevice bool
}

// OneDeviceBinder is a driver that may say each of its reservations binds
// the memory of one device, local or imported, never both at once
// (AscendCL's aclrtMapMem): its Map refuses the rest with ErrUnsupported,
// changing nothing. The suite checks that, and elsewhere places chunks of
// several devices side by side only where the driver allows it.
type OneDeviceBinder interface {
	ReservationsBindOneDevice() bool
}

// beside is the device of a chunk the tests map in a reservation that
// holds device 0's memory: dev, or device 0 itself where the driver's
// reservations bind one device. Access is still granted to dev.
func (f *fixture) beside(dev driver.DeviceID) driver.DeviceID {
	f.has(dev)
	if f.oneDevice {
		return 0
	}
	return dev
}

// probe is how many bytes host-access checks move at a time: small, because
// first touches are expensive on the host driver, and below every
// granularity (at least a 4 KiB page).
const probe = 256

// sentinels are the classes every driver error is marked with exactly one of.
var sentinels = []error{
	driver.ErrInvalid, driver.ErrMisaligned, driver.ErrOutOfMemory, driver.ErrNoDevice,
	driver.ErrNotReserved, driver.ErrOverlap, driver.ErrNotMapped, driver.ErrPartial,
	driver.ErrBadHandle, driver.ErrBusy, driver.ErrAccessDenied, driver.ErrUnsupported,
	driver.ErrClosed, driver.ErrNotAllocated, driver.ErrDeviceFault,
}

// RequireIs fails t unless err is marked with want and with no other
// sentinel, and its message contains every fragment. The layers above the
// driver use it too: their errors follow the same one-sentinel rule. Both
// the standard library's errors.Is and internal/errors' must find want.
func RequireIs(t testing.TB, err, want error, fragments ...string) {
	t.Helper()
	require.Errorf(t, err, "want an error marked %q, got none", want)
	require.Truef(t, errors.Is(err, want), "want an error marked %q, got: %v", want, err)
	require.Truef(t, stderrors.Is(err, want), "the standard library's errors.Is does not find %q in: %v", want, err)
	for _, s := range sentinels {
		if s != want {
			require.Falsef(t, errors.Is(err, s), "error is marked both %q and %q: %v", want, s, err)
		}
	}
	for _, frag := range fragments {
		require.Containsf(t, err.Error(), frag, "the message must name %q", frag)
	}
}

// CloseAtEnd registers a cleanup that closes d when the test ends and fails
// the test unless the close succeeds or d was closed already. A driver
// refuses to close while memory is mapped (ErrBusy), so a test that uses
// it fails here if it left a table, arena, allocator or pool open: every
// layer above the driver uses it to prove its objects let go of what they
// map. Register it first: cleanups run last-in first-out, so the test's own
// cleanups run before it.
func CloseAtEnd(t testing.TB, d interface{ Close() error }) {
	t.Helper()
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, driver.ErrClosed) {
			t.Errorf("closing the driver at the end of the test: %v (something the test made still maps memory)", err)
		}
	})
}

// requireIs fails the test unless err is marked with want alone and names
// every fragment.
func (f *fixture) requireIs(err, want error, fragments ...string) {
	f.t.Helper()
	RequireIs(f.t, err, want, fragments...)
}

// g is the minimum granularity of dev: the unit of its chunks, mapping
// addresses and access ranges.
func (f *fixture) g(dev driver.DeviceID) uint64 {
	f.has(dev)
	return f.devs[dev].MinGranularity
}

// has skips the test where the driver has no device dev: the suite runs on
// a machine with one GPU too, and the checks that need a second device
// (peer access, chunks of two devices side by side) then say so and stop.
func (f *fixture) has(dev driver.DeviceID) {
	f.t.Helper()
	if int(dev) >= len(f.devs) {
		f.t.Skipf("needs device %d: %s has %d device(s)", dev, f.d.Name(), len(f.devs))
	}
}

// hostAccess reports whether the driver moves bytes with Read and Write.
func (f *fixture) hostAccess() bool { return f.d.Supports(driver.FeatureHostAccess) }

// reserve holds size bytes of address space (a multiple of f.gran).
func (f *fixture) reserve(size uint64) driver.Addr {
	f.t.Helper()
	base, err := f.d.Reserve(size, 0, 0)
	require.NoError(f.t, err, "reserve %s", units.Bytes(size))
	require.Zerof(f.t, uint64(base)%f.gran, "reservation at %s is not aligned to the granularity %s", base, units.Bytes(f.gran))
	return base
}

// unreserved returns an address at which no reservation lives: the base of
// a range of size bytes that was reserved and given back.
func (f *fixture) unreserved(size uint64) driver.Addr {
	f.t.Helper()
	base := f.reserve(size)
	require.NoError(f.t, f.d.Unreserve(base, size))
	return base
}

// create commits a chunk of size bytes on dev.
func (f *fixture) create(dev driver.DeviceID, size uint64) driver.Handle {
	f.t.Helper()
	f.has(dev)
	h, err := f.d.Create(dev, size, driver.ChunkOptions{})
	require.NoError(f.t, err, "create %s on device %d", units.Bytes(size), dev)
	require.NotZero(f.t, h, "create returned the zero handle")
	return h
}

// mapAt maps chunk h at addr.
func (f *fixture) mapAt(addr driver.Addr, h driver.Handle) {
	f.t.Helper()
	require.NoError(f.t, f.d.Map(addr, h), "map chunk %d at %s", h, addr)
}

// mapNew creates a chunk of size bytes on dev and maps it at addr.
func (f *fixture) mapNew(addr driver.Addr, dev driver.DeviceID, size uint64) driver.Handle {
	f.t.Helper()
	h := f.create(dev, size)
	f.mapAt(addr, h)
	return h
}

// unmap removes the mapping [addr, addr+size).
func (f *fixture) unmap(addr driver.Addr, size uint64) {
	f.t.Helper()
	require.NoError(f.t, f.d.Unmap(addr, size), "unmap [%s, +%s)", addr, units.Bytes(size))
}

// setAccess grants dev access a over [addr, addr+size).
func (f *fixture) setAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) {
	f.t.Helper()
	f.has(dev)
	require.NoError(f.t, f.d.SetAccess(addr, size, dev, a), "set access of device %d over [%s, +%s) to %s",
		dev, addr, units.Bytes(size), a)
}

// requireAccess fails the test unless dev has exactly access want at addr.
func (f *fixture) requireAccess(addr driver.Addr, dev driver.DeviceID, want driver.Access) {
	f.t.Helper()
	f.has(dev)
	got, err := f.d.Access(addr, dev)
	require.NoError(f.t, err, "access of device %d at %s", dev, addr)
	require.Equal(f.t, want, got, "access of device %d at %s", dev, addr)
}

// requireOnly fails the test unless dev has access want at addr and every
// other device has none.
func (f *fixture) requireOnly(addr driver.Addr, dev driver.DeviceID, want driver.Access) {
	f.t.Helper()
	f.has(dev)
	for i := range f.devs {
		if driver.DeviceID(i) == dev {
			f.requireAccess(addr, dev, want)
		} else {
			f.requireAccess(addr, driver.DeviceID(i), driver.AccessNone)
		}
	}
}

// requireNone fails the test unless addr is mapped and no device may touch it.
func (f *fixture) requireNone(addr driver.Addr) {
	f.t.Helper()
	f.requireOnly(addr, 0, driver.AccessNone)
}

// requireNotMapped fails the test unless Access at addr says ErrNotMapped
// for every device.
func (f *fixture) requireNotMapped(addr driver.Addr) {
	f.t.Helper()
	for i := range f.devs {
		_, err := f.d.Access(addr, driver.DeviceID(i))
		f.requireIs(err, driver.ErrNotMapped)
	}
}

// write copies p to addr through the host.
func (f *fixture) write(addr driver.Addr, p []byte) {
	f.t.Helper()
	require.NoError(f.t, f.d.Write(addr, p), "write %d bytes at %s", len(p), addr)
}

// requireBytes fails the test unless the host reads want at addr.
func (f *fixture) requireBytes(addr driver.Addr, want []byte) {
	f.t.Helper()
	got := make([]byte, len(want))
	require.NoError(f.t, f.d.Read(addr, got), "read %d bytes at %s", len(got), addr)
	require.Truef(f.t, bytes.Equal(want, got), "read at %s: got % x..., want % x...", addr, head(got), head(want))
}

func head(p []byte) []byte { return p[:min(len(p), 16)] }

// pattern returns n bytes that differ from those of any other seed.
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed ^ byte(i*7+i>>8)
	}
	p[0] = seed
	return p
}

// fillable returns how many chunks of dev's minimum granularity fill dev,
// skipping the test when that many would make it slow.
func (f *fixture) fillable(dev driver.DeviceID) int {
	f.t.Helper()
	d := f.devs[dev]
	if d.Capacity > 64*d.MinGranularity {
		f.t.Skipf("device %d holds %s, more than 64 × its granularity %s: filling it chunk by chunk would be slow",
			dev, units.Bytes(d.Capacity), units.Bytes(d.MinGranularity))
	}
	return int(d.Capacity / d.MinGranularity)
}

// fill creates chunks of dev's minimum granularity until the next one no
// longer fits, checks that it is refused, and returns the chunks.
func (f *fixture) fill(dev driver.DeviceID) []driver.Handle {
	f.t.Helper()
	n, g := f.fillable(dev), f.g(dev)
	hs := make([]driver.Handle, 0, n)
	for range n {
		hs = append(hs, f.create(dev, g))
	}
	f.requireFull(dev)
	return hs
}

// requireFull fails the test unless one more chunk of dev's granularity is
// refused with ErrOutOfMemory.
func (f *fixture) requireFull(dev driver.DeviceID) {
	f.t.Helper()
	_, err := f.d.Create(dev, f.g(dev), driver.ChunkOptions{})
	f.requireIs(err, driver.ErrOutOfMemory)
}

// roundUp rounds n up to a multiple of g.
func roundUp(n, g uint64) uint64 { return (n + g - 1) / g * g }

// at is addr plus n bytes.
func at(addr driver.Addr, n uint64) driver.Addr { return addr + driver.Addr(n) }
