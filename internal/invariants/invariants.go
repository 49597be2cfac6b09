// Package invariants says whether this build checks every invariant after
// every change, pebble's way: tests and builds with the invariants tag
// (go test -tags invariants ./...) run each stateful structure's Check
// after each mutation and fail loudly at the first broken invariant;
// production builds pay nothing (Enabled is a constant, so the checks are
// compiled out).
//
// It owns nothing but the switch and the one way to fail.
package invariants

import "fmt"

// Fail reports a broken invariant found after a mutation. Under the
// invariants tag it panics with err, naming op: the structure is already
// wrong, no caller can recover it, and a test must stop at the first
// mutation that broke it rather than at a later symptom. It does nothing
// when err is nil.
func Fail(op string, err error) {
	if err != nil {
		panic(fmt.Sprintf("invariants: after %s: %+v", op, err))
	}
}
