// Package ucx is the binding of UCX's UCP API (Unified Communication X,
// https://openucx.org) that package transfer moves bytes with when its
// engine is built with -tags ucx: one-sided puts and gets into memory a
// peer process registered, over whichever transport UCX picks (tcp,
// shared memory, RDMA), chosen as UCX chooses from the UCX_* environment
// (UCX_TLS, UCX_NET_DEVICES, ...).
//
// What it owns: one UCP context and worker per Worker, the endpoints
// made from it, the memory registrations (memh) on it, and the remote keys
// unpacked on each endpoint. Close gives all of it back.
//
// Threading. A Worker is one goroutine locked to its OS thread
// (runtime.LockOSThread), which creates the context and worker (thread
// mode single) and makes every UCP call; the other goroutines hand it
// calls and wake it with ucp_worker_signal, the one UCP call that any
// thread may make. While a request is in flight the goroutine progresses
// the worker without sleeping; otherwise it arms the worker
// (ucp_worker_arm) and sleeps in poll(2) on the worker's event fd
// (ucp_worker_get_efd) with a timeout, so an idle worker burns no CPU,
// and a process whose memory peers write into is still progressed (UCX's
// tcp transport lands a put only when the target's worker progresses).
//
// Memory. Only memory outside the Go heap goes to C for asynchronous use:
// Register's address and Put and Get's local address must be memory the
// caller mapped (mmap, a driver mapping, a memfd), not a Go slice, and the
// caller keeps it mapped until the Mem is closed and every Put and Get
// that used it is flushed. No Go pointer is stored in C: the endpoint
// error callback writes to C memory of its own.
//
// Errors. A UCS status becomes an error naming the UCP call and
// ucs_status_string, marked with a driver sentinel: no device or a feature
// UCX lacks (UCS_ERR_NO_DEVICE, UCS_ERR_UNSUPPORTED) driver.ErrUnsupported,
// bad arguments driver.ErrInvalid, exhausted memory or resources
// driver.ErrOutOfMemory, everything else driver.ErrDeviceFault: a failed
// peer or connection, and UCS_ERR_UNREACHABLE, which UCX answers both
// when no transport reaches the peer and when the peer's worker is gone.
// A call after Close is driver.ErrClosed.
// Without the ucx build tag (or cgo, or on another OS) Available is false
// and every call answers driver.ErrUnsupported.
//
// What it must never do: call UCP from any goroutine but the worker's,
// store a Go pointer in C, or block the worker goroutine without bound
// (every wait it makes inline, at an endpoint's Close, has a deadline).
// Remote writes trust the peer: a remote key lets its holder write the
// registered memory (Mem.Span: what UCX registered, which may be wider
// than Register's range), and on transports without RDMA hardware (tcp,
// cma, shared memory) UCX checks no key at all; package transfer bounds
// that by its protocol. Connect hands its argument to ucp_ep_create,
// whose unpacking aborts the process on garbage: pass only an address
// that Address of a live worker answered.
package ucx
