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
// registrations' books (id, generation, length, writability) and, for
// ucx, the UCX worker, endpoints and memory registrations. Never the
// memory: a Registration holds a tensor, and the tensor's owner (an arena
// view's holder, a KV cache) keeps the memory and may take it back.
//
// # Invalidation
//
// Every byte moved into or out of registered memory is moved while
// holding the tensor's access (tensor.Access), on both sides, and an
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
//     connection, registration and (ucx) the worker.
//
// # What it never does
//
// It never maps, unmaps or protects memory, never registers Go memory
// (only a driver's mapping, tensor.Mapped, which the GC does not move),
// never keeps a tensor's bytes past an access, never panics or writes
// outside registered bytes on a peer's frame, malformed or hostile (it
// answers an error, or drops the connection), and never retries a
// transfer: only Connect retries, DialRetries times at most.
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
// # Errors
//
// Every error is marked with a sentinel of the driver package and starts
// with "transfer: ": ErrInvalid for a bad range, config, descriptor or
// frame; ErrClosed for a closed engine, peer or registration, a stale
// registration, or a connection that failed (the peer is then closed);
// ErrAccessDenied for a write to a read-only registration, local or
// remote; ErrUnsupported for the ucx kind without UCX. A target's refusal
// reaches the initiator marked with the same sentinel.
package transfer
