package stream

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Stream, Event and HostBuffer first asks
// whether its receiver was made by its constructor: a nil pointer or a
// zero value answers ErrInvalid, or a harmless zero from an accessor (a
// zero stream reports itself destroyed), instead of dereferencing nil.

func (s *Stream) unmade() bool     { return s == nil || s.st == nil }
func (e *Event) unmade() bool      { return e == nil || e.st == nil }
func (h *HostBuffer) unmade() bool { return h == nil || h.st == nil }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "stream: %s on a nil or zero value", method),
		"make one with stream.%s", constructor)
}
