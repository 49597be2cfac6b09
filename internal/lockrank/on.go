//go:build invariants

package lockrank

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// Enabled is true in builds with the invariants tag: only then are the
// acquisitions recorded and checked.
const Enabled = true

// held is the ranks of the locks each goroutine holds, in the order it
// took them, by goroutine id. book guards it (a plain mutex: it is no
// lock of the order, and nothing is called under it).
var (
	book sync.Mutex
	held = map[uint64][]Rank{}
)

// goid names the calling goroutine while it lives: its g's address where
// the architecture lets this package read it (g_amd64.s, g_arm64.s: one
// instruction), its id from its stack's first line elsewhere (about a
// microsecond a call, and more on a deep stack: the Check of a model
// test calls the ledger's lock millions of times).
func goid() uint64 {
	if g := getg(); g != 0 {
		return uint64(g)
	}
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		panic("lockrank: no goroutine id in " + strconv.Quote(string(buf[:])))
	}
	return id
}

// before checks, ahead of taking a lock of rank r, that the goroutine
// holds none of a higher rank, and returns the goroutine's id.
func before(r Rank) uint64 {
	id := goid()
	book.Lock()
	var bad Rank
	for _, h := range held[id] {
		if h > r {
			bad = h
			break
		}
	}
	var hs []Rank
	if bad != rankNone { // copied only for the report: a Lock in order allocates nothing
		hs = append(hs, held[id]...)
	}
	book.Unlock()
	if bad != rankNone {
		panic(fmt.Sprintf("lockrank: %s (rank %d) taken while holding %s (rank %d): out of order (held, first taken first: %v); see the order in internal/lockrank's doc", r, r, bad, bad, hs))
	}
	return id
}

// acquired records that goroutine id holds a lock of rank r.
func acquired(id uint64, r Rank) {
	book.Lock()
	held[id] = append(held[id], r)
	book.Unlock()
}

// released records that a lock of rank r was let go: the last one of that
// rank the goroutine took, or, since a sync.Mutex may be unlocked by
// another goroutine than the one that locked it, another goroutine's.
func released(r Rank) {
	id := goid()
	book.Lock()
	defer book.Unlock()
	if drop(id, r) {
		return
	}
	for other := range held {
		if drop(other, r) {
			return
		}
	}
}

// drop removes the last r of goroutine id's held ranks; book is held.
func drop(id uint64, r Rank) bool {
	hs := held[id]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i] == r {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(held, id)
			} else {
				held[id] = hs
			}
			return true
		}
	}
	return false
}

// heldBy is the ranks goroutine id holds (tests).
func heldBy(id uint64) []Rank {
	book.Lock()
	defer book.Unlock()
	return append([]Rank(nil), held[id]...)
}
