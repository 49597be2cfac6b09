package extent

import (
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
)

func TestAllocFreeCoalesce(t *testing.T) {
	s := New(0x1000, 0x10000)
	a, ok := s.Alloc(0x1000, 0x1000)
	require.True(t, ok)
	require.Equal(t, uint64(0x1000), a)
	b, ok := s.Alloc(0x1000, 0x4000)
	require.True(t, ok)
	require.Equal(t, uint64(0x4000), b)
	require.NoError(t, s.Check())
	require.False(t, s.AllocAt(0x4000, 0x1000), "taken")
	require.True(t, s.AllocAt(0x2000, 0x2000))
	require.NoError(t, s.Free(0x1000, 0x1000))
	require.NoError(t, s.Free(0x2000, 0x2000))
	require.NoError(t, s.Free(0x4000, 0x1000))
	require.NoError(t, s.Check())
	require.Equal(t, uint64(0x10000), s.Largest())
	require.Zero(t, s.InUse())
}

func TestDoubleFreeIsAssertion(t *testing.T) {
	s := New(0, 100)
	a, ok := s.Alloc(10, 0)
	require.True(t, ok)
	require.NoError(t, s.Free(a, 10))
	err := s.Free(a, 10)
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.True(t, errors.HasAssertionFailure(s.Free(90, 20)))
	require.NoError(t, s.Check())
	require.Zero(t, s.InUse())
}

func TestExhaustion(t *testing.T) {
	s := New(0, 64)
	for i := 0; i < 4; i++ {
		_, ok := s.Alloc(16, 16)
		require.True(t, ok)
	}
	_, ok := s.Alloc(1, 0)
	require.False(t, ok)
	require.NoError(t, s.Check())
}

// TestAgainstBitmap runs random alloc/free against a byte-per-unit model.
func TestAgainstBitmap(t *testing.T) {
	const n = 256
	rng := rand.New(rand.NewPCG(1, 2))
	s := New(0, n)
	var model [n]bool
	live := map[uint64]uint64{}
	for step := 0; step < 5000; step++ {
		if rng.IntN(2) == 0 || len(live) == 0 {
			size := uint64(rng.IntN(16) + 1)
			align := uint64(1) << rng.IntN(4)
			at, ok := s.Alloc(size, align)
			// First fit: the model finds the same lowest fitting start.
			want, wantOK := uint64(0), false
			for st := uint64(0); st+size <= n && !wantOK; st += align {
				free := true
				for k := st; k < st+size; k++ {
					free = free && !model[k]
				}
				if free {
					want, wantOK = st, true
				}
			}
			require.Equal(t, wantOK, ok, "step %d", step)
			if ok {
				require.Equal(t, want, at, "step %d", step)
				for k := at; k < at+size; k++ {
					model[k] = true
				}
				live[at] = size
			}
		} else {
			for at, size := range live {
				require.NoError(t, s.Free(at, size))
				for k := at; k < at+size; k++ {
					model[k] = false
				}
				delete(live, at)
				break
			}
		}
		require.NoError(t, s.Check(), "step %d", step)
	}
}
