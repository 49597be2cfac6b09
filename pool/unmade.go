package pool

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Pool first asks whether its receiver was made by
// pool.New: a nil pointer or a zero value answers ErrInvalid, or a harmless
// zero from an accessor, instead of dereferencing nil.
func (p *Pool) unmade() bool { return p == nil || p.al == nil }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "pool: %s on a nil or zero value", method),
		"make one with pool.%s", constructor)
}
