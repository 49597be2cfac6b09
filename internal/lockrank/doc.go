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
//	SleepManager      sleep.Manager.mu: Free lets it go while a lease's Revoke waits, Sleep and Wake
//	                  while they copy; it is held across the tags' arena.Allocator calls.
//	KVCache           kvcache.Cache.mu: held across the slot range's arena.Sparse calls and the
//	                  prefix store's; never across a wait for a tensor access (drainLocked lets it go)
//	                  nor across KV event delivery (events.go).
//	TensorGrowable    tensor.Growable.mu: held across the arena.Arena calls that grow it.
//	PoolCreating      pool's registry.creating: held across New and CloseDefaults' destroys.
//	Pool              pool.Pool.mu: held across its arena and stream calls.
//	ArenaAllocator    arena.Allocator.mu: held across its arena.Arena calls.
//	Arena             arena.Arena.mu: held across its Sparse range's calls.
//	SparseMu          arena.Sparse.mu: held across the range's mapping.Table calls; never held while
//	                  another range's is taken. The range's other locks (ops, writing, moving) come
//	                  before it, in the order sparse.go gives; they are plain sync locks, since a
//	                  Move takes its private scratch range's ops while holding its own writing —
//	                  an order between two ranges of one kind that no rank of the kind can say.
//	Mapping           mapping.Table.mu (RW): held across physical.Memory and the driver's calls.
//	Physical          physical.Memory.mu: held across the driver's Create and Release.
//	SleepTagDriver    sleep's tagDriver.mu: taken under the tag allocator's locks (the allocator
//	                  calls in); held across the real driver's calls only, whose locks are below none
//	                  of these. (Declared as a sync.Mutex until it is wired.)
//	PoolRegistry      pool's registry.mu: a leaf (slice and map operations only).
//	TransferPeer      transfer.Peer.mu: held across one op's network I/O and the registration's
//	                  tensor access (tensor.Lease takes no lock); takes TransferEngine.
//	TransferStaging   a half of transfer.Engine's staging buffer: held across one piece of a
//	                  device op (the driver's stream copy and sync, the piece's network I/O).
//	TransferEngine    transfer.Engine.mu: a leaf (the maps of peers, connections, registrations).
//
// The driver's own books (driver/internal/ledger) and the other locks of
// the library (the stream package's, ipc's, multidev's grants, disagg's,
// the memsvg book's) are below every one of these or leaves that call
// nothing; their order is written beside them. Code that waits on I/O or
// on another object's callback — a lease's revoke, a peer's socket, a
// caller's function — does so with no lock of this list held but the
// ones that say so above (TransferPeer, whose op is the I/O).
package lockrank
