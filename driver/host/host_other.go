//go:build !linux

package host

import (
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Driver is the host driver. On this platform New never makes one (the
// driver needs Linux's memfd, fallocate, MADV_POPULATE and
// MAP_FIXED_NOREPLACE); the type has the Linux driver's methods so that
// programs and tests written against it compile everywhere, and each
// answers ErrUnsupported (or reports nothing: no devices, no granularity,
// no features).
type Driver struct{}

var (
	_ driver.Driver     = (*Driver)(nil)
	_ driver.HostMapper = (*Driver)(nil)
	_ driver.Streams    = (*Driver)(nil)
	_ driver.Sharing    = (*Driver)(nil)
)

// unsupported is the answer of every call on this platform.
func unsupported(what string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "host: %s: the host driver needs Linux", what),
		"use the sim driver (driver/sim) for address and capacity accounting on this platform")
}

// New reports that the host driver needs Linux: ErrUnsupported.
func New(Options) (*Driver, error) { return nil, unsupported("new") }

// Name is "host".
func (d *Driver) Name() string { return "host" }

// Devices is empty: the host driver has no devices on this platform.
func (d *Driver) Devices() []driver.Device { return nil }

// Granularity is 0: the host driver has no devices on this platform.
func (d *Driver) Granularity() uint64 { return 0 }

// Supports reports false: on this platform the driver has no optional
// feature.
func (d *Driver) Supports(driver.Feature) bool { return false }

// Reserve is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Reserve(uint64, uint64, driver.Addr) (driver.Addr, error) {
	return 0, unsupported("reserve")
}

// Unreserve is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Unreserve(driver.Addr, uint64) error { return unsupported("unreserve") }

// Create is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Create(driver.DeviceID, uint64, driver.ChunkOptions) (driver.Handle, error) {
	return 0, unsupported("create")
}

// Release is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Release(driver.Handle) error { return unsupported("release") }

// Map is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Map(driver.Addr, driver.Handle) error { return unsupported("map") }

// Unmap is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Unmap(driver.Addr, uint64) error { return unsupported("unmap") }

// SetAccess is ErrUnsupported: the host driver needs Linux.
func (d *Driver) SetAccess(driver.Addr, uint64, driver.DeviceID, driver.Access) error {
	return unsupported("set access")
}

// Access is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Access(driver.Addr, driver.DeviceID) (driver.Access, error) {
	return driver.AccessNone, unsupported("access")
}

// Read is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Read(driver.Addr, []byte) error { return unsupported("read") }

// Write is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Write(driver.Addr, []byte) error { return unsupported("write") }

// Close is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Close() error { return unsupported("close") }

// Used is 0: nothing is committed on this platform.
func (d *Driver) Used(driver.DeviceID) uint64 { return 0 }

// Check is ErrUnsupported: there is no record to check on this platform.
func (d *Driver) Check() error { return unsupported("check") }

// HostBytes is ErrUnsupported: the host driver needs Linux.
func (d *Driver) HostBytes(driver.Addr, uint64) ([]byte, error) {
	return nil, unsupported("host bytes")
}

// Export is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Export(driver.Handle) (driver.Shareable, error) {
	return driver.Shareable{}, unsupported("export")
}

// Import is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Import(driver.Shareable, driver.DeviceID) (driver.Handle, error) {
	return 0, unsupported("import")
}

// HeapBytes is ErrUnsupported: there are no heap files on this platform.
func (d *Driver) HeapBytes(driver.DeviceID) (uint64, error) { return 0, unsupported("heap bytes") }

// CreateStream is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CreateStream(driver.DeviceID) (driver.Stream, error) {
	return 0, unsupported("create stream")
}

// DestroyStream is ErrUnsupported: the host driver needs Linux.
func (d *Driver) DestroyStream(driver.Stream) error { return unsupported("destroy stream") }

// CreateEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CreateEvent(driver.DeviceID) (driver.Event, error) {
	return 0, unsupported("create event")
}

// DestroyEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) DestroyEvent(driver.Event) error { return unsupported("destroy event") }

// RecordEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) RecordEvent(driver.Event, driver.Stream) error {
	return unsupported("record event")
}

// StreamWaitEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) StreamWaitEvent(driver.Stream, driver.Event) error {
	return unsupported("stream wait event")
}

// SyncStream is ErrUnsupported: the host driver needs Linux.
func (d *Driver) SyncStream(driver.Stream) error { return unsupported("synchronize stream") }

// SyncDevice is ErrUnsupported: the host driver needs Linux.
func (d *Driver) SyncDevice(driver.DeviceID) error { return unsupported("synchronize device") }

// QueryStream is ErrUnsupported: the host driver needs Linux.
func (d *Driver) QueryStream(driver.Stream) (bool, error) {
	return false, unsupported("query stream")
}

// SyncEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) SyncEvent(driver.Event) error { return unsupported("synchronize event") }

// QueryEvent is ErrUnsupported: the host driver needs Linux.
func (d *Driver) QueryEvent(driver.Event) (bool, error) { return false, unsupported("query event") }

// ElapsedTime is ErrUnsupported: the host driver needs Linux.
func (d *Driver) ElapsedTime(driver.Event, driver.Event) (time.Duration, error) {
	return 0, unsupported("elapsed time")
}

// LaunchHostFunc is ErrUnsupported: the host driver needs Linux.
func (d *Driver) LaunchHostFunc(driver.Stream, string, func() error) error {
	return unsupported("launch host function")
}

// CopyHtoD is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CopyHtoD(driver.Addr, []byte, driver.Stream) error {
	return unsupported("copy to device")
}

// CopyDtoH is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CopyDtoH([]byte, driver.Addr, driver.Stream) error {
	return unsupported("copy to host")
}

// CopyDtoD is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CopyDtoD(driver.Addr, driver.Addr, uint64, driver.Stream) error {
	return unsupported("copy between devices")
}

// Memset is ErrUnsupported: the host driver needs Linux.
func (d *Driver) Memset(driver.Addr, byte, uint64, driver.Stream) error {
	return unsupported("memset")
}

// CanAccessPeer is ErrUnsupported: the host driver needs Linux.
func (d *Driver) CanAccessPeer(driver.DeviceID, driver.DeviceID) (bool, error) {
	return false, unsupported("can access peer")
}

// EnablePeerAccess is ErrUnsupported: the host driver needs Linux.
func (d *Driver) EnablePeerAccess(driver.DeviceID, driver.DeviceID) error {
	return unsupported("enable peer access")
}

// HostAlloc is ErrUnsupported: the host driver needs Linux.
func (d *Driver) HostAlloc(uint64) ([]byte, error) { return nil, unsupported("host alloc") }

// HostFree is ErrUnsupported: the host driver needs Linux.
func (d *Driver) HostFree([]byte) error { return unsupported("host free") }
