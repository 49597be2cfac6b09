package ledger

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// TestHandlesModel: random creates, maps, unmaps and releases against a
// model that remembers every handle ever issued. No handle is issued
// twice or is zero; a live handle is accepted; a released one is refused
// as "already released" and one never issued as "unknown", both with
// ErrBadHandle and the record unchanged — whatever reuse the table makes
// of its slots.
func TestHandlesModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 19))
		l, err := New("test", devices(1), &perDevice{}, false)
		require.NoError(t, err)
		base, err := l.Reserve(64*g, 0, 0)
		require.NoError(t, err)
		issued := map[driver.Handle]bool{} // every handle given, live or not
		live := map[driver.Handle]bool{}
		mappedAt := map[driver.Handle]driver.Addr{}
		slotUsed := map[driver.Addr]bool{}
		var order []driver.Handle // issued, in order
		pick := func() driver.Handle {
			switch rng.IntN(4) {
			case 0:
				if len(order) > 0 {
					return order[rng.IntN(len(order))]
				}
			case 1:
				return driver.Handle(rng.Uint64N(1 << 40)) // mostly never issued
			case 2:
				if len(order) > 0 { // a neighbour: another slot or generation
					h := order[rng.IntN(len(order))]
					return h + driver.Handle(rng.IntN(3)) - 1 + driver.Handle(rng.IntN(3)-1)<<32
				}
			}
			return 0
		}
		for range 400 {
			switch op := rng.IntN(5); {
			case op <= 1 && len(live) < 40:
				h, err := l.Create(0, g, driver.ChunkOptions{})
				require.NoError(t, err)
				require.NotZero(t, h)
				require.False(t, issued[h], "handle %d issued twice", h)
				issued[h], live[h] = true, true
				order = append(order, h)
			case op == 2:
				h := pick()
				err := l.Release(h)
				switch {
				case live[h] && mappedAt[h] == 0:
					require.NoError(t, err)
					delete(live, h)
				case live[h]: // released, its memory kept for the mapping
					require.NoError(t, err)
					delete(live, h)
				default:
					requireBadHandle(t, err, issued[h])
				}
			case op == 3:
				h := pick()
				at := base + driver.Addr(rng.IntN(64))*g
				err := l.Map(at, h)
				switch {
				case !live[h]:
					requireBadHandle(t, err, issued[h])
				case slotUsed[at] || mappedAt[h] != 0:
					if err == nil {
						require.False(t, slotUsed[at], "mapped over a mapping")
						require.NoError(t, l.Unmap(at, g)) // a second mapping of h: undo it
					}
				default:
					require.NoError(t, err)
					mappedAt[h], slotUsed[at] = at, true
				}
			default:
				for h, at := range mappedAt {
					require.NoError(t, l.Unmap(at, g))
					delete(mappedAt, h)
					delete(slotUsed, at)
					break
				}
			}
			require.NoError(t, l.Check())
			n := 0
			for range l.chunks.all {
				n++
			}
			held := len(live)
			for h := range mappedAt {
				if !live[h] {
					held++ // released, kept while mapped
				}
			}
			require.Equal(t, held, n)
		}
		for _, at := range mappedAt {
			require.NoError(t, l.Unmap(at, g))
		}
		require.NoError(t, l.Unreserve(base, 64*g))
		require.NoError(t, l.Close())
	}
}

func requireBadHandle(t *testing.T, err error, issued bool) {
	t.Helper()
	require.True(t, errors.Is(err, driver.ErrBadHandle), "%v", err)
	if issued {
		require.ErrorContains(t, err, "already released")
	} else {
		require.ErrorContains(t, err, "unknown")
	}
}

// TestHandlesReuseSlots: a create after a release takes the slot the
// release left, at the next generation, and the released handle stays
// refused; a slot at the last generation is retired, never reissued.
func TestHandlesReuseSlots(t *testing.T) {
	l, err := New("test", devices(1), &perDevice{}, false)
	require.NoError(t, err)
	a, err := l.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	b, err := l.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, []driver.Handle{1, 2}, []driver.Handle{a, b}, "handles count up until a slot is reused")
	require.NoError(t, l.Release(a))
	c, err := l.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, a+1<<32, c, "the released slot, one generation on")
	requireBadHandle(t, l.Release(a), true)
	requireBadHandle(t, l.Map(0, a), true)
	requireBadHandle(t, l.Release(c+1<<32), false)

	l.chunks.slots[1].gen = math.MaxUint32 - 1 // b's slot, near its last generation
	l.chunks.slots[1].c.Handle = handleOf(1, math.MaxUint32-1)
	b = l.chunks.slots[1].c.Handle
	require.NoError(t, l.Check())
	require.NoError(t, l.Release(b))
	last, err := l.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, handleOf(1, math.MaxUint32), last)
	require.NoError(t, l.Release(last))
	require.NoError(t, l.Check())
	fresh, err := l.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, handleOf(2, 0), fresh, "the slot at its last generation is retired")
	requireBadHandle(t, l.Release(last), true)
	requireBadHandle(t, l.Release(b), true)
	require.NoError(t, l.Check())
	require.NoError(t, l.Close())
}
