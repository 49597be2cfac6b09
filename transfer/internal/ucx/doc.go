// Package ucx is the binding of UCX's UCP API (Unified Communication X,
// https://openucx.org) that package transfer moves bytes with when its
// engine is built with -tags ucx, over whichever transport UCX picks
// (tcp, shared memory, RDMA), chosen as UCX chooses from the UCX_*
// environment (UCX_TLS, UCX_NET_DEVICES, ...). Two ways to move bytes:
//
//   - Windows and active messages (what package transfer uses). A
//     process opens a window (Worker.Open) over memory it mapped and
//     hands its random token to a peer, which writes into it
//     (Endpoint.Send) or fetches from it into a window of its own
//     (Endpoint.Fetch) with eager active messages of at most 256 KiB.
//     The receiving worker checks every message against the window it
//     names (open, direction, inside its bytes), copies the bytes
//     itself, and drops anything else (Worker.Dropped counts it); a
//     closed window is never touched again. No message is answered by
//     UCX, and a send that fails completes with an error.
//   - One-sided puts and gets (Endpoint.Put and Get, ucp_put_nbx and
//     ucp_get_nbx) into memory a peer registered, with its remote key,
//     on workers made with RMA (NewWorker(true)). Over a transport
//     without RDMA (tcp) UCX 1.13 emulates them with messages the
//     target's UCX answers itself, and aborts the target process when an
//     answer cannot be sent because the initiator's connection was reset
//     meanwhile (ucp_request.inl: "Fatal: unexpected error: Endpoint
//     timeout"); the target checks nothing. A worker made without RMA
//     (NewWorker(false)) neither puts nor gets and serves no peer's: UCX
//     drops those messages with a warning.
//
// What it owns: one UCP context and worker per Worker, the endpoints
// made from it, the memory registrations (memh) on it, the remote keys
// unpacked on each endpoint, the windows and the C buffers of the
// messages in flight. Close gives all of it back.
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
// that used it is flushed; a window's memory stays mapped until the
// window is closed. No Go pointer is stored in C: the endpoint error
// callback writes to C memory of its own, the active-message callback
// gets the worker as a cgo.Handle (an integer), and a message's header
// and a fetch's bytes are copied to C memory held until its send
// completes.
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
// Remote writes on a worker with RMA trust the peer: a remote key lets
// its holder write the registered memory (Mem.Span: what UCX registered,
// which may be wider than Register's range), and on transports without
// RDMA hardware (tcp, cma, shared memory) UCX checks no key at all;
// package transfer's worker has no RMA, and moves bytes only through
// windows. Connect hands its argument to ucp_ep_create,
// whose unpacking aborts the process on garbage: pass only an address
// that Address of a live worker answered.
package ucx
