package host

import (
	"runtime/debug"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// copyFaulting copies src to dst and turns a memory fault during the copy
// into ErrAccessDenied instead of a crash. The ledger has already checked
// the range; this is the backstop for what it cannot see (a page the kernel
// refuses). SetPanicOnFault applies to the calling goroutine only, and is
// restored before returning.
func copyFaulting(dst, src []byte) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			err = errors.Wrapf(driver.ErrAccessDenied, "memory fault at %#x", f.Addr())
		}
	}()
	copy(dst, src)
	return nil
}

// fillFaulting sets every byte of dst to v, turning a fault into
// ErrAccessDenied like copyFaulting.
func fillFaulting(dst []byte, v byte) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			err = errors.Wrapf(driver.ErrAccessDenied, "memory fault at %#x", f.Addr())
		}
	}()
	if len(dst) == 0 {
		return nil
	}
	dst[0] = v
	for done := 1; done < len(dst); done *= 2 {
		copy(dst[done:], dst[:done])
	}
	return nil
}
