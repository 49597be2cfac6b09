//go:build invariants

package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// panicOf runs fn and returns what it panicked with, as text ("" when it
// did not panic).
func panicOf(fn func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	fn()
	return ""
}

// TestInvariantsBuildChecksEveryChange: under the invariants tag every
// change to a range, an arena or an allocator runs their checks, so a
// broken invariant stops the first change after it, naming that change.
// Run with go test -tags invariants ./arena.
func TestInvariantsBuildChecksEveryChange(t *testing.T) {
	e := newEnv(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, s.Commit(0, g))
	s.owned += g // corrupt the books
	require.Contains(t, panicOf(func() { _ = s.Commit(g, g) }), "invariants: after arena: commit")
	s.owned -= g
	require.NoError(t, s.Decommit(0, 2*g))

	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g})
	require.NoError(t, a.Grow(g))
	a.length = 3 * g // past what is committed
	require.Contains(t, panicOf(func() { _ = a.Shrink(0) }), "invariants: after arena: shrink")
	a.length = g

	al := e.fine(t, 8*g, PolicyDefault)
	p, err := al.Alloc(100, 0)
	require.NoError(t, err)
	al.held++
	require.Contains(t, panicOf(func() { _ = al.Free(p) }), "invariants: after arena: allocator free")
}
