//go:build cgo

package main

// The per-thread state of the C API lives in C thread-local storage: a
// call from C runs its Go code on the calling thread (cgo binds the
// thread to the call), so the thread that sets a tag is the thread whose
// allocations use it, and the thread that failed a call is the one that
// reads its message. Neither allocates, so a thread that exits leaks
// nothing.

/*
#include <stddef.h>
#include <string.h>

// vm_tag is the thread's tag number (0: the default tag).
static __thread int vm_tag;
// vm_err is the message of the thread's last failed call, NUL-terminated
// and cut to fit.
static __thread char vm_err[1024];

static int vm_get_tag(void) { return vm_tag; }
static void vm_set_tag(int t) { vm_tag = t; }
static void vm_set_error(const char *p, size_t n) {
	if (n > sizeof vm_err - 1) n = sizeof vm_err - 1;
	if (n > 0) memcpy(vm_err, p, n);
	vm_err[n] = 0;
}
static const char *vm_error(void) { return vm_err; }
*/
import "C"

import "unsafe"

// threadTag is the calling thread's tag number.
func threadTag() int32 { return int32(C.vm_get_tag()) }

// setThreadTag sets the calling thread's tag number.
func setThreadTag(id int32) { C.vm_set_tag(C.int(id)) }

// setThreadError records err's message as the calling thread's last
// error. The message is copied: C keeps no Go pointer.
func setThreadError(err error) {
	msg := err.Error()
	if msg == "" {
		msg = "libvmarena: an error without a message"
	}
	C.vm_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// threadError is the calling thread's last error message ("" if none).
func threadError() *C.char { return C.vm_error() }
