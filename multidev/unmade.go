package multidev

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Arena first asks whether its receiver was made by
// multidev.New: a nil pointer or a zero value answers ErrInvalid, or a harmless
// zero from an accessor, instead of dereferencing nil.
func (a *Arena) unmade() bool { return a == nil || a.a == nil }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "multidev: %s on a nil or zero value", method),
		"make one with multidev.%s", constructor)
}
