package lockrank

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// outer and inner are two ranks for the tests: inner above outer.
type (
	outer struct{}
	inner struct{}
)

func (outer) rank() Rank { return rankKVCache }
func (inner) rank() Rank { return rankTest }

// TestInOrder: locks taken in rank order, the same rank twice (two
// objects of one kind), read locks, a TryLock and a sync.Cond's wait never
// panic, in either build, and the mutexes exclude as sync's do.
func TestInOrder(t *testing.T) {
	var a, a2 Mutex[outer]
	var b RWMutex[inner]
	a.Lock()
	a2.Lock()
	b.RLock()
	b.RUnlock()
	b.Lock()
	b.Unlock()
	require.True(t, b.TryRLock())
	b.RUnlock()
	a2.Unlock()
	a.Unlock()

	// A cond's Wait unlocks and locks through the Locker.
	cond := sync.NewCond(&a)
	n := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				a.Lock()
				n++
				cond.Broadcast()
				a.Unlock()
			}
		}()
	}
	a.Lock()
	for n < 4000 {
		cond.Wait()
	}
	a.Unlock()
	wg.Wait()
	require.True(t, a.TryLock())
	a.Unlock()
	if Enabled {
		require.Empty(t, heldBy(goid()), "everything taken was let go")
	}
}

// TestOutOfOrder: under the invariants tag, taking a lock below one held
// panics, naming both, before it blocks; without the tag nothing is
// checked (and nothing is recorded: Enabled is a constant).
func TestOutOfOrder(t *testing.T) {
	var a Mutex[outer]
	var b RWMutex[inner]
	b.Lock()
	take := func() { a.Lock(); a.Unlock() }
	if !Enabled {
		require.NotPanics(t, take)
		b.Unlock()
		return
	}
	require.PanicsWithValue(t, fmt.Sprintf("lockrank: KVCache (rank %d) taken while holding Test (rank %d): out of order (held, first taken first: [Test]); see the order in internal/lockrank's doc", rankKVCache, rankTest), take)
	b.Unlock()
	// A read lock is checked too, and the check is per goroutine: another
	// goroutine holding inner does not stop this one taking outer.
	b.RLock()
	require.Panics(t, take)
	b.RUnlock()
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { b.Lock(); close(held); <-release; b.Unlock(); close(done) }()
	<-held
	require.NotPanics(t, take)
	close(release)
	<-done
	require.Empty(t, heldBy(goid()))
}

// TestCrossGoroutineUnlock: a mutex unlocked by another goroutine than
// the one that locked it (sync.Mutex allows it) leaves neither holding it.
func TestCrossGoroutineUnlock(t *testing.T) {
	var b Mutex[inner]
	b.Lock()
	me := goid()
	done := make(chan struct{})
	go func() { b.Unlock(); close(done) }()
	<-done
	if Enabled {
		require.Empty(t, heldBy(me))
	}
	var a Mutex[outer]
	require.NotPanics(t, func() { a.Lock(); a.Unlock() })
}

// TestOrderDocumented: every rank has a name, and the package doc lists
// each one, in rank order.
func TestOrderDocumented(t *testing.T) {
	last := -1
	for r := rankNone + 1; r < rankTest; r++ {
		name := r.String()
		require.NotContains(t, name, "Rank(", "rank %d has no name", r)
		i := strings.Index(docOrder, "\n//\t"+name+" ")
		require.Positive(t, i, "the doc's order lists %s", name)
		require.Greater(t, i, last, "%s is listed in rank order", name)
		last = i
	}
}

// BenchmarkMutex: an uncontended Lock and Unlock of a Mutex beside a
// sync.Mutex's, in the same run; the ratio "x-sync" is what the rank
// costs (1 without the invariants tag, where nothing is checked).
func BenchmarkMutex(b *testing.B) {
	var m Mutex[outer]
	var s sync.Mutex
	var tm, ts time.Duration
	const batch = 1000
	for b.Loop() {
		t0 := time.Now()
		for range batch {
			m.Lock()
			m.Unlock()
		}
		t1 := time.Now()
		for range batch {
			s.Lock()
			s.Unlock()
		}
		tm, ts = tm+t1.Sub(t0), ts+time.Since(t1)
	}
	b.ReportMetric(float64(tm.Nanoseconds())/float64(b.N*batch), "rank-ns/lock")
	b.ReportMetric(float64(ts.Nanoseconds())/float64(b.N*batch), "sync-ns/lock")
	b.ReportMetric(float64(tm)/float64(ts), "x-sync")
}

// TestViolation: Violation returns the report of an out-of-order Lock
// (nothing without the tag, and nothing for one in order), lets both
// locks go, and lets any other panic go on.
func TestViolation(t *testing.T) {
	var a Mutex[outer]
	var b Mutex[inner]
	got := Violation(&b, &a)
	if Enabled {
		require.Regexp(t, `^lockrank: KVCache \(rank \d+\) taken while holding Test \(rank \d+\)`, got)
		require.Empty(t, heldBy(goid()))
	} else {
		require.Empty(t, got)
	}
	require.Empty(t, Violation(&a, &b))
	require.True(t, a.TryLock())
	require.True(t, b.TryLock())
	b.Unlock()
	a.Unlock()
	require.PanicsWithValue(t, "other", func() { Violation(&a, panicker{}) })
	require.True(t, a.TryLock(), "let go after another panic too")
	a.Unlock()
}

// panicker is a Locker whose Lock panics with "other".
type panicker struct{}

func (panicker) Lock()   { panic("other") }
func (panicker) Unlock() {}
