package cachingmodel

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

func sizes(p pool) []uint64 {
	out := []uint64{}
	for _, b := range p.blocks() {
		out = append(out, b.size)
	}
	return out
}

func alloc(t *testing.T, m *Model, id int64, size uint64) []Segment {
	t.Helper()
	segs, err := m.Alloc(id, size, nil)
	require.NoError(t, err)
	require.NoError(t, m.Check())
	return segs
}

// TestRules: the rules by hand — a small request packed into a 2 MiB
// segment and split, a large one under 10 MiB splitting a 20 MiB
// segment, a remainder of 1 MiB or less left with a large allocation,
// best fit among free blocks, merging on free, a segment of its own
// rounded to 2 MiB for 10 MiB or more, and the OOM path that releases the
// empty segments and tries again.
func TestRules(t *testing.T) {
	m := New(64 * units.MiB)
	require.Equal(t, []Segment{{Addr: 0, Size: 2 * units.MiB}}, alloc(t, m, 1, 100)) // 512 B of a new 2 MiB segment
	require.Equal(t, []uint64{2*units.MiB - 512}, sizes(m.small))
	require.Equal(t, []Segment{{Addr: 2 * units.MiB, Size: 20 * units.MiB}}, alloc(t, m, 2, 3*units.MiB)) // 17 MiB left free
	require.Equal(t, uint64(22*units.MiB), m.Reserved())
	require.Equal(t, []uint64{17 * units.MiB}, sizes(m.large))
	require.Empty(t, alloc(t, m, 3, 16*units.MiB+512)) // best fit: the 17 MiB block, the rest (1 MiB - 512) too small to split
	require.Equal(t, uint64(17*units.MiB), m.live[3].size)
	require.Empty(t, m.large.blocks())
	require.NoError(t, m.Free(2))
	require.NoError(t, m.Free(3)) // merges with 2's block: the segment free whole
	require.NoError(t, m.Check())
	require.Equal(t, []uint64{20 * units.MiB}, sizes(m.large))
	require.Empty(t, alloc(t, m, 4, 11*units.MiB)) // the free 20 MiB block, split: 9 MiB left
	require.Equal(t, []uint64{9 * units.MiB}, sizes(m.large))
	require.Equal(t, []Segment{{Addr: 22 * units.MiB, Size: 22 * units.MiB}}, alloc(t, m, 5, 21*units.MiB+1)) // a segment of 22 MiB
	require.Equal(t, uint64(44*units.MiB), m.Peak())
	require.NoError(t, m.Free(5))
	// 30 MiB more does not fit beside the 44 reserved: the empty 22 MiB
	// segment goes back and it fits.
	require.Equal(t, []Segment{{Released: true, Addr: 22 * units.MiB, Size: 22 * units.MiB}, {Addr: 44 * units.MiB, Size: 30 * units.MiB}},
		alloc(t, m, 6, 30*units.MiB))
	require.Equal(t, 1, m.OOMs)
	require.Equal(t, 1, m.Releases)
	require.Equal(t, uint64(52*units.MiB), m.Reserved())
	require.Equal(t, 4, m.Mallocs)
}

// TestRefusals: each refusal names its cause, and changes nothing but
// what the OOM path released (reported).
func TestRefusals(t *testing.T) {
	m := New(24 * units.MiB)
	alloc(t, m, 1, 3*units.MiB)
	alloc(t, m, 2, 100)
	require.NoError(t, m.Free(2)) // its 2 MiB segment now empty
	before := *m
	for _, c := range []struct {
		id   int64
		size uint64
		want string
	}{
		{1, 100, "allocation 1 is live already"},
		{3, 0, "allocation 3 of 0 bytes"},
	} {
		segs, err := m.Alloc(c.id, c.size, nil)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, c.want)
		require.Empty(t, segs)
		require.Equal(t, before.Reserved(), m.Reserved())
		require.Equal(t, before.Live(), m.Live())
	}
	require.ErrorIs(t, m.Free(9), ErrInvalid)
	require.ErrorContains(t, m.Free(9), "free of allocation 9, not live")
	require.Equal(t, 1, m.Live())
	for _, size := range []uint64{30 * units.MiB, ^uint64(0), ^uint64(0) - 100} {
		segs, err := m.Alloc(7, size, nil)
		require.ErrorIs(t, err, ErrOutOfMemory)
		require.NoError(t, m.Check())
		require.Equal(t, 1, m.Live())
		if m.Releases == 1 && len(segs) == 1 {
			require.Equal(t, Segment{Released: true, Addr: 20 * units.MiB, Size: 2 * units.MiB}, segs[0], "the empty small segment given back")
		} else {
			require.Empty(t, segs, "nothing left empty to give back")
		}
	}
	require.Equal(t, uint64(20*units.MiB), m.Reserved())
	require.Equal(t, 3, m.OOMs)
}

// TestRandom: random allocations and frees against a reference of what
// is live; after each step the books hold (Check), the live set is the
// reference's, and reserved covers the rounded live bytes.
func TestRandom(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := New(2 * units.GiB)
		live := map[int64]uint64{}
		var ids []int64
		for step := range 3000 {
			if len(ids) > 0 && rng.IntN(2) == 0 {
				i := rng.IntN(len(ids))
				id := ids[i]
				ids[i] = ids[len(ids)-1]
				ids = ids[:len(ids)-1]
				require.NoError(t, m.Free(id))
				delete(live, id)
			} else {
				size := uint64(1) << rng.IntN(28)
				size += rng.Uint64N(size)
				id := int64(step)
				segs, err := m.Alloc(id, size, nil)
				var made uint64
				for _, s := range segs {
					if !s.Released {
						made += s.Size
					}
				}
				if err != nil {
					require.ErrorIs(t, err, ErrOutOfMemory)
					require.Zero(t, made)
				} else {
					live[id] = size
					ids = append(ids, id)
				}
			}
			require.NoError(t, m.Check(), "seed %d step %d", seed, step)
			require.Equal(t, len(live), m.Live())
			var rounded uint64
			for _, s := range live {
				rounded += Rounded(s)
			}
			require.GreaterOrEqual(t, m.Reserved(), rounded)
		}
	}
}

// TestExpandablePages: 2 MiB pages up to 2 MiB, 20 MiB pages above,
// rounded up, and no overflow at the top of the range.
func TestExpandablePages(t *testing.T) {
	for _, c := range []struct{ size, pages uint64 }{
		{0, 0}, {1, 1}, {2 * units.MiB, 1}, {2*units.MiB + 1, 1}, {20 * units.MiB, 1},
		{20*units.MiB + 1, 2}, {40 * units.MiB, 2}, {^uint64(0), ^uint64(0)/LargeBuffer + 1},
	} {
		require.Equal(t, c.pages, ExpandablePages(c.size), "size %d", c.size)
	}
}
