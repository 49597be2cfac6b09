package driver

import (
	"reflect"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/units"
)

// Sentinel errors, one per class of failure. Every error a driver or a
// layer above it returns is marked with exactly one of them, wrapped with a
// message that says what was asked and why it failed. Test for them with
// errors.Is (the standard library's; any package whose Is walks Unwrap,
// github.com/cockroachdb/errors' among them, finds them too).
var (
	// ErrInvalid: an argument no call could accept (zero size, an
	// alignment that is not a power of two, an unknown access value).
	ErrInvalid = errors.New("invalid argument")
	// ErrMisaligned: a size, address or offset that is not a multiple of
	// the granularity that applies; the message names the granularity.
	ErrMisaligned = errors.New("misaligned")
	// ErrOutOfMemory: the device cannot commit the memory asked for.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrNoDevice: a device ID the driver does not have.
	ErrNoDevice = errors.New("no such device")
	// ErrNotReserved: an address range not inside any live reservation,
	// or a range that is not exactly one reservation.
	ErrNotReserved = errors.New("not reserved")
	// ErrOverlap: a mapping or carve that would cover memory already in use.
	ErrOverlap = errors.New("overlaps an existing mapping")
	// ErrNotMapped: an address or range with no mapping behind it.
	ErrNotMapped = errors.New("not mapped")
	// ErrPartial: a range that covers part of a mapping where the whole
	// mapping is the unit (Unmap).
	ErrPartial = errors.New("not a whole mapping")
	// ErrBadHandle: a chunk handle that is unknown or already released.
	ErrBadHandle = errors.New("unknown or released chunk handle")
	// ErrBusy: an object still in use (a reservation with live mappings).
	ErrBusy = errors.New("in use")
	// ErrAccessDenied: a read or write at memory the caller may not touch
	// (reserved only, or not granted to the device).
	ErrAccessDenied = errors.New("access denied")
	// ErrUnsupported: a feature this driver does not implement.
	ErrUnsupported = errors.New("not supported")
	// ErrClosed: a call on a closed object.
	ErrClosed = errors.New("closed")
	// ErrNotAllocated: a pointer that is not the start of a live
	// allocation — freed twice, never allocated here, or inside one.
	ErrNotAllocated = errors.New("not a live allocation")
	// ErrDeviceFault: the device or its vendor runtime failed (an
	// uncorrectable ECC error, a failed launch, an error code the driver
	// does not know): the device's context may be unusable, and the
	// message names the vendor's code.
	ErrDeviceFault = errors.New("device fault")
)

// The Check functions below are shared by the drivers and the layers
// above them. what describes the call for the message; a nil what is
// replaced by "check", and a zero granularity is itself refused
// (ErrInvalid) rather than divided by.

// label returns what, or a stand-in when it is nil.
func label(what func() string) func() string {
	if what == nil {
		return func() string { return "check" }
	}
	return what
}

// CheckSize returns nil when size is a positive multiple of gran, and
// otherwise an error naming the call and the granularity.
func CheckSize(what func() string, size, gran uint64) error {
	what = label(what)
	if gran == 0 {
		return errors.Wrapf(ErrInvalid, "%s: the granularity is zero", what())
	}
	if size == 0 {
		return errors.Wrapf(ErrInvalid, "%s: size is zero", what())
	}
	if size%gran != 0 {
		return errors.WithHintf(
			errors.Wrapf(ErrMisaligned, "%s: size %s (%d bytes) is not a multiple of the granularity %s",
				what(), units.Bytes(size), size, units.Bytes(gran)),
			"round the size up to a multiple of %d bytes", gran)
	}
	return nil
}

// CheckAddr returns nil when addr is a multiple of gran.
func CheckAddr(what func() string, addr Addr, gran uint64) error {
	what = label(what)
	if gran == 0 {
		return errors.Wrapf(ErrInvalid, "%s: the granularity is zero", what())
	}
	if uint64(addr)%gran != 0 {
		return errors.Wrapf(ErrMisaligned, "%s: address %s is not a multiple of the granularity %s",
			what(), addr, units.Bytes(gran))
	}
	return nil
}

// CheckAlign returns nil when align is 0 (the default) or a power of two.
func CheckAlign(what func() string, align uint64) error {
	if align&(align-1) != 0 {
		return errors.Wrapf(ErrInvalid, "%s: alignment %d is not a power of two", label(what)(), align)
	}
	return nil
}

// CheckAccess returns nil when a is a defined access value.
func CheckAccess(what func() string, a Access) error {
	if !a.Valid() {
		return errors.Wrapf(ErrInvalid, "%s: access value %d is not none (0), read (1) or read-write (3)",
			label(what)(), uint8(a))
	}
	return nil
}

// CheckDevice returns nil when dev is one of n devices.
func CheckDevice(what func() string, dev DeviceID, n int) error {
	if dev < 0 || int(dev) >= n {
		if n <= 0 {
			return errors.Wrapf(ErrNoDevice, "%s: device %d (there are no devices)", label(what)(), dev)
		}
		return errors.Wrapf(ErrNoDevice, "%s: device %d (the driver has %d, numbered 0 to %d)",
			label(what)(), dev, n, n-1)
	}
	return nil
}

// CheckCopyAlign returns nil when every device address in addrs, and the
// start of host (when not empty), is aligned to dev.CopyAlign, as async
// copies on dev need (AscendCL's 64-byte rule); otherwise ErrMisaligned
// naming the address and the rule.
func CheckCopyAlign(what func() string, dev Device, addrs []Addr, host []byte) error {
	what = label(what)
	align := max(dev.CopyAlign, 1)
	for _, a := range addrs {
		if uint64(a)%align != 0 {
			return errors.WithHintf(
				errors.Wrapf(ErrMisaligned, "%s: address %s is not %d-byte aligned, as device %d requires for async copies", what(), a, align, dev.ID),
				"allocate copy buffers with %d-byte aligned starts (pinned host buffers from HostAlloc are)", align)
		}
	}
	if len(host) > 0 && uint64(uintptr(unsafe.Pointer(&host[0])))%align != 0 {
		return errors.Wrapf(ErrMisaligned, "%s: the host buffer is not %d-byte aligned, as device %d requires for async copies (use HostAlloc)", what(), align, dev.ID)
	}
	return nil
}

// CheckComparable returns nil when d can be compared with == and used as a
// map key. A driver whose dynamic type is not comparable (a struct value
// holding a slice, a map or a func) makes == and map access panic, so
// every registry keyed by driver (synchronize hooks, default pools)
// refuses it with ErrInvalid instead, as does a nil driver.
func CheckComparable(what func() string, d Driver) error {
	what = label(what)
	if d == nil {
		return errors.Wrapf(ErrInvalid, "%s: the driver is nil", what())
	}
	if v := reflect.ValueOf(d); v.Kind() == reflect.Pointer && v.IsNil() {
		return errors.Wrapf(ErrInvalid, "%s: the driver is a nil %T", what(), d)
	}
	if !reflect.ValueOf(d).Comparable() {
		return errors.WithHint(
			errors.Wrapf(ErrInvalid, "%s: the driver's type %T is not comparable (it holds a slice, a map or a func), so it cannot key a registry",
				what(), d),
			"pass a pointer to the driver: pointers are always comparable")
	}
	return nil
}

// CheckPIDs returns nil when every entry of an allow-list is a process ID
// that can name a peer: positive. The kernel reports 0 for a peer in a PID
// namespace this process cannot see (SO_PEERCRED), so a 0 on the list
// would admit every such process; negative IDs name no process.
func CheckPIDs(what func() string, pids []int) error {
	for _, pid := range pids {
		if pid <= 0 {
			return errors.WithHint(
				errors.Wrapf(ErrInvalid, "%s: process ID %d on the allow-list (process IDs are positive)", label(what)(), pid),
				"0 is what the kernel reports for a peer in a PID namespace this process cannot see: it would admit all of them")
		}
	}
	return nil
}

// Closed is the error for a call on a closed object.
func Closed(what string) error { return errors.Wrapf(ErrClosed, "%s", what) }
