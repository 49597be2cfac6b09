package vmarena

import (
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/errors"
)

// The sentinel errors of package driver, which every error of the library
// is marked with: errors.Is(err, vmarena.ErrOutOfMemory). They are the
// same values as driver's, so either name matches.
var (
	ErrInvalid      = driver.ErrInvalid
	ErrMisaligned   = driver.ErrMisaligned
	ErrOutOfMemory  = driver.ErrOutOfMemory
	ErrNoDevice     = driver.ErrNoDevice
	ErrNotReserved  = driver.ErrNotReserved
	ErrOverlap      = driver.ErrOverlap
	ErrNotMapped    = driver.ErrNotMapped
	ErrPartial      = driver.ErrPartial
	ErrBadHandle    = driver.ErrBadHandle
	ErrBusy         = driver.ErrBusy
	ErrAccessDenied = driver.ErrAccessDenied
	ErrUnsupported  = driver.ErrUnsupported
	ErrClosed       = driver.ErrClosed
	ErrNotAllocated = driver.ErrNotAllocated
	ErrDeviceFault  = driver.ErrDeviceFault
)

// Addr is a device address; DeviceID names one of a driver's devices.
type (
	Addr     = driver.Addr
	DeviceID = driver.DeviceID
)

// Hints returns the hints err carries, innermost first, each once: what
// to do about a refusal (release the tensor first, call Close again),
// apart from the message, which says what was asked and why it failed.
// Nil for an error without hints or a nil error.
func Hints(err error) []string { return errors.GetAllHints(err) }
