package ranges

import (
	"math/rand/v2"
	"slices"
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
		require.False(t, l.AddRun(run), "%v", run)
		require.Equal(t, 5, l.Len())
	}
	require.True(t, l.AddRun(nil))
	require.True(t, l.AddRun([]Item[uint64, int]{{120, 130, 4}, {130, 140, 5}}))
	require.Equal(t, 7, l.Len())
	require.NoError(t, l.Check())
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
				if ok != (owner[x] != 0) || ok && l.At(i).Val != owner[x] {
					t.Fatalf("step %d: find %d: %d, %v; the model says %d", step, x, i, ok, owner[x])
				}
			}
		}
	}
}

// sliceModel is the reference the tree is compared with: a plain sorted
// slice.
type sliceModel []Item[uint64, int]

func (m sliceModel) search(x uint64) int {
	i := 0
	for i < len(m) && m[i].End <= x {
		i++
	}
	return i
}

// runTreeModel decodes ops, three bytes an operation, into inserts, runs,
// deletes, bound changes and queries over [0, space), and compares the
// list with the model after each, the whole list and a few queries.
func runTreeModel(t *testing.T, space uint64, ops []byte) {
	var l List[uint64, int]
	m := sliceModel{}
	for step := 0; step+2 < len(ops); step += 3 {
		op, a, b := ops[step]%9, uint64(ops[step+1]), uint64(ops[step+2])
		x := (a*space/256 + b) % space
		switch op {
		case 0, 1: // insert
			end := x + 1 + b%5
			i, ok := l.Insert(x, end, step)
			j := m.search(x)
			want := j >= len(m) || m[j].Start >= end
			require.Equal(t, want, ok, "insert [%d, %d)", x, end)
			require.Equal(t, j, i)
			if ok {
				m = slices.Insert(m, j, Item[uint64, int]{x, end, step})
			}
		case 2: // a run of up to 8 unit ranges
			run := make([]Item[uint64, int], 0, 8)
			for k := range uint64(1 + b%8) {
				run = append(run, Item[uint64, int]{x + 2*k, x + 2*k + 1, step})
			}
			j := m.search(x)
			want := j >= len(m) || m[j].Start >= run[len(run)-1].End
			if a%2 == 0 { // by index, or without (AddRun)
				i, ok := l.InsertRun(run)
				require.Equal(t, want, ok)
				if ok {
					require.Equal(t, j, i)
				}
			} else {
				require.Equal(t, want, l.AddRun(run), "add run %v", run)
			}
			if want {
				m = slices.Insert(m, j, run...)
			}
		case 3: // delete up to 70 by index
			if len(m) == 0 {
				continue
			}
			lo := int(x) % len(m)
			hi := min(len(m), lo+int(b%70))
			l.Delete(lo, hi)
			m = slices.Delete(m, lo, hi)
		case 4: // change bounds
			if len(m) == 0 {
				continue
			}
			i := int(x) % len(m)
			start, end := m[i].Start+b%3, m[i].End+a%3
			ok := l.SetBounds(i, start, end)
			want := start < end && (i == 0 || m[i-1].End <= start) && (i+1 == len(m) || m[i+1].Start >= end)
			require.Equal(t, want, ok)
			if ok {
				m[i].Start, m[i].End = start, end
			}
		case 5: // overlapping
			lo, hi := l.Overlapping(x, x+b)
			wl := m.search(x)
			wh := wl
			for wh < len(m) && m[wh].Start < x+b {
				wh++
			}
			require.Equal(t, [2]int{wl, wh}, [2]int{lo, hi}, "overlapping [%d, %d)", x, x+b)
		case 6: // first fit
			from := int(a) % (len(m) + 1)
			want := from
			for want < len(m) && m[want].Size() < b%9 {
				want++
			}
			require.Equal(t, want, l.FirstFit(from, b%9))
		case 7: // add (no index)
			end := x + 1 + b%5
			o, ok := l.Add(x, end, step)
			j := m.search(x)
			want := j >= len(m) || m[j].Start >= end
			require.Equal(t, want, ok, "add [%d, %d)", x, end)
			if ok {
				require.Nil(t, o)
				m = slices.Insert(m, j, Item[uint64, int]{x, end, step})
			} else {
				require.Equal(t, m[j], *o, "in the way of [%d, %d)", x, end)
			}
		case 8: // delete by start: a listed start, or x
			at := x
			if len(m) > 0 && a%2 == 0 {
				at = m[int(x)%len(m)].Start
			}
			it, ok := l.DeleteStart(at)
			j := m.search(at)
			want := j < len(m) && m[j].Start == at
			require.Equal(t, want, ok, "delete at %d", at)
			if ok {
				require.Equal(t, m[j], it)
				m = slices.Delete(m, j, j+1)
			}
		}
		require.Equal(t, len(m), l.Len())
		require.NoError(t, l.Check())
		got := make(sliceModel, 0, len(m))
		for i, it := range l.All() {
			if i != len(got) {
				require.Equal(t, len(got), i, "the index All gives")
			}
			got = append(got, *it)
		}
		if !slices.Equal(m, got) { // (require.Equal is slow on every step)
			require.Equal(t, []Item[uint64, int](m), []Item[uint64, int](got[:len(got):len(got)]), "the whole list")
		}
		var largest uint64
		for _, it := range m {
			largest = max(largest, it.Size())
		}
		require.Equal(t, largest, l.Largest())
		q := x % (space + 2)
		i, ok := l.Find(q)
		j := m.search(q)
		require.Equal(t, j, i)
		require.Equal(t, j < len(m) && m[j].Start <= q, ok)
		require.Equal(t, j, l.Search(q))
		if g := l.Get(q); j < len(m) && m[j].Start <= q {
			require.Equal(t, m[j], *g, "get %d", q)
		} else {
			require.Nil(t, g, "get %d", q)
		}
		if o := l.Overlap(q, q+b%7); b%7 > 0 && j < len(m) && m[j].Start < q+b%7 {
			require.Equal(t, m[j], *o, "overlap [%d, +%d)", q, b%7)
		} else {
			require.Nil(t, o, "overlap [%d, +%d)", q, b%7)
		}
		var after []Item[uint64, int]
		for it := range l.After(q) {
			after = append(after, *it)
			if len(after) == 3 {
				break
			}
		}
		if want := []Item[uint64, int](m[j:min(len(m), j+3)]); !slices.Equal(want, after) {
			require.Equal(t, want, after, "after %d", q)
		}
		if len(m) > 0 {
			k := int(q) % len(m)
			require.Equal(t, m[k], *l.At(k))
			var back []int
			for i := range l.Backward(k + 1) {
				back = append(back, i)
				if len(back) == 3 {
					break
				}
			}
			for n, i := range back {
				require.Equal(t, k-n, i)
			}
			for i, it := range l.From(k) {
				require.Equal(t, k, i)
				require.Equal(t, m[k], *it)
				break
			}
		}
	}
}

// TestTreeModel runs long random sequences deep enough to split, borrow
// and merge at every level.
func TestTreeModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, space := range []uint64{300, 5000, 40000} {
		ops := make([]byte, 3*4000)
		for i := range ops {
			ops[i] = byte(rng.IntN(256))
		}
		// Mostly inserts first, then mostly deletes: the tree grows
		// several levels and shrinks back.
		for i := 0; i < len(ops)/2; i += 3 {
			if ops[i] %= 4; ops[i] == 3 {
				ops[i] = 7
			}
		}
		for i := len(ops) / 2; i+2 < len(ops); i += 3 {
			switch ops[i] % 4 {
			case 0:
				ops[i] = 3
			case 1:
				ops[i] = 8
			}
		}
		runTreeModel(t, space, ops)
	}
}

// TestBigTree builds a tree of a hundred thousand ranges and takes it down
// again, checking the shape at every thousandth step.
func TestBigTree(t *testing.T) {
	var l List[uint64, int]
	const n = 100_000
	for i := range n {
		x := uint64(i) * 7919 % n // every slot once, out of order
		_, ok := l.Insert(2*x, 2*x+1, int(x))
		require.True(t, ok)
		if i%1000 == 0 {
			require.NoError(t, l.Check())
		}
	}
	require.NoError(t, l.Check())
	for i, it := range l.All() {
		if it.Start != uint64(2*i) {
			t.Fatalf("range %d starts at %d", i, it.Start)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for l.Len() > 0 {
		if rng.IntN(2) == 0 {
			it := *l.At(rng.IntN(l.Len()))
			require.Equal(t, it, *l.Get(it.Start))
			got, ok := l.DeleteStart(it.Start)
			require.True(t, ok)
			require.Equal(t, it, got)
			require.Nil(t, l.Get(it.Start))
			continue
		}
		i := rng.IntN(l.Len())
		l.Delete(i, min(l.Len(), i+1+rng.IntN(3)))
		if l.Len()%997 == 0 {
			require.NoError(t, l.Check())
		}
	}
	require.NoError(t, l.Check())
}

// FuzzTreeModel decodes arbitrary bytes into operations, checked against
// the sorted-slice model.
func FuzzTreeModel(f *testing.F) {
	f.Add(uint16(300), []byte{0, 3, 5, 1, 2, 1, 3, 1, 0, 6, 1, 2})
	f.Add(uint16(50000), []byte{2, 0, 7, 2, 9, 7, 3, 0, 60, 4, 1, 1})
	f.Fuzz(func(t *testing.T, space uint16, ops []byte) {
		if len(ops) > 3*2000 {
			ops = ops[:3*2000]
		}
		runTreeModel(t, 1+uint64(space), ops)
	})
}
