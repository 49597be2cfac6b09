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
// A target trusts nothing a peer sends. Every op names the registration
// (id, generation) and the address and length of the bytes it moves in
// the target's process (the descriptor's Addr plus the op's offset), and
// the target refuses, before any byte moves, an op whose bytes are not
// all inside a live registration of that id and generation, or a write
// to a read-only one: a forged descriptor (its address moved by a byte,
// by a page, to an unmapped page; its length grown) gets ErrInvalid and
// changes nothing. A malformed frame drops the connection.
//
// The ucx kind hands UCX nothing a peer sent. Endpoints go one way: the
// initiator makes one to the target's worker, whose address the target
// answers in the hello; the target makes none, and refuses a hello that
// carries a worker address. (Not through UCX's own listener,
// ucp_listener_create: UCX 1.13's tcp connection manager aborts the
// process on a few bytes of garbage from any TCP peer, an assertion in
// tcp_sockcm_ep.c, where its tcp transport's sockets drop them:
// TestGarbageHello.) Bytes move as UCX active messages, never UCX's
// one-sided put and get: for each op the target opens a window over
// exactly the bytes the begin named, once they passed the check, and
// answers with the window's random 64-bit token; its worker writes a
// message's bytes only inside an open window of the right direction
// whose token it names, and drops anything else (a message outside the
// window also fails the op). The window closes before the target lets
// the access go, so bytes of a failed put that UCX's sockets still carry
// (a link down and up again: the kernel retransmits them) are dropped,
// never written. The engine's worker has no RMA (ucx.NewWorker(false)):
// a peer's one-sided put or get is not served at all (UCX has no handler
// of the messages that emulate them over tcp, and drops them with a
// warning: TestNoRMATarget).
//
// What remains trusted, all of it on the ucx kind:
//
//   - RDMA hardware. On a transport with RDMA (ib), the registration's
//     remote key in the descriptor lets its holder write and read the
//     registered bytes with the NIC, whatever the target's windows: the
//     key bounds it to what UCX registered, which Register makes exactly
//     the tensor's bytes (a tensor UCX would register wider is refused:
//     TestMemSpan, TestUCXRegisterExact). Over tcp and shared memory no
//     key is served (a process allowed to ptrace the target, which cma
//     uses, needs none).
//   - The worker address in the target's hello answer: an initiator
//     hands it to ucp_ep_create, whose unpacking aborts the process on
//     garbage, so connect only to an engine you trust to be one.
//   - UCX's own wire protocol on its transports' sockets (its wireup
//     messages, and the framing of active messages, which the target's
//     worker parses as UCX does, assembling a message of the length its
//     first fragment claims; a page of 0xff or random bytes on each is
//     dropped, TestGarbageHello, but nothing here proves more): restrict
//     who can reach them with UCX_NET_DEVICES and the network.
//
// Use the ucx kind between engines that trust each other; the tcp kind
// checks every byte on the receiving side.
//
// # Faults between hosts
//
// Every op completes byte-exact or fails with an error within its bound:
// the engine's LeaseTimeout for one op on both sides (the initiator's
// control connection deadline and, for ucx, its flush or its wait for a
// get's bytes; the target's hold, with, for a ucx put, its wait for the
// bytes), or the caller's context when sooner; a failed ucx op then
// closes its endpoint, which waits up to 4 s more for UCX (twice the
// binding's closeWait); Connect adds its DialRetries. After a failed op
// the peer is closed (ErrClosed) and the bytes of the op's range are
// those before it, those it carried, or a mix; no byte outside the
// registration changes. TestTwoHosts checks it
// between two network namespaces joined by a veth pair, over both kinds,
// with the link set down and up (for 300 ms, and past LeaseTimeout),
// either process killed, and (tcp) latency, bandwidth limits, resets,
// stalls and sliced writes through a fault-injecting proxy; it needs
// root and iproute2, skips without them and fails under CI.
//
// A link down past LeaseTimeout mid-put is where the initiator's bytes
// reach the target after the initiator gave up and closed its
// connection (its kernel retransmits them once the link is up, then
// resets the connection). UCX's one-sided put over tcp is emulated with
// messages the target's UCX answers, and UCX 1.13 aborts the process
// when such an answer cannot be sent (ucp_put_handler,
// "ucp_request.inl:346 Fatal: unexpected error: Endpoint timeout"):
// which is why the ucx kind does not use it. Its active messages need
// no answer, a send that fails completes with an error, and the bytes
// that come late find the target's window closed and are dropped.
// TestTwoHosts runs that fault, on either end of the link, for both
// kinds.
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
