package sections

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/ranges"
)

// model is the simple reference: the ranges in a sorted slice.
type model struct{ items []ranges.Item[uint64, int] }

func (m *model) get(x uint64) *ranges.Item[uint64, int] {
	for i := range m.items {
		if m.items[i].Start <= x && x < m.items[i].End {
			return &m.items[i]
		}
	}
	return nil
}

func (m *model) overlaps(start, end uint64) bool {
	for _, it := range m.items {
		if it.Start < end && start < it.End {
			return true
		}
	}
	return false
}

func (m *model) add(start, end uint64, v int) {
	m.items = append(m.items, ranges.Item[uint64, int]{Start: start, End: end, Val: v})
	slices.SortFunc(m.items, func(a, b ranges.Item[uint64, int]) int { return int(a.Start) - int(b.Start) })
}

func (m *model) deleteStart(start uint64) bool {
	for i, it := range m.items {
		if it.Start == start {
			m.items = slices.Delete(m.items, i, i+1)
			return true
		}
	}
	return false
}

func (m *model) between(x, end uint64) []ranges.Item[uint64, int] {
	var out []ranges.Item[uint64, int]
	for _, it := range m.items {
		if it.Start < end && x < it.End {
			out = append(out, it)
		}
	}
	return out
}

// run plays ops (a byte stream) on a List over [base, base+size) with
// granules of gran and on the model, comparing every answer, and checks
// the List after each change.
func run(t testing.TB, ops []byte, base, size, gran uint64) {
	l := New[uint64, int](base, size, gran)
	var m model
	next := 0
	at := func(b byte) uint64 { return base + uint64(b)%(size/gran+2)*gran - gran } // a little outside too
	for i := 0; i+3 <= len(ops); i += 3 {
		op, a, b := ops[i], ops[i+1], ops[i+2]
		start := at(a)
		// Mostly one or two granules; sometimes a range over sections.
		n := uint64(b%3) + 1
		if b&0x80 != 0 {
			n = uint64(b&0x7f) + 1
		}
		end := start + n*gran
		switch op % 5 {
		case 0, 1:
			in := start >= base && end <= base+size
			next++
			o, ok := l.Add(start, end, next)
			switch {
			case !in:
				require.False(t, ok, "[%#x, %#x) is outside", start, end)
				require.Nil(t, o)
			case m.overlaps(start, end):
				require.False(t, ok, "[%#x, %#x) overlaps", start, end)
				require.NotNil(t, o)
				require.True(t, o.Start < end && start < o.End, "in the way: [%#x, %#x)", o.Start, o.End)
				require.NotNil(t, m.get(o.Start), "in the way is a listed range")
			default:
				require.True(t, ok, "[%#x, %#x)", start, end)
				m.add(start, end, next)
			}
		case 2:
			// Delete a listed range or a start nothing has.
			if len(m.items) > 0 && b&1 == 0 {
				start = m.items[int(a)%len(m.items)].Start
			}
			want := m.get(start)
			it, ok := l.DeleteStart(start)
			if want != nil && want.Start == start {
				require.True(t, ok)
				require.Equal(t, *want, it)
				require.True(t, m.deleteStart(start))
			} else {
				require.False(t, ok, "nothing starts at %#x", start)
			}
		case 3:
			x := start + uint64(b%7)*gran/3
			want, got := m.get(x), l.Get(x)
			if want == nil {
				require.Nil(t, got, "at %#x", x)
			} else {
				require.NotNil(t, got, "at %#x", x)
				require.Equal(t, *want, *got)
			}
		case 4:
			var got []ranges.Item[uint64, int]
			stop := int(b % 4) // sometimes stop early
			for it := range l.Between(start, end) {
				got = append(got, *it)
				if stop == 3 && len(got) == 2 {
					break
				}
			}
			want := m.between(start, end)
			if stop == 3 && len(want) > 2 {
				want = want[:2]
			}
			if len(want) == 0 {
				require.Empty(t, got, "between [%#x, %#x)", start, end)
			} else {
				require.Equal(t, want, got, "between [%#x, %#x)", start, end)
			}
		}
		require.NoError(t, l.Check())
		require.Equal(t, len(m.items), l.Len())
		var all []ranges.Item[uint64, int]
		for i, it := range l.All() {
			require.Equal(t, len(all), i)
			all = append(all, *it)
		}
		if len(m.items) == 0 {
			require.Empty(t, all)
		} else {
			require.Equal(t, m.items, all)
		}
		if len(m.items) > 0 {
			require.Equal(t, m.items[0], *l.First())
		} else {
			require.Nil(t, l.First())
		}
	}
	l.Clear()
	require.Zero(t, l.Len())
	require.NoError(t, l.Check())
}

// TestModel plays random operations against the model, on spans of a few
// sections (so ranges cross sections and covers change) and of one.
func TestModel(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 32))
	for round := range 60 {
		ops := make([]byte, 3*400)
		for i := range ops {
			ops[i] = byte(r.IntN(256))
		}
		gran := uint64(1) << (4 + round%3)
		size := gran * perSection * uint64(1+round%4) / 2 // half a section to two
		run(t, ops, 1<<20, size, gran)
	}
}

func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 1, 0x85, 0, 9, 2, 3, 1, 0, 2, 1, 0, 4, 0, 0xff})
	f.Fuzz(func(t *testing.T, ops []byte) {
		run(t, ops, 4096, 16*perSection*3, 16)
	})
}

// TestSectionsOfLargeSpans: the directory stays bounded for a huge span,
// and a zero-sized one holds nothing.
func TestSectionsOfLargeSpans(t *testing.T) {
	l := New[uint64, int](0, 1<<50, 64<<10)
	require.LessOrEqual(t, len(l.secs), maxSections)
	_, ok := l.Add(1<<49, 1<<49+64<<10, 1)
	require.True(t, ok)
	require.NotNil(t, l.Get(1<<49+5))
	require.NoError(t, l.Check())
	z := New[uint64, int](4096, 0, 16)
	_, ok = z.Add(4096, 4112, 1)
	require.False(t, ok)
	require.Nil(t, z.Get(4096))
	var nilList *List[uint64, int]
	require.Zero(t, nilList.Len())
	require.Nil(t, nilList.Get(1))
	require.Nil(t, nilList.First())
	_, ok = nilList.Add(0, 1, 1)
	require.False(t, ok)
	_, ok = nilList.DeleteStart(0)
	require.False(t, ok)
	nilList.Clear()
	require.NoError(t, nilList.Check())
	for range nilList.Between(0, 10) {
		t.Fatal("a nil list holds nothing")
	}
}
