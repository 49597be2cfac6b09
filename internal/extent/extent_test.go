package extent

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
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

// TestAgainstBitmap runs random alloc/free against a byte-per-unit model,
// in a space small enough to fill and in one cut into hundreds of extents
// (a tree of several levels), with alignments up to twice the largest
// request, so that long but misaligned extents are common.
func TestAgainstBitmap(t *testing.T) {
	for _, n := range []int{256, 4096} {
		againstBitmap(t, n)
	}
}

func againstBitmap(t *testing.T, n int) {
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	s := New(0, uint64(n))
	model := make([]bool, n)
	live := map[uint64]uint64{}
	for step := 0; step < 5000; step++ {
		if rng.IntN(2) == 0 || len(live) == 0 {
			size := uint64(rng.IntN(16) + 1)
			align := uint64(1) << rng.IntN(6)
			at, ok := s.Alloc(size, align)
			want, wantOK := modelAlloc(model, size, align)
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

// modelAlloc is Alloc's rule on a bitmap of used units: the lowest free
// extent at least size long whose aligned start leaves room, but after
// alignMisses such extents that do not, the lowest further extent of at
// least size+align-1 units.
func modelAlloc(used []bool, size, align uint64) (uint64, bool) {
	want, misses := size, 0
	for st := uint64(0); st < uint64(len(used)); {
		if used[st] {
			st++
			continue
		}
		end := st
		for end < uint64(len(used)) && !used[end] {
			end++
		}
		if end-st >= want {
			at := (st + align - 1) / align * align
			if end-at >= size && at < end {
				return at, true
			}
			if misses++; misses == alignMisses {
				want = size + align - 1
			}
		}
		st = end
	}
	return 0, false
}
