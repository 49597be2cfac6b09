package kvcache

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestOccupancy: the per-slot map follows a sequence's life — its prompt's
// whole units borrowed from the prefix store and the rest its own, a second
// sequence borrowing the same units, a freed slot keeping its own pages
// (deferred reclaim) and a preempted one none — and agrees with Stats at
// every step. It is a copy: changing it changes nothing.
func TestOccupancy(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(PerLayer, 256, 3)) // 32 tokens a unit of 8 pages
	const up = 8
	const (
		E = UnitEmpty
		O = UnitOwned
		B = UnitBorrowed
		K = UnitKept
	)
	units8 := func(head ...UnitState) []UnitState {
		return append(head, slices.Repeat([]UnitState{E}, 8-len(head))...)
	}
	agree := func() []SlotOccupancy {
		t.Helper()
		occ := c.Occupancy()
		require.Len(t, occ, 3)
		st := c.Stats()
		owned, idle, running := 0, 0, 0
		for i, o := range occ {
			require.Equal(t, i, o.Slot)
			n := map[UnitState]int{}
			for _, u := range o.Units {
				n[u]++
			}
			require.Equal(t, n[O]*up, o.OwnedPages, "slot %d", i)
			require.Equal(t, n[B]*up, o.BorrowedPages, "slot %d", i)
			owned += o.OwnedPages
			switch o.State {
			case SlotIdle:
				idle += o.OwnedPages
				require.Zero(t, o.Tokens)
			case SlotRunning:
				running++
			}
		}
		require.Equal(t, st.SlotPages, owned)
		require.Equal(t, st.IdlePages, idle)
		require.Equal(t, st.Running, running)
		require.NoError(t, c.Check())
		return occ
	}
	for _, o := range agree() {
		require.Equal(t, SlotOccupancy{Slot: o.Slot, Units: units8()}, o, "nothing committed yet")
	}

	shared := seqTokens(64, 64, 0)
	a := prefill(t, c, append(slices.Clone(shared), 1, 2, 3, 4, 5, 6), 0)
	occ := agree()
	require.Equal(t, SlotOccupancy{Slot: a.Slot(), State: SlotRunning, Tokens: 70, Units: units8(B, B, O),
		OwnedPages: up, BorrowedPages: 2 * up}, occ[a.Slot()], "the prompt's two whole units are in the store")
	_, err := a.Append([]int{9}) // publishes a's prompt units
	require.NoError(t, err)

	b := prefill(t, c, append(slices.Clone(shared), 7, 7, 7), 0)
	require.Equal(t, 64, b.Matched())
	occ = agree()
	require.Equal(t, units8(B, B, O), occ[b.Slot()].Units, "b maps a's units")
	require.Equal(t, 2*up, c.Stats().SharedPages)

	occ[b.Slot()].Units[0] = UnitCommitting
	occ[b.Slot()].Tokens = 1000
	require.Equal(t, units8(B, B, O), c.Occupancy()[b.Slot()].Units, "a copy")
	require.Equal(t, 67, c.Occupancy()[b.Slot()].Tokens)

	require.NoError(t, a.Free())
	occ = agree()
	require.Equal(t, SlotOccupancy{Slot: a.Slot(), Units: units8(K, K, O), OwnedPages: up}, occ[a.Slot()],
		"the freed slot keeps its own unit, and the borrowed ones mapped (no page of its own)")

	require.NoError(t, b.Preempt(Drop))
	occ = agree()
	require.Equal(t, SlotOccupancy{Slot: b.Slot(), State: SlotPreempted, Tokens: 67, Units: units8(K, K)}, occ[b.Slot()],
		"a preempted slot's own page goes, its borrowed units stay mapped for its resume")

	require.NoError(t, c.Close())
	require.Nil(t, c.Occupancy())
}
