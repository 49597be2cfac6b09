package tensor

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Growable first asks whether its receiver was made by
// tensor.NewGrowable: a nil pointer or a zero value answers ErrInvalid, or a harmless
// zero from an accessor, instead of dereferencing nil.
func (g *Growable) unmade() bool { return g == nil || g.a == nil }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "tensor: %s on a nil or zero value", method),
		"make one with tensor.%s", constructor)
}
