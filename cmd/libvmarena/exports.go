//go:build cgo

package main

/*
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

// cudaStream_t is PyTorch's stream type in the allocator's ABI: on the
// cuda driver vmarena_free waits for its work (a CUstream, the same
// handle); elsewhere it is not looked at.
typedef void* cudaStream_t;
*/
import "C"

import (
	"os"
	"sync"
	"unsafe"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/errors"
)

// lib is the library's state: one per process, as the C API has no handle.
var lib = newLibrary(os.Getenv)

// status records err for vmarena_last_error and returns its code.
func status(err error) C.int {
	if err != nil {
		setThreadError(err)
	}
	return C.int(codeOf(err))
}

//export vmarena_alloc
func vmarena_alloc(size C.ssize_t, device C.int, stream C.cudaStream_t) unsafe.Pointer {
	a, err := callAlloc(lib, threadTag(), int64(size), int(device))
	if err != nil {
		setThreadError(err)
		return nil
	}
	// The address is of memory the driver maps, outside Go's heap: the
	// pointer is C's to keep, and Go never dereferences it.
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}

//export vmarena_free
func vmarena_free(ptr unsafe.Pointer, size C.size_t, device C.int, stream C.cudaStream_t) {
	if err := callFree(lib, driver.Addr(uintptr(ptr)), uint64(size), int(device), uintptr(stream)); err != nil {
		setThreadError(err)
	}
}

//export vmarena_set_tag
func vmarena_set_tag(tag *C.char) C.int {
	return status(call("set tag", func() error {
		name, err := goTag(tag)
		if err != nil {
			return err
		}
		id, err := lib.tagID(name)
		if err == nil {
			setThreadTag(id)
		}
		return err
	}))
}

//export vmarena_sleep
func vmarena_sleep(tag *C.char, mode C.int) C.int {
	return status(call("sleep", func() error {
		name, err := goTag(tag)
		if err != nil {
			return err
		}
		return lib.sleep(name, int(mode))
	}))
}

//export vmarena_wake
func vmarena_wake(tag *C.char) C.int {
	return status(call("wake", func() error {
		name, err := goTag(tag)
		if err != nil {
			return err
		}
		return lib.wake(name)
	}))
}

//export vmarena_last_error
func vmarena_last_error() *C.char { return threadError() }

//export vmarena_stats_json
func vmarena_stats_json() *C.char {
	var js []byte
	err := call("stats", func() (err error) {
		js, err = lib.statsJSON()
		return err
	})
	if err != nil {
		setThreadError(err)
		return nil
	}
	s := C.CString(string(js))
	cstrings.mu.Lock()
	cstrings.live[uintptr(unsafe.Pointer(s))] = struct{}{}
	cstrings.mu.Unlock()
	return s
}

// cstrings are the strings vmarena_stats_json returned that
// vmarena_free_string has not freed yet, by address: C's free is given
// only those, as it aborts the process (or corrupts its heap) on a
// pointer freed already or one malloc did not return.
var cstrings = struct {
	mu   sync.Mutex // guards live
	live map[uintptr]struct{}
}{live: map[uintptr]struct{}{}}

//export vmarena_free_string
func vmarena_free_string(s *C.char) {
	if s == nil {
		return
	}
	cstrings.mu.Lock()
	_, ok := cstrings.live[uintptr(unsafe.Pointer(s))]
	delete(cstrings.live, uintptr(unsafe.Pointer(s)))
	cstrings.mu.Unlock()
	if !ok {
		setThreadError(errors.Wrapf(driver.ErrInvalid, "libvmarena: free_string %#x: not a string vmarena_stats_json returned (freed twice?)", uintptr(unsafe.Pointer(s))))
		return
	}
	C.free(unsafe.Pointer(s))
}

//export vmarena_shutdown
func vmarena_shutdown() C.int {
	return status(call("shutdown", lib.shutdown))
}

// goTag is a C tag as Go has it: NULL is "" (every tag, to sleep and
// wake), and "" is defaultTag, as vmarena_set_tag has it. It reads at most
// maxTagLen+1 bytes, so that a string with no NUL in reach is refused as
// too long instead of read past its end.
func goTag(tag *C.char) (string, error) {
	if tag == nil {
		return "", nil
	}
	n := C.strnlen(tag, maxTagLen+1)
	if n > maxTagLen {
		return "", errors.Wrapf(driver.ErrInvalid, "libvmarena: a tag of more than %d bytes (no NUL in its first %d)", maxTagLen, maxTagLen+1)
	}
	if n == 0 {
		return defaultTag, nil
	}
	return C.GoStringN(tag, C.int(n)), nil
}
