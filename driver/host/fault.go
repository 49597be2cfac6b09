package host

import (
	"runtime/debug"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// copyFaulting copies src to dst and turns a memory fault during the copy
// into ErrAccessDenied instead of a crash. The ledger has already checked
// the range; this is the backstop for what it cannot see (a page the kernel
// refuses).
func copyFaulting(dst, src []byte) error {
	return faulting(func() { copy(dst, src) })
}

// fillFaulting sets every byte of dst to v, with the same backstop.
func fillFaulting(dst []byte, v byte) error {
	return faulting(func() {
		if len(dst) == 0 {
			return
		}
		dst[0] = v
		for done := 1; done < len(dst); done *= 2 {
			copy(dst[done:], dst[:done])
		}
	})
}

// faulting runs touch with runtime/debug.SetPanicOnFault on (for the
// calling goroutine only, restored before returning) and turns a memory
// fault into ErrAccessDenied naming the address.
func faulting(touch func()) (err error) {
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
	touch()
	return nil
}
