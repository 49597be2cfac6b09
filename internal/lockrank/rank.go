package lockrank

import (
	"strconv"
	"strings"
	"sync"
)

// Rank is a lock's place in the order: a goroutine holding a lock of
// rank r takes only locks of rank r or above.
type Rank uint8

// The ranks, lowest first (the package doc says what each guards and what
// it is held across).
const (
	rankNone Rank = iota
	rankDisaggPrefill
	rankSleepManager
	rankKVHybrid
	rankKVCache
	rankTensorGrowable
	rankIPCSend
	rankIPCConn
	rankIPCReceive
	rankPoolCreating
	rankPool
	rankIPCImportedPool
	rankArenaAllocator
	rankMultidevGrants
	rankArena
	rankSparseMu
	rankMapping
	rankPhysical
	rankVaspaceSpace
	rankVaspaceReservation
	rankTransferPeer
	rankTransferStaging
	rankStreamEvent
	rankStream
	rankStreamHostBuffer
	rankSleepTagDriver
	rankPoolRegistry
	rankSleepHostCache
	rankTransferEngine
	rankIPCExportedPool
	rankIPCPeerProc
	rankDisaggDecode
	rankDisaggLocal
	rankStreamHooks
	rankSimCalls
	rankLedger
	rankQueueEngine
	rankAccelStreams
	rankHostBuffers
	rankBudgetBook
	rankTest // tests only: above every other
)

var names = [...]string{
	rankNone:               "none",
	rankDisaggPrefill:      "DisaggPrefill",
	rankSleepManager:       "SleepManager",
	rankKVHybrid:           "KVHybrid",
	rankKVCache:            "KVCache",
	rankTensorGrowable:     "TensorGrowable",
	rankIPCSend:            "IPCSend",
	rankIPCConn:            "IPCConn",
	rankIPCReceive:         "IPCReceive",
	rankPoolCreating:       "PoolCreating",
	rankPool:               "Pool",
	rankIPCImportedPool:    "IPCImportedPool",
	rankArenaAllocator:     "ArenaAllocator",
	rankMultidevGrants:     "MultidevGrants",
	rankArena:              "Arena",
	rankSparseMu:           "SparseMu",
	rankMapping:            "Mapping",
	rankPhysical:           "Physical",
	rankVaspaceSpace:       "VaspaceSpace",
	rankVaspaceReservation: "VaspaceReservation",
	rankStreamEvent:        "StreamEvent",
	rankStream:             "Stream",
	rankStreamHostBuffer:   "StreamHostBuffer",
	rankSleepTagDriver:     "SleepTagDriver",
	rankPoolRegistry:       "PoolRegistry",
	rankSleepHostCache:     "SleepHostCache",
	rankTransferPeer:       "TransferPeer",
	rankTransferStaging:    "TransferStaging",
	rankTransferEngine:     "TransferEngine",
	rankIPCExportedPool:    "IPCExportedPool",
	rankIPCPeerProc:        "IPCPeerProc",
	rankDisaggDecode:       "DisaggDecode",
	rankDisaggLocal:        "DisaggLocal",
	rankStreamHooks:        "StreamHooks",
	rankSimCalls:           "SimCalls",
	rankLedger:             "Ledger",
	rankQueueEngine:        "QueueEngine",
	rankAccelStreams:       "AccelStreams",
	rankHostBuffers:        "HostBuffers",
	rankBudgetBook:         "BudgetBook",
	rankTest:               "Test",
}

func (r Rank) String() string {
	if int(r) < len(names) {
		return names[r]
	}
	return "Rank(" + strconv.Itoa(int(r)) + ")"
}

// A ranker is a rank as a type, the type parameter of Mutex and RWMutex.
type ranker interface{ rank() Rank }

// The ranks as types, one per lock of the order.
type (
	DisaggPrefill      struct{}
	SleepManager       struct{}
	KVHybrid           struct{}
	KVCache            struct{}
	TensorGrowable     struct{}
	IPCSend            struct{}
	IPCConn            struct{}
	IPCReceive         struct{}
	PoolCreating       struct{}
	Pool               struct{}
	IPCImportedPool    struct{}
	ArenaAllocator     struct{}
	MultidevGrants     struct{}
	Arena              struct{}
	SparseMu           struct{}
	Mapping            struct{}
	Physical           struct{}
	VaspaceSpace       struct{}
	VaspaceReservation struct{}
	StreamEvent        struct{}
	Stream             struct{}
	StreamHostBuffer   struct{}
	SleepTagDriver     struct{}
	PoolRegistry       struct{}
	SleepHostCache     struct{}
	TransferPeer       struct{}
	TransferStaging    struct{}
	TransferEngine     struct{}
	IPCExportedPool    struct{}
	IPCPeerProc        struct{}
	DisaggDecode       struct{}
	DisaggLocal        struct{}
	StreamHooks        struct{}
	SimCalls           struct{}
	Ledger             struct{}
	QueueEngine        struct{}
	AccelStreams       struct{}
	HostBuffers        struct{}
	BudgetBook         struct{}
)

func (DisaggPrefill) rank() Rank      { return rankDisaggPrefill }
func (SleepManager) rank() Rank       { return rankSleepManager }
func (KVHybrid) rank() Rank           { return rankKVHybrid }
func (KVCache) rank() Rank            { return rankKVCache }
func (TensorGrowable) rank() Rank     { return rankTensorGrowable }
func (IPCSend) rank() Rank            { return rankIPCSend }
func (IPCConn) rank() Rank            { return rankIPCConn }
func (IPCReceive) rank() Rank         { return rankIPCReceive }
func (PoolCreating) rank() Rank       { return rankPoolCreating }
func (Pool) rank() Rank               { return rankPool }
func (IPCImportedPool) rank() Rank    { return rankIPCImportedPool }
func (ArenaAllocator) rank() Rank     { return rankArenaAllocator }
func (MultidevGrants) rank() Rank     { return rankMultidevGrants }
func (Arena) rank() Rank              { return rankArena }
func (SparseMu) rank() Rank           { return rankSparseMu }
func (Mapping) rank() Rank            { return rankMapping }
func (Physical) rank() Rank           { return rankPhysical }
func (VaspaceSpace) rank() Rank       { return rankVaspaceSpace }
func (VaspaceReservation) rank() Rank { return rankVaspaceReservation }
func (StreamEvent) rank() Rank        { return rankStreamEvent }
func (Stream) rank() Rank             { return rankStream }
func (StreamHostBuffer) rank() Rank   { return rankStreamHostBuffer }
func (SleepTagDriver) rank() Rank     { return rankSleepTagDriver }
func (SleepHostCache) rank() Rank     { return rankSleepHostCache }
func (PoolRegistry) rank() Rank       { return rankPoolRegistry }
func (TransferPeer) rank() Rank       { return rankTransferPeer }
func (TransferStaging) rank() Rank    { return rankTransferStaging }
func (TransferEngine) rank() Rank     { return rankTransferEngine }
func (IPCExportedPool) rank() Rank    { return rankIPCExportedPool }
func (IPCPeerProc) rank() Rank        { return rankIPCPeerProc }
func (DisaggDecode) rank() Rank       { return rankDisaggDecode }
func (DisaggLocal) rank() Rank        { return rankDisaggLocal }
func (StreamHooks) rank() Rank        { return rankStreamHooks }
func (SimCalls) rank() Rank           { return rankSimCalls }
func (Ledger) rank() Rank             { return rankLedger }
func (QueueEngine) rank() Rank        { return rankQueueEngine }
func (AccelStreams) rank() Rank       { return rankAccelStreams }
func (HostBuffers) rank() Rank        { return rankHostBuffers }
func (BudgetBook) rank() Rank         { return rankBudgetBook }

// Mutex is a sync.Mutex of rank R. In builds with the invariants tag its
// Lock panics when the goroutine holds a lock of a higher rank.
type Mutex[R ranker] struct{ mu sync.Mutex }

// Lock locks m, as sync.Mutex.Lock.
func (m *Mutex[R]) Lock() {
	if Enabled {
		var r R
		id := before(r.rank())
		m.mu.Lock()
		acquired(id, r.rank())
		return
	}
	m.mu.Lock()
}

// TryLock tries to lock m, as sync.Mutex.TryLock. It is never out of
// order (it does not wait), and is recorded when it succeeds.
func (m *Mutex[R]) TryLock() bool {
	ok := m.mu.TryLock()
	if Enabled && ok {
		var r R
		acquired(goid(), r.rank())
	}
	return ok
}

// Unlock unlocks m, as sync.Mutex.Unlock.
func (m *Mutex[R]) Unlock() {
	if Enabled {
		var r R
		released(r.rank())
	}
	m.mu.Unlock()
}

// RWMutex is a sync.RWMutex of rank R; its read and write locks are both
// of rank R.
type RWMutex[R ranker] struct{ mu sync.RWMutex }

// Lock locks rw for writing, as sync.RWMutex.Lock.
func (rw *RWMutex[R]) Lock() {
	if Enabled {
		var r R
		id := before(r.rank())
		rw.mu.Lock()
		acquired(id, r.rank())
		return
	}
	rw.mu.Lock()
}

// Unlock unlocks rw for writing.
func (rw *RWMutex[R]) Unlock() {
	if Enabled {
		var r R
		released(r.rank())
	}
	rw.mu.Unlock()
}

// RLock locks rw for reading, as sync.RWMutex.RLock.
func (rw *RWMutex[R]) RLock() {
	if Enabled {
		var r R
		id := before(r.rank())
		rw.mu.RLock()
		acquired(id, r.rank())
		return
	}
	rw.mu.RLock()
}

// RUnlock unlocks rw for reading.
func (rw *RWMutex[R]) RUnlock() {
	if Enabled {
		var r R
		released(r.rank())
	}
	rw.mu.RUnlock()
}

// TryLock and TryRLock are sync.RWMutex's, recorded when they succeed.
func (rw *RWMutex[R]) TryLock() bool {
	ok := rw.mu.TryLock()
	if Enabled && ok {
		var r R
		acquired(goid(), r.rank())
	}
	return ok
}

func (rw *RWMutex[R]) TryRLock() bool {
	ok := rw.mu.TryRLock()
	if Enabled && ok {
		var r R
		acquired(goid(), r.rank())
	}
	return ok
}

// Violation takes held, then take, lets both go and returns the report
// take's Lock panicked with when it was out of order ("" when it was
// not, and always without the invariants tag): for the tests of each
// package that show its locks are checked. Only a lockrank report is
// caught; any other panic goes on.
func Violation(held, take sync.Locker) (report string) {
	held.Lock()
	defer held.Unlock()
	defer func() {
		if r := recover(); r != nil {
			s, ok := r.(string)
			if !ok || !strings.HasPrefix(s, "lockrank: ") {
				panic(r)
			}
			report = s
		}
	}()
	take.Lock()
	take.Unlock()
	return ""
}
