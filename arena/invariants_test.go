//go:build invariants

package arena

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInvariantsBuildPoisons: under the invariants tag every pool poisons
// freed memory, even one created without PoolProps.Poison. Run with
// go test -tags invariants ./arena.
func TestInvariantsBuildPoisons(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, true, true)
	p, err := pe.p.MallocAsync(64, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.a.CopyHtoD(p, bytes.Repeat([]byte{1}, 64)))
	require.NoError(t, pe.p.FreeAsync(p, pe.a))
	stale := make([]byte, 64)
	require.NoError(t, pe.a.CopyDtoH(stale, p))
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, bytes.Repeat([]byte{PoisonByte}, 64), stale)
}
