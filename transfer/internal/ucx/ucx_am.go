//go:build ucx && linux && cgo

package ucx

/*
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// vmxAMRecv is the worker's active-message callback (vmx_am_recv in
// ucx.go), called by UCX on the worker goroutine's thread inside
// ucp_worker_progress. It is in a file of its own: a file with an
// //export may declare C but not define it.
//
//export vmxAMRecv
func vmxAMRecv(w C.uintptr_t, id C.uint, hdr unsafe.Pointer, hlen C.size_t, data unsafe.Pointer, n C.size_t, reply C.ucp_ep_h) {
	cgo.Handle(w).Value().(*Worker).received(id, hdr, uintptr(hlen), data, uintptr(n), reply)
}
