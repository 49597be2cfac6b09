// Package lockrank is the lock order of the whole library, in one place,
// as the Go runtime's lockrank.go is: every mutex the library takes has a
// rank, and a goroutine takes locks in increasing rank only — holding a
// lock of rank r it may take locks of rank above r (or another lock of
// the same rank, on another object of the same kind), never one below.
// Two goroutines that both follow the order cannot deadlock on these
// locks.
//
// A lock is declared as a Mutex or RWMutex of its rank's type:
//
//	mu lockrank.Mutex[lockrank.KVCache]
//
// Its zero value is an unlocked mutex, as sync.Mutex's, and a *Mutex is a
// sync.Locker (sync.NewCond takes it). In builds with the invariants tag
// (go test -tags invariants) every Lock and RLock checks the locks its
// goroutine holds and panics, naming both and their ranks, when it would
// take a lock below one held: the out-of-order acquisition is caught the
// first time it runs, not the rare time it deadlocks. Without the tag the
// check is compiled out (Enabled is a constant): a Mutex is a
// sync.Mutex, BenchmarkMutex measures it beside one.
//
// # The order
//
// Lowest (taken first) to highest (taken last). Each line says what is
// called with the lock held; a leaf calls nothing that takes a lock.
//
//	DisaggPrefill      disagg.Prefill.mu: held across the exporter's Export and its releases (a
//	                   registration's bookkeeping, no I/O); never across the cache's Admit or the model.
//	SleepManager       sleep.Manager.mu: Free lets it go while a lease's Revoke waits, Sleep and Wake
//	                   while they copy; it is held across the tags' arena.Allocator calls.
//	KVHybrid           kvcache.Hybrid.mu: held across its groups' Cache calls (each takes KVCache)
//	                   and its recurrent state range's arena.Sparse calls; the groups' budgets move
//	                   under it.
//	KVCache            kvcache.Cache.mu: held across the slot range's arena.Sparse calls and the
//	                   prefix store's; never across a wait for a tensor access (drainLocked lets it go)
//	                   nor across KV event delivery (events.go).
//	TensorGrowable     tensor.Growable.mu: held across the arena.Arena calls that grow it.
//	IPCSend            ipc.Conn.sendMu: held across a pointer's sends on its own socket (the chunks and
//	                   the pointer go out in one piece), which wait while the peer reads nothing;
//	                   takes IPCConn between the sends, never across one.
//	IPCConn            ipc.Conn.mu: held across the pools' ReleaseImportFor; never across a send.
//	IPCReceive         ipc.ImportedPool.recv: orders the receivers of one imported pool; held while
//	                   a RecvPointer waits on the socket, with no other lock of this list held.
//	PoolCreating       pool's registry.creating: held across New and CloseDefaults' destroys.
//	Pool               pool.Pool.mu: held across its arena and stream calls.
//	IPCImportedPool    ipc.ImportedPool.mu: held across its page table's and physical memory's
//	                   calls and one release's send; never across a wait for the peer.
//	ArenaAllocator     arena.Allocator.mu: held across its arena.Arena calls.
//	MultidevGrants     multidev.Arena.grants: held across Grant's and Migrate's arena, stream and
//	                   driver calls.
//	Arena              arena.Arena.mu: held across its Sparse range's calls.
//	SparseMu           arena.Sparse.mu: held across the range's mapping.Table calls; never held while
//	                   another range's is taken. The range's other locks (ops, writing, moving) come
//	                   before it, in the order sparse.go gives; they are plain sync locks, since a
//	                   Move takes its private scratch range's ops while holding its own writing —
//	                   an order between two ranges of one kind that no rank of the kind can say.
//	Mapping            mapping.Table.mu (RW): held across physical.Memory and the driver's calls.
//	Physical           physical.Memory.mu: held across the driver's Create and Release.
//	VaspaceSpace       vaspace.Space.mu: held across the driver's Reserve and Unreserve; taken before
//	                   a reservation's mu. (A reservation's hold, a reader-writer gate held while a
//	                   Hold callback runs, is no lock of this list: it comes before everything.)
//	VaspaceReservation vaspace.Reservation.mu: held across the driver's calls on the range.
//	TransferPeer       transfer.Peer.mu: held across one op's network I/O and the registration's
//	                   tensor access (tensor.Lease takes no lock); takes TransferEngine.
//	TransferStaging    a half of transfer.Engine's staging buffer: held across one piece of a
//	                   device op (its stream's copy and sync, the piece's network I/O): before
//	                   the stream package's locks.
//	StreamEvent        stream.Event.mu: held across the driver's record and destroy of the event and
//	                   the recording stream's enqueue.
//	Stream             stream.Stream.mu: held across one enqueue into the driver (never a wait).
//	StreamHostBuffer   stream.HostBuffer.mu: a leaf; Free lets it go while the driver waits.
//	SleepTagDriver     sleep's tagDriver.mu: taken under the tag allocator's locks (the allocator
//	                   calls in); held across the real driver's calls only.
//	PoolRegistry       pool's registry.mu: a leaf (slice and map operations only).
//	SleepHostCache     sleep's hostCache.mu: a leaf (the kept pinned buffers); the driver's HostAlloc
//	                   and HostFree run without it.
//	TransferEngine     transfer.Engine.mu: a leaf (the maps of peers, connections, registrations).
//	IPCExportedPool    ipc.ExportedPool.mu: a leaf (the allow-list).
//	IPCPeerProc        ipc's peerProc.mu (RW): held for reading across a poll of the peer's pidfd,
//	                   bounded by the wait asked (PeerExitWait at most); a leaf.
//	DisaggDecode       disagg.Decode.mu: a leaf (the counts).
//	DisaggLocal        disagg.Local.mu: a leaf (the exported tensors and counts); Fetch copies
//	                   without it.
//	StreamHooks        stream's hooks.mu: a leaf; the hooks run after it is let go.
//	SimCalls           driver/sim's calls: held across the ledger's calls it counts.
//	Ledger             driver/internal/ledger's Ledger.mu (RW): held across the backend's system
//	                   calls; the driver's record, below every library lock.
//	QueueEngine        driver/internal/queue's Engine.mu: the streams and events of a driver; its
//	                   waits are a sync.Cond's, which let it go; operations run without it.
//	AccelStreams       driver/internal/accel's Core.mu: a leaf (the runtime streams).
//	HostBuffers        driver/internal/queue's HostBuffers.mu: a leaf (the pinned buffers).
//	BudgetBook         budget.Book.mu: held across the book file's lock, read and write (system
//	                   calls and a copy of a few KiB); never across a member's GiveBack callback
//	                   nor an asker's wait for one, so a callback may take any lock.
//
// Every object-wide lock of the library is on this list but the range's
// own ordering locks (SparseMu's line), a reservation's hold (VaspaceSpace's
// line) and the UCX binding's, which is below everything and calls only
// UCX. Code that waits on I/O or on another object's callback — a lease's
// revoke, a peer's socket, a caller's function — does so with no lock of
// this list held but the ones that say so above (TransferPeer, whose op
// is the I/O; IPCSend's and IPCImportedPool's sends on a local socket;
// IPCReceive, which guards only the order of one pool's receives).
package lockrank
