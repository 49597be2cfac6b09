package mapping

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Table first asks whether its receiver was made by
// mapping.New: a nil pointer or a zero value answers ErrInvalid, or a harmless
// zero from an accessor, instead of dereferencing nil.
func (t *Table) unmade() bool { return t == nil || t.res == nil }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "mapping: %s on a nil or zero value", method),
		"make one with mapping.%s", constructor)
}
