package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestDriverCalls counts the driver calls, by kind, of admitting a
// sequence whose prompt's whole units the prefix store holds, of its
// Free, and of a preemption: a map a page (one call a mapping on CUDA
// and AscendCL) but where the slot keeps the unit mapped from its last
// sequence (kept.go: then none, and a Free unmaps none), access granted
// once a region and run (the shared units' read-only borrow, a
// commit's), and no release or create where the page pool serves.
func TestDriverCalls(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := simEnv(t, 64<<20, page)
			drv := e.drv.(*sim.Driver)
			cfg := tinyConfig(layout, 256, 4)
			c := e.cache(t, cfg)
			prompt := family(0, 200)
			a, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			_, err = a.Append(prompt[a.Len():])
			require.NoError(t, err)
			require.NoError(t, a.MarkWritten(a.Len()))
			require.NoError(t, a.Free())
			at := func() sim.Calls { return drv.Tally().Total() }
			t0 := at()
			b, err := c.Admit(append(prompt, 1, 2, 3), 0)
			require.NoError(t, err)
			_, err = b.Append(append(prompt, 1, 2, 3)[b.Len():])
			require.NoError(t, err)
			t1 := at()
			t.Logf("admit into the slot that keeps a's mappings, %d tokens borrowed: %+v", b.Matched(), t1.Sub(t0))
			regions := uint64(c.g.regions)
			shared := uint64(c.UnitsFor(b.Matched()))
			require.Positive(t, shared)
			require.Equal(t, a.Slot(), b.Slot(), "the slot keeping the prompt's units")
			require.Equal(t, int(shared), c.Stats().KeptReused, "every shared unit kept in place")
			require.Zero(t, t1.Sub(t0).Unmap, "nothing kept differs")
			require.Less(t, t1.Sub(t0).Map, shared*regions, "the kept units are not mapped again")
			require.LessOrEqual(t, t1.Sub(t0).SetAccess, 2*regions, "access once a region and run, not a page")
			// A second sequence of the same prompt beside b: no slot keeps
			// its units, so they are mapped, a map a page.
			d, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			td := at()
			t.Logf("admit beside it, %d tokens borrowed: %+v", d.Matched(), td.Sub(t1))
			require.NotEqual(t, b.Slot(), d.Slot())
			require.GreaterOrEqual(t, td.Sub(t1).Map, uint64(c.UnitsFor(d.Matched()))*regions, "a map a page")
			require.LessOrEqual(t, td.Sub(t1).SetAccess, 2*regions, "access once a region and run, not a page")
			require.NoError(t, d.Free())
			t1 = at()
			require.NoError(t, b.MarkWritten(b.Len()))
			require.NoError(t, b.Free())
			t2 := at()
			t.Logf("free: %+v", t2.Sub(t1))
			require.Zero(t, t2.Sub(t1).Release)
			require.Zero(t, t2.Sub(t1).SetAccess)
			require.Zero(t, t2.Sub(t1).Unmap, "the borrowed units stay mapped, kept")
			s, err := c.Admit(append(prompt, 4, 5), 0)
			require.NoError(t, err)
			_, err = s.Append(append(prompt, 4, 5)[s.Len():])
			require.NoError(t, err)
			t3 := at()
			require.NoError(t, s.Preempt(Drop))
			t4 := at()
			t.Logf("admit again: %+v; preempt: %+v", t3.Sub(t2), t4.Sub(t3))
			require.Zero(t, t3.Sub(t2).Create, "the idle slot's pages and the pool serve")
			require.LessOrEqual(t, t3.Sub(t2).SetAccess, 2*regions)
			require.Zero(t, t4.Sub(t3).Release, "a preemption's pages go to the pool")
			require.NoError(t, s.Free())
			require.NoError(t, c.Close())
		})
	}
}

// noReadOnly is a sim driver that cannot grant read-only access.
type noReadOnly struct{ *sim.Driver }

func (d noReadOnly) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if a == driver.AccessRead {
		return errors.Wrap(driver.ErrUnsupported, "noReadOnly: no read-only access")
	}
	return d.Driver.SetAccess(addr, size, dev, a)
}

// TestSharedWithoutReadOnly: on a driver that cannot map read-only, a
// match's shared units are borrowed writable (the tensors' refusal is
// the only guard), the books whole, and nothing is left of the refused
// read-only borrow.
func TestSharedWithoutReadOnly(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			sd, err := sim.New(sim.Options{Devices: 1, Capacity: 64 << 20, Granularity: page})
			require.NoError(t, err)
			drivertest.CloseAtEnd(t, sd)
			drv := noReadOnly{sd}
			e := &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
			c := e.cache(t, tinyConfig(layout, 256, 4))
			prompt := family(0, 100)
			a, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			_, err = a.Append(prompt)
			require.NoError(t, err)
			require.NoError(t, a.MarkWritten(a.Len()))
			b, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			require.Positive(t, b.Matched())
			require.False(t, c.protects)
			require.NoError(t, c.Check())
			require.NoError(t, a.Free())
			require.NoError(t, b.Free())
			require.NoError(t, c.Close())
			require.Zero(t, e.used(t))
		})
	}
}

// TestAdmitWeighsTheKeptSlot: an admission takes the slot keeping its
// match only where reusing the kept units saves more than unmapping the
// slot's other kept units costs (an unmap counted as unmapMaps maps);
// else a slot keeping nothing, which maps the match afresh and unmaps
// nothing, leaving the kept units where they are.
func TestAdmitWeighsTheKeptSlot(t *testing.T) {
	for _, tc := range []struct {
		name         string
		shared, tail int // tokens of the prompt shared with a's, and of a's own after them
		keptSlot     bool
	}{
		{"a long shared prefix", 192, 8, true},
		{"a short shared prefix before a long prompt of its own", 12, 188, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := simEnv(t, 64<<20, page)
			drv := e.drv.(*sim.Driver)
			c := e.cache(t, tinyConfig(TokenMajor, 256, 4))
			prompt := seqTokens(tc.shared+tc.tail, tc.shared+tc.tail, 0)
			a := prefill(t, c, prompt, 0)
			require.NoError(t, a.Free())
			kept := c.Stats().KeptUnits
			require.Positive(t, kept)

			other := seqTokens(tc.shared+8, tc.shared, 50000)
			t0 := drv.Tally().Total()
			b, err := c.Admit(other, 0)
			require.NoError(t, err)
			calls := drv.Tally().Total().Sub(t0)
			shared := c.UnitsFor(b.Matched())
			require.Positive(t, shared)
			st := c.Stats()
			if tc.keptSlot {
				require.Equal(t, a.Slot(), b.Slot(), "the slot keeping the shared units")
				require.Equal(t, shared, st.KeptReused, "each shared unit reused in place")
				require.Equal(t, uint64(kept-shared), calls.Unmap, "a's own units unmapped")
			} else {
				require.NotEqual(t, a.Slot(), b.Slot(), "a slot keeping nothing")
				require.Zero(t, st.KeptReused)
				require.Zero(t, calls.Unmap, "nothing unmapped on the admission's path")
				require.Equal(t, kept, st.KeptUnits, "a's units stay kept in its slot")
				require.GreaterOrEqual(t, calls.Map, uint64(shared), "the match mapped afresh")
			}
			require.NoError(t, c.Check())
			require.NoError(t, b.Free())
			require.NoError(t, c.Close())
		})
	}
}

// TestWarmClearsASpareSlot: where every free slot keeps units mapped,
// Warm unmaps those of the one an admission no kept units match would
// take (the fewest kept), so that admission unmaps nothing on its path;
// the other slot's kept units stay, and a Warm with a clean free slot
// unmaps nothing.
func TestWarmClearsASpareSlot(t *testing.T) {
	e := simEnv(t, 64<<20, page)
	drv := e.drv.(*sim.Driver)
	c := e.cache(t, tinyConfig(TokenMajor, 256, 2))
	a := prefill(t, c, seqTokens(120, 120, 0), 0)
	require.NoError(t, a.Free())
	b := prefill(t, c, seqTokens(40, 0, 7000), 0)
	require.NotEqual(t, a.Slot(), b.Slot(), "the clean slot")
	require.NoError(t, b.Free())
	before := c.Stats().KeptUnits
	c.mu.Lock()
	longKept, shortKept := c.slotList[a.Slot()].kept, c.slotList[b.Slot()].kept
	c.mu.Unlock()
	require.Positive(t, shortKept)
	require.Greater(t, longKept, shortKept)
	require.Equal(t, longKept+shortKept, before)

	t0 := drv.Calls()
	_, err := c.Warm(0)
	require.NoError(t, err)
	require.Equal(t, uint64(shortKept), drv.Calls().Sub(t0).Unmap, "the fewest-kept slot's units unmapped ahead")
	require.Equal(t, longKept, c.Stats().KeptUnits, "the other slot's stay")
	t1 := drv.Calls()
	_, err = c.Warm(0)
	require.NoError(t, err)
	require.Zero(t, drv.Calls().Sub(t1).Unmap, "a clean free slot: nothing to clear")

	d, err := c.Admit(seqTokens(40, 0, 90000), 0)
	require.NoError(t, err)
	require.Equal(t, b.Slot(), d.Slot())
	require.Zero(t, drv.Calls().Sub(t1).Unmap, "the admission unmaps nothing")
	require.NoError(t, c.Check())
	require.NoError(t, d.Free())
}

// TestClearKeptUnmapsWhatNoMatchBorrowed: ClearKept unmaps, ahead, the
// units a free slot keeps above the last one a match borrowed — its
// sequence's own question, past a shared document — a unit at a time as
// its bound allows, and never the document; the next admission sharing
// the document then takes the slot and reuses every document unit with
// no unmap on its path. A slot keeping nothing a match borrowed keeps
// what it has; a refused call changes nothing.
func TestClearKeptUnmapsWhatNoMatchBorrowed(t *testing.T) {
	e := simEnv(t, 64<<20, page)
	drv := e.drv.(*sim.Driver)
	c := e.cache(t, tinyConfig(TokenMajor, 512, 4))
	const doc, question = 192, 64
	up := c.g.unitPages()

	// Nothing a match borrowed: nothing to clear.
	x := prefill(t, c, seqTokens(doc+question, doc, 90000), 0)
	require.NoError(t, x.Free())
	kept := c.Stats().KeptUnits
	require.Positive(t, kept)
	n, err := c.ClearKept(1 << 20)
	require.NoError(t, err)
	require.Zero(t, n, "no unit of x's was borrowed by a match: no admission would reuse its slot's prefix")
	require.Equal(t, kept, c.Stats().KeptUnits)

	// b matches x's document and adds a question of its own: both
	// slots keep the document, a match borrowed, and a question above it.
	b := prefill(t, c, seqTokens(doc+question, doc, 50000), 0)
	docUnits := c.UnitsFor(b.Matched())
	require.Positive(t, docUnits)
	require.NotEqual(t, x.Slot(), b.Slot())
	require.NoError(t, b.Free())
	st := c.Stats()
	own := st.KeptUnits/2 - docUnits
	require.Positive(t, own, "each slot keeps its question's whole units past the document")

	// Refused: nothing changes.
	before := c.Stats()
	_, err = c.ClearKept(-1)
	requireIs(t, err, driver.ErrInvalid, "a negative bound")
	require.Equal(t, before, c.Stats())

	// The bound: none, then one unit's pages (of x's slot, the first
	// freed), then the rest.
	n, err = c.ClearKept(up - 1)
	require.NoError(t, err)
	require.Zero(t, n, "less than a unit's pages unmaps no unit")
	t0 := drv.Tally().Total()
	n, err = c.ClearKept(up)
	require.NoError(t, err)
	require.Equal(t, up, n)
	require.Equal(t, st.KeptUnits-1, c.Stats().KeptUnits)
	require.NoError(t, c.Check())
	n, err = c.ClearKept(1 << 20)
	require.NoError(t, err)
	require.Equal(t, (2*own-1)*up, n, "the rest of both questions, not the document")
	require.Equal(t, uint64(2*own*up), drv.Tally().Total().Sub(t0).Unmap)
	require.Equal(t, 2*docUnits, c.Stats().KeptUnits)
	n, err = c.ClearKept(1 << 20)
	require.NoError(t, err)
	require.Zero(t, n, "cleared")
	require.NoError(t, c.Check())

	// The next admission sharing the document reuses it where x's slot
	// keeps it: no unmap on its path.
	t1 := drv.Tally().Total()
	d, err := c.Admit(seqTokens(doc+question, doc, 70000), 0)
	require.NoError(t, err)
	require.Equal(t, x.Slot(), d.Slot(), "the lowest slot keeping the document")
	require.Zero(t, drv.Tally().Total().Sub(t1).Unmap)
	require.Equal(t, st.KeptReused+docUnits, c.Stats().KeptReused)
	require.NoError(t, c.Check())
	require.NoError(t, d.Free())
	require.NoError(t, c.Close())
	_, err = c.ClearKept(1)
	requireIs(t, err, driver.ErrClosed, "a closed cache")
	var zero *Cache
	_, err = zero.ClearKept(1)
	requireIs(t, err, driver.ErrInvalid, "a nil cache")
	require.Zero(t, e.used(t))
}
