// Package isnil tells whether an argument is nil, including the typed nil
// that an interface holds when a caller passes a nil pointer as a
// driver.Driver, an Occupant or a Buffer: such a value is != nil, and its
// first method call panics. Every constructor and method that takes an
// interface or pointer from a caller checks with Is and answers
// driver.ErrInvalid instead.
package isnil

import "reflect"

// Is reports whether v is nil or holds a nil pointer, map, slice, channel
// or function.
func Is(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
