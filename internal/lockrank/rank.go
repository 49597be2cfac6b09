package lockrank

import (
	"strconv"
	"sync"
)

// Rank is a lock's place in the order: a goroutine holding a lock of
// rank r takes only locks of rank r or above.
type Rank uint8

// The ranks, lowest first (the package doc says what each guards and what
// it is held across).
const (
	rankNone Rank = iota
	rankSleepManager
	rankKVCache
	rankTensorGrowable
	rankPoolCreating
	rankPool
	rankArenaAllocator
	rankArena
	rankSparseMu
	rankMapping
	rankPhysical
	rankSleepTagDriver
	rankPoolRegistry
	rankTransferPeer
	rankTransferStaging
	rankTransferEngine
	rankTest // tests only: above every other
)

var names = [...]string{
	rankNone: "none", rankSleepManager: "SleepManager", rankKVCache: "KVCache",
	rankTensorGrowable: "TensorGrowable", rankPoolCreating: "PoolCreating", rankPool: "Pool",
	rankArenaAllocator: "ArenaAllocator", rankArena: "Arena",
	rankSparseMu: "SparseMu",
	rankMapping:  "Mapping", rankPhysical: "Physical", rankSleepTagDriver: "SleepTagDriver",
	rankPoolRegistry: "PoolRegistry", rankTransferPeer: "TransferPeer", rankTransferStaging: "TransferStaging", rankTransferEngine: "TransferEngine",
	rankTest: "Test",
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
	SleepManager    struct{}
	KVCache         struct{}
	TensorGrowable  struct{}
	PoolCreating    struct{}
	Pool            struct{}
	ArenaAllocator  struct{}
	Arena           struct{}
	SparseMu        struct{}
	Mapping         struct{}
	Physical        struct{}
	SleepTagDriver  struct{}
	PoolRegistry    struct{}
	TransferPeer    struct{}
	TransferStaging struct{}
	TransferEngine  struct{}
)

func (SleepManager) rank() Rank    { return rankSleepManager }
func (KVCache) rank() Rank         { return rankKVCache }
func (TensorGrowable) rank() Rank  { return rankTensorGrowable }
func (PoolCreating) rank() Rank    { return rankPoolCreating }
func (Pool) rank() Rank            { return rankPool }
func (ArenaAllocator) rank() Rank  { return rankArenaAllocator }
func (Arena) rank() Rank           { return rankArena }
func (SparseMu) rank() Rank        { return rankSparseMu }
func (Mapping) rank() Rank         { return rankMapping }
func (Physical) rank() Rank        { return rankPhysical }
func (SleepTagDriver) rank() Rank  { return rankSleepTagDriver }
func (PoolRegistry) rank() Rank    { return rankPoolRegistry }
func (TransferPeer) rank() Rank    { return rankTransferPeer }
func (TransferStaging) rank() Rank { return rankTransferStaging }
func (TransferEngine) rank() Rank  { return rankTransferEngine }

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
