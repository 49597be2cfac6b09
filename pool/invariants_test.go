//go:build invariants

package pool

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestInvariantsBuildPoisons: under the invariants tag every pool poisons
// freed memory, even one created without Props.Poison. Run with
// go test -tags invariants ./pool.
func TestInvariantsBuildPoisons(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	p, err := pe.p.MallocAsync(64, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.a.CopyHtoD(p, bytes.Repeat([]byte{1}, 64)))
	require.NoError(t, pe.p.FreeAsync(p, pe.a))
	stale := make([]byte, 64)
	require.NoError(t, pe.a.CopyDtoH(stale, p))
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, bytes.Repeat([]byte{PoisonByte}, 64), stale)
}

// TestInvariantsBuildChecksEveryChange: under the invariants tag, a change
// that leaves a broken invariant behind stops right there, naming the
// operation, instead of surfacing later.
func TestInvariantsBuildChecksEveryChange(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	pe.p.mu.Lock()
	pe.p.usedCur += 7 // what a bug in the bookkeeping would do
	pe.p.mu.Unlock()
	panicked := func() (v any) {
		defer func() { v = recover() }()
		_, _ = pe.p.MallocAsync(64, pe.a)
		return nil
	}()
	require.NotNil(t, panicked, "the broken invariant went unnoticed")
	require.Contains(t, panicked, "invariants: after pool: malloc async")
	require.Contains(t, panicked, "live blocks hold 64 bytes, UsedMemCurrent says 71")
	var ptr driver.Addr
	pe.p.mu.Lock()
	pe.p.usedCur -= 7
	for a := range pe.p.live {
		ptr = a
	}
	pe.p.mu.Unlock()
	require.NoError(t, pe.p.Check())
	require.NoError(t, pe.p.FreeAsync(ptr, pe.a))
	require.NoError(t, pe.a.Synchronize())
}
