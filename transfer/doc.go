// Package transfer moves bytes between tensors of two processes: an
// Engine registers tensors (Register), names them to peers with a
// Descriptor, and puts into or gets from a peer engine's registrations
// (Connect, Peer.Put, Peer.Get). It is the KV cache transfer of a
// disaggregated prefill/decode deployment, over two kinds of engine:
// "tcp", pure Go, every byte over the control connection; and "ucx",
// UCX active messages into windows the target checks (a build with
// -tags ucx).
//
// # What it owns
//
// Its listener, the control connections it makes and serves (one
// goroutine per served connection, one for the accept loop), its
// registrations' books (id, generation, length, writability), for ucx
// the UCX worker, endpoints and memory registrations, and, with
// Config.Staging, one pinned host buffer and two streams of the driver
// (see Device memory). Never the
// memory: a Registration holds a tensor, and the tensor's owner (an arena
// view's holder, a KV cache) keeps the memory and may take it back.
//
// # Invalidation
//
// Every byte moved into or out of registered memory is moved while
// holding the tensor's access (tensor.Access, or tensor.AccessDevice for
// a device tensor: one hold for the whole op, all its pieces), on both
// sides, and an
// owner revokes that access (or its view pins the memory) before it
// unmaps or remaps: a remap waits for the transfer in flight or is
// refused while it runs, and after it every transfer through the old
// registration fails with ErrClosed ("stale"). Nothing is pushed to
// peers: a peer learns of a remap when its next op is refused. A target
// holds its memory for one remote transfer at most LeaseTimeout.
//
// # Invariants
//
//   - A registration's id is never reused within an engine, and its
//     generation is random: a descriptor of a closed registration, or of
//     an earlier engine at the same address, never names a live one.
//   - A target writes only the bytes [addr, addr+len) a request names,
//     all inside a live, writable registration whose id and generation
//     it names, and only under the tensor's access; a request that names
//     anything else is refused (the payload of a refused put is drained)
//     and changes no byte, registration or count but Stats.Refused. On
//     the ucx kind the target's UCX worker writes a put's bytes, each
//     active message checked against the window the target opened over
//     exactly the op's bytes, and closed before the access is let go.
//   - Every goroutine the engine starts ends at Close; Close closes every
//     connection, registration and (ucx) the worker, and gives the
//     staging buffer and its streams back to the driver.
//
// # What it never does
//
// It never maps, unmaps or protects memory, never registers Go memory
// (only a driver's mapping, tensor.Mapped, which the GC does not move),
// never keeps a tensor's bytes past an access, never panics or writes
// outside registered bytes on a peer's frame, malformed or hostile (it
// answers an error, or drops the connection), and never retries a
// transfer: only Connect retries, DialRetries times at most. It serves
// at most 1,024 connections at once (one past that is closed as it is
// accepted); one whose hello, or a request from its first byte on
// (header and payload), does not come within LeaseTimeout is dropped,
// while one idle between requests is kept; and an accept the kernel
// refuses (no file descriptor left) is tried again after a pause
// doubling from 5 ms to 1 s: the engine serves again once descriptors
// are back, and peers that connect and hold on cannot take every
// descriptor of the process.
//
// # Trust
//
// A target trusts nothing a peer sends: it refuses, before any byte
// moves, an op whose bytes are not all inside a live registration of the
// id and generation it names, or a write to a read-only one (ErrInvalid,
// ErrAccessDenied; nothing changes), and drops the connection on a
// malformed frame. The tcp kind moves every byte by the target's own code
// after that check. The ucx kind moves them as UCX active messages into a
// window the target opens over exactly the checked bytes, under the
// tensor's access, and closes before it lets the access go; a message
// outside an open window is dropped. What stays trusted there is UCX's
// own framing, the worker address of the target's hello answer, and on
// RDMA hardware the descriptor's remote key (it covers exactly the
// registration's bytes). Every op completes byte-exact or fails within
// LeaseTimeout (or the caller's context); after a failed op the peer is
// closed and no byte outside the registration has changed.
// docs/transfer.md says how the windows work and which faults between
// hosts are tested (TestTwoHosts).
//
// # Device memory
//
// A device tensor (tensor.Tensor.Addressable false: a CUDA or AscendCL
// device's memory, the sim driver's) registers on a tcp engine made with
// Config.Staging: one pinned host buffer of the driver, made at New and
// given back at Close, halved between the ops the engine issues and those
// it serves (so an engine never waits on itself, or two engines on each
// other). An op moves in pieces of a half, in order, under one
// tensor.AccessDevice hold for the whole op and the half's lock for each
// piece: a leaving piece is copied device to host and synced, then sent;
// an arriving piece is read, then copied host to device and synced before
// the next, so every byte is on the device before the op is answered.
// Concurrent ops take turns per piece (a lock per half, not a ring of
// slots). The wire protocol and the target's check are those of host
// memory; a copy the driver refuses mid-op fails the op (a target answers
// it after reading away the rest of a put; otherwise the connection is
// dropped).
//
// The ucx kind refuses device tensors and Config.Staging
// (ErrUnsupported): its windows are host memory its worker writes. A UCX
// built with CUDA (the cuda_copy, cuda_ipc and gdr_copy transports) would
// need no staging: the target's window or ucp_mem_map over the device
// range with UCS_MEMORY_TYPE_CUDA, remote keys over device memory, and
// UCX moving the bytes by GPUDirect RDMA, CUDA IPC on one machine, or its
// own pipelined staging; the target's check and the hold would stay as
// they are. The UCX here (1.13) has no CUDA; nothing here tests that.
//
// # Errors
//
// Every error is marked with a sentinel of the driver package and starts
// with "transfer: ": ErrInvalid for a bad range, config, descriptor or
// frame; ErrClosed for a closed engine, peer or registration, a stale
// registration, or a connection that failed (the peer is then closed);
// ErrAccessDenied for a write to a read-only registration, local or
// remote; ErrUnsupported for the ucx kind without UCX, and for a device
// tensor on an engine without staging or of the ucx kind. A target's refusal
// reaches the initiator marked with the same sentinel.
package transfer
