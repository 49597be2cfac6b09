package arena

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vmarena/vmarena/driver"
)

// The driver refuses to close while memory is mapped, and every layer
// refuses to close while something hangs from it. A test that leaves
// allocations or views live on purpose registers one of these cleanups, so
// that its driver still closes cleanly at the end.

// closeAllocator frees what a test left live in al and closes it.
func closeAllocator(t testing.TB, al *Allocator) {
	al.mu.Lock()
	closed := al.closed
	var live []driver.Addr
	if !closed {
		for _, h := range al.distinct() {
			h.allLive(func(off uint64) {
				live = append(live, h.s.Base()+driver.Addr(off))
			})
		}
		for off := range al.stitches {
			live = append(live, al.st.Base()+driver.Addr(off))
		}
	}
	al.mu.Unlock()
	if closed {
		return
	}
	for _, p := range live {
		assert.NoError(t, al.Free(p))
	}
	assert.NoError(t, al.Close())
}

// closeSparse releases the views a test left live on s and closes it.
func closeSparse(t testing.TB, s *Sparse) {
	s.mu.Lock()
	closed := s.closed
	var views []*View
	for v := range s.views {
		views = append(views, v)
	}
	s.mu.Unlock()
	if closed {
		return
	}
	for _, v := range views {
		if err := v.Release(); err != nil && !errors.Is(err, driver.ErrClosed) {
			assert.NoError(t, err)
		}
	}
	assert.NoError(t, s.Close())
}

// closeArena is closeSparse for an arena.
func closeArena(t testing.TB, a *Arena) {
	if a.Closed() {
		return
	}
	closeSparse(t, a.s)
	a.mu.Lock()
	a.length = 0
	a.mu.Unlock()
}
