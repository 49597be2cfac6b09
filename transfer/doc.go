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
// registrations' books (id, generation, length, writability), for ucx
// the UCX worker, endpoints and memory registrations, and, with
// Config.Staging, one pinned host buffer and two streams of the driver
// (see Device memory). Never the
// memory: a Registration holds a tensor, and the tensor's owner (an arena
// view's holder, a KV cache) keeps the memory and may take it back.
//
// # Invalidation: leases, not push events
//
// Every byte moved into or out of registered memory is moved while
// holding the tensor's access (tensor.Access, or tensor.AccessDevice for
// a device tensor: one hold for the whole op, all its pieces), on both
// sides. A KV cache
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
//     and changes no byte, registration or count but Stats.Refused. (On
//     the ucx kind the peer's UCX moves the bytes: what it does outside
//     begin and end is the peer's, see Trust.)
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
// answers in the hello; the target makes none (one-sided ops need none
// back), and refuses a hello that carries a worker address. (Not through
// UCX's own listener, ucp_listener_create: UCX 1.13's tcp connection
// manager aborts the process on a few bytes of garbage from any TCP
// peer, an assertion in tcp_sockcm_ep.c, where its tcp transport's
// sockets drop them: TestGarbageHello.) The initiator moves bytes only
// after the target answered its begin (which names the address and
// length) with OK, at exactly that address and length.
//
// What remains trusted, all of it on the ucx kind:
//
//   - The peer engine's honesty between begin and end. UCX moves the
//     bytes without the target's CPU, so the target's check gates what an
//     honest engine does, not what a dishonest one could: ucp_mem_map is
//     passed exactly the registration's bytes, but with UCX 1.13 the
//     transports without RDMA hardware (tcp, cma, sysv and posix shared
//     memory) check no remote key at all, so a peer process that runs
//     its own UCX code against the target's worker can write or read any
//     address of the target, at any time; on RDMA hardware (ib), the key
//     bounds it to what UCX registered, which Register makes exactly the
//     tensor's bytes (a tensor UCX would register wider is refused:
//     TestMemSpan, TestUCXRegisterExact). The tcp kind has no such limit:
//     every byte is moved by the target's own code after the check.
//   - Where a put's bytes are once an op failed. The target makes no
//     endpoint, so it has none to cut off when an end does not come: it
//     drops the control connection and lets go at LeaseTimeout, and
//     bytes of the failed put that UCX's sockets still carry (a link
//     down and up again: the kernel retransmits them) may land in the
//     registered memory after that. TestTwoHosts waits, after each
//     fault, until the target's UCX has closed its side (its file
//     descriptors are back) before it checks the bytes or remaps
//     anything; an owner that remaps memory at once after a peer's
//     failure should close the registration and let LeaseTimeout pass
//     first. The tcp kind moves no byte after the target let go.
//   - The worker address in the target's hello answer: an initiator
//     hands it to ucp_ep_create, whose unpacking aborts the process on
//     garbage, so connect only to an engine you trust to be one.
//   - UCX's own wire protocol on its transports' sockets (its wireup
//     messages, which the target's worker parses as UCX does; a page of
//     0xff or random bytes on each is dropped, TestGarbageHello, but
//     nothing here proves more): restrict who can reach them with
//     UCX_NET_DEVICES and the network.
//
// Use the ucx kind between engines that trust each other; the tcp kind
// checks every byte on the receiving side.
//
// # Faults between hosts
//
// Every op completes byte-exact or fails with an error within its bound:
// the engine's LeaseTimeout for one op on both sides (the initiator's
// control connection deadline and, for ucx, its flush; the target's
// hold), or the caller's context when sooner; a failed ucx op then
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
// One fault the ucx kind does not survive: with UCX 1.13 over its tcp
// transport, a link down past LeaseTimeout mid-put, on either host, can
// abort the target inside UCX when the link comes back (ucp_put_handler:
// "ucp_request.inl:346 Fatal: unexpected error: Endpoint timeout", in 2
// to 4 runs of 10 of TestTwoHosts on a loaded 2-core machine, when the
// initiator's bytes reach the target after the initiator gave up). The
// engine cannot catch it (UCX aborts the process). TestTwoHosts runs that
// case for ucx only with VMARENA_TRANSFER_UCX_LONG_FLAP=1. Over a network
// that partitions, use the tcp kind, or a LeaseTimeout longer than the
// partitions the deployment must survive.
//
// # Device memory
//
// A device tensor (memory the process cannot address: a CUDA or
// AscendCL device's, the sim driver's; tensor.Tensor.Addressable false)
// registers on a tcp engine made with Config.Staging, which names the
// driver, the device whose streams run the copies and the size of one
// pinned host buffer (stream.NewHostBuffer, default 8 MiB), made at New
// and given back at Close. The buffer is halved: one half for the ops
// the engine issues, one for those it serves, so an op never waits for
// one of the same engine (an engine putting to itself, or two engines
// putting to each other, would deadlock on one shared piece). An op
// moves in pieces of a half, in order, under one hold of the tensor
// (tensor.AccessDevice) for the whole op and the half's lock for each
// piece: a leaving piece is copied device to host on the half's stream
// and synced, then sent; an arriving piece is read from the socket, then
// copied host to device and synced before the next is read, so every
// byte is in device memory before the op is answered. Concurrent ops of
// one engine take turns per piece (a lock per half, not a ring of slots:
// while one piece is on the wire the half is busy; a ring would overlap
// one op's copy with another's send, at the cost of more pinned memory).
// The wire protocol is the same as for host memory, and so is the
// target's check: an op is refused against the registration's address,
// length, id, generation and writability before a byte moves, and the
// driver checks each copy against its mappings and access. A copy the
// driver refuses after part of a payload moved fails the op: a target
// reads away the rest of a put and answers the error, and drops the
// connection of a get whose first bytes went; an initiator drops the
// connection (the peer is closed, ErrClosed).
//
// The ucx kind refuses device tensors and Config.Staging
// (ErrUnsupported): it registers host memory with ucp_mem_map and lets
// UCX move it. A UCX built with CUDA (its cuda_copy, cuda_ipc and
// gdr_copy transports) would need no staging: ucp_mem_map of the device
// range with memory type UCS_MEMORY_TYPE_CUDA, remote keys packed over
// device memory, and ucp_put_nbx/ucp_get_nbx moving it by GPUDirect RDMA,
// CUDA IPC between processes of one machine, or UCX's own pipelined
// staging; the target's check would stay what it is for host memory
// (the registration's bounds, Trust), and the hold would cover the op
// between begin and end as now. This build's UCX (1.13, no CUDA) has
// none of those transports, and nothing here tests them.
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
