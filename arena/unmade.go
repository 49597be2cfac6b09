package arena

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Every exported method of Sparse, Arena, Allocator and View first asks
// whether its receiver was made by its constructor: a nil pointer or a
// zero value answers ErrInvalid, or a harmless zero from an accessor (a
// zero range, allocator or arena reports itself closed), instead of
// dereferencing nil or dividing by a zero chunk size.

func (s *Sparse) unmade() bool     { return s == nil || s.res == nil }
func (a *Arena) unmade() bool      { return a == nil || a.s.unmade() }
func (al *Allocator) unmade() bool { return al == nil || al.heaps[small] == nil }
func (v *View) unmade() bool       { return v == nil || v.s.unmade() }

// unmade is the error of method, called on a nil or zero value that
// constructor did not make.
func unmade(method, constructor string) error {
	return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "arena: %s on a nil or zero value", method),
		"make one with arena.%s", constructor)
}
