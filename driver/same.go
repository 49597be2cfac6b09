package driver

import "reflect"

// Same reports whether a and b are one driver: a == b where == can be
// asked. A driver whose dynamic type == cannot compare (a struct value
// holding a slice, a map or a func, such as a wrapper passed by value)
// makes == panic; Same answers false for it, even against itself, and
// never panics. Constructors that compare drivers refuse such a driver
// first with CheckComparable, whose error says to pass a pointer.
func Same(a, b Driver) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.ValueOf(a).Comparable() || !reflect.ValueOf(b).Comparable() {
		return false
	}
	return a == b
}
