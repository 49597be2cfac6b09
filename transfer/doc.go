// Package transfer moves bytes between tensors of two processes: an
// Engine registers tensors (Register), names them to peers with a
// Descriptor, and puts into or gets from a peer engine's registrations
// (Connect, Peer.Put, Peer.Get). It is the KV cache transfer of a
// disaggregated prefill/decode deployment, over two kinds of engine:
// "tcp", pure Go, every byte over the control connection; and "ucx",
// UCX one-sided operations (a build with -tags ucx).
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
// # Invalidation: leases, not push events
//
// Every byte moved into or out of registered memory is moved while
// holding the tensor's access (tensor.Access), on both sides. A KV cache
// revokes a sequence's lease before Preempt, Free, SetBudget or Close
// unmap or remap its pages, a sleep.Manager revokes an allocation's
// (Manager.Tensor) before Sleep backs up and unmaps its tag and before
// Free, and Revoke waits for the accesses in flight; an arena view pins
// its memory (decommit or move of it is ErrBusy while the view lives:
// its holder lets the view go, which makes the registration stale, before
// the memory can move). So a remap either waits for the transfer in flight or
// is refused while it runs, and after it every transfer through the old
// registration fails with ErrClosed ("stale"), checked by the target
// under the same hold the remap waits for. Nothing is pushed to peers:
// a peer learns of a remap when its next op through the old descriptor is
// refused, and asks the owner for the new one. A target holds its memory
// for one remote transfer at most LeaseTimeout: a payload that does not
// come in time fails the op and drops the connection.
//
// # Invariants
//
//   - A registration's id is never reused within an engine, and its
//     generation is random: a descriptor of a closed registration, or of
//     an earlier engine at the same address, never names a live one.
//   - A target writes only inside [off, off+len) of a live, writable
//     registration whose id and generation the request names, and only
//     under the tensor's access; a request that names anything else is
//     refused (the payload of a refused put is drained) and changes no
//     byte, registration or count but Stats.Refused.
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
// # Trust limit of the ucx kind
//
// UCX's one-sided writes trust the peer's engine to keep the protocol
// (begin, put or get, end), as any RDMA remote key does: the target's
// checks gate the op, but a peer that holds a descriptor's key could
// write the memory outside a begin. The tcp engine checks every byte on
// the receiving side.
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
