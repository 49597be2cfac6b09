// Command libvmarena is vmarena as a C library that PyTorch can load:
//
//	go build -buildmode=c-shared -o libvmarena.so ./cmd/libvmarena
//
// The library exports vmarena_alloc and vmarena_free with the signatures
// torch.cuda.memory.CUDAPluggableAllocator calls, allocations under
// per-thread tags (vmarena_set_tag), sleep and wake of tagged memory at
// the same addresses (vmarena_sleep, vmarena_wake), a thread-local error
// message and statistics as JSON. vmarena.h, beside this file, is its
// header: the functions, the return codes and the environment variables
// that choose the driver (host, cuda, acl) and its options.
//
// Each export runs on the calling thread, start to end, with no goroutine
// hop: on the cuda driver with the device's primary context (the one
// PyTorch uses), leaving the thread's current context as the caller had
// it (the cuda driver's rule). On cuda and acl vmarena_free waits for the
// work queued on its stream before it frees (the drivers'
// SyncStreamHandle, without the library's lock): CUDA's unmap and release do not wait for
// kernels, and PyTorch frees with the allocation's stream and no wait of
// its own. Each export recovers a panic into an error code, so that none
// unwinds into C.
//
// It owns the process's one library state (the driver, a backend per
// device, the tags); the memory under each tag comes from its backend.
// It must never hand out memory it has not allocated, nor free an
// address it did not hand out: a bad pointer or size is an error code,
// and nothing changes.
package main

// main is never called: a c-shared build needs one.
func main() {}
