package ranges

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInsertFindDelete(t *testing.T) {
	var l List[uint64, string]
	i, ok := l.Insert(10, 20, "a")
	require.True(t, ok)
	require.Equal(t, 0, i)
	_, ok = l.Insert(30, 40, "c")
	require.True(t, ok)
	i, ok = l.Insert(20, 30, "b") // touching both neighbours is allowed
	require.True(t, ok)
	require.Equal(t, 1, i)

	for _, bad := range [][2]uint64{{15, 25}, {5, 11}, {39, 50}, {0, 100}, {25, 26}} {
		in, ok := l.Insert(bad[0], bad[1], "x")
		require.False(t, ok, "%v", bad)
		require.Less(t, in, l.Len())
		require.Equal(t, 3, l.Len())
	}
	_, ok = l.Insert(7, 7, "empty")
	require.False(t, ok)

	j, ok := l.Find(25)
	require.True(t, ok)
	require.Equal(t, "b", l.At(j).Val)
	_, ok = l.Find(40)
	require.False(t, ok)
	_, ok = l.Find(9)
	require.False(t, ok)
	require.Equal(t, 3, l.Search(40))
	require.Equal(t, 0, l.Search(0))

	lo, hi := l.Overlapping(15, 31)
	require.Equal(t, [2]int{0, 3}, [2]int{lo, hi})
	lo, hi = l.Overlapping(20, 30)
	require.Equal(t, [2]int{1, 2}, [2]int{lo, hi})
	lo, hi = l.Overlapping(40, 50)
	require.Equal(t, lo, hi)

	l.At(1).Val = "B"
	require.Equal(t, "B", l.At(1).Val)
	l.Delete(0, 2)
	require.Equal(t, 1, l.Len())
	require.Equal(t, "c", l.At(0).Val)
	require.NoError(t, l.Check())
}

func TestInsertRun(t *testing.T) {
	var l List[uint64, int]
	l.Insert(0, 10, 0)
	l.Insert(100, 110, 9)
	i, ok := l.InsertRun([]Item[uint64, int]{{10, 20, 1}, {30, 40, 2}, {40, 100, 3}})
	require.True(t, ok)
	require.Equal(t, 1, i)
	require.Equal(t, 5, l.Len())
	require.NoError(t, l.Check())
	// Overlapping the list, overlapping itself, unsorted, empty: refused.
	for _, run := range [][]Item[uint64, int]{
		{{5, 8, 0}},
		{{200, 210, 0}, {205, 220, 0}},
		{{300, 310, 0}, {250, 260, 0}},
		{{400, 400, 0}},
	} {
		_, ok := l.InsertRun(run)
		require.False(t, ok, "%v", run)
		require.Equal(t, 5, l.Len())
	}
}

func TestCheckFindsCorruption(t *testing.T) {
	var l List[uint64, int]
	l.Insert(0, 10, 0)
	l.Insert(20, 30, 0)
	l.At(1).Start = 5
	require.ErrorContains(t, l.Check(), "overlap")
	l.At(1).Start = 30
	require.ErrorContains(t, l.Check(), "empty")
}

// TestModel compares the list with a plain bitmap of owned units after
// every random insert and delete.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200
	for range 20 {
		var l List[uint64, int]
		var owner [n]int // 0 free, else value
		for step := range 500 {
			if rng.IntN(3) > 0 {
				a := uint64(rng.IntN(n))
				b := a + 1 + uint64(rng.IntN(10))
				b = min(b, n)
				free := true
				for x := a; x < b; x++ {
					free = free && owner[x] == 0
				}
				_, ok := l.Insert(a, b, step+1)
				require.Equal(t, free, ok)
				if ok {
					for x := a; x < b; x++ {
						owner[x] = step + 1
					}
				}
			} else if l.Len() > 0 {
				i := rng.IntN(l.Len())
				it := *l.At(i)
				l.Delete(i, i+1)
				for x := it.Start; x < it.End; x++ {
					owner[x] = 0
				}
			}
			require.NoError(t, l.Check())
			for x := uint64(0); x < n; x++ {
				i, ok := l.Find(x)
				require.Equal(t, owner[x] != 0, ok)
				if ok {
					require.Equal(t, owner[x], l.At(i).Val)
				}
			}
		}
	}
}
