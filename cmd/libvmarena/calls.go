package main

import (
	"github.com/vmarena/vmarena/driver"
)

// The calls behind the C API, in Go types. Each recovers a panic into an
// error (a panic must never unwind into C), so that the exports only
// convert types and record the error for vmarena_last_error.

func callAlloc(l *library, tag int32, size int64, ordinal int) (p driver.Addr, err error) {
	defer func() {
		if r := recover(); r != nil {
			p, err = 0, panicError("alloc", r)
		}
	}()
	return l.alloc(tag, size, ordinal)
}

func callFree(l *library, p driver.Addr, size uint64, ordinal int, stream uintptr) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError("free", r)
		}
	}()
	return l.freeOn(p, size, ordinal, stream)
}

// call runs f, recovering a panic into an error.
func call(op string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(op, r)
		}
	}()
	return f()
}
