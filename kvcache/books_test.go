package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/units"
)

// TestCheckCatchesBrokenCounters: every counter Stats and the budget's
// give-back read instead of walking is one Check recomputes; each one
// put wrong is reported, and put right again is not.
func TestCheckCatchesBrokenCounters(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	cfg := tinyConfig(TokenMajor, 256, 4)
	cfg.MapAhead = 4
	c := e.cache(t, cfg)
	c.stopMapper() // nothing changes behind the test's back
	prompt := family(0, 20)
	a, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	_, err = a.Append(prompt)
	require.NoError(t, err)
	require.NoError(t, a.MarkWritten(a.Len())) // publishes the prompt's units
	_, err = a.Append([]int{7})
	require.NoError(t, err)
	b, err := c.Admit(prompt, 0) // borrows them: shared
	require.NoError(t, err)
	_, err = b.Append(prompt[b.Len():])
	require.NoError(t, err)
	idle, err := c.Admit(family(1, 9), 0)
	require.NoError(t, err)
	_, err = idle.Append(family(1, 9))
	require.NoError(t, err)
	require.NoError(t, idle.MarkWritten(idle.Len()))
	_, err = idle.Append(family(1, 9)[:1]) // unpublished: its prompt's end
	require.NoError(t, err)
	require.NoError(t, c.Check())
	require.NoError(t, idle.Free())
	require.NoError(t, c.Check())
	st := c.Stats()
	require.Positive(t, st.IdlePages)
	require.Positive(t, st.SharedPages)
	require.Positive(t, st.TokensStored)

	c.mu.Lock()
	defer c.mu.Unlock()
	sa := a.sl
	breaks := []struct {
		name string
		v    *int
	}{
		{"owned units", &c.ownedUnits},
		{"idle units", &c.idleUnits},
		{"surplus units", &c.surplusUnits},
		{"running", &c.running},
		{"running tokens", &c.runningTokens},
		{"a slot's surplus", &sa.surplus},
		{"a slot's borrowed", &sa.borrowed},
		{"a slot's owned", &sa.owned},
		{"shared store units", &c.ps.sharedUnits},
		{"extra mappings", &c.ps.extraRefs},
	}
	for _, br := range breaks {
		*br.v++
		err := c.checkLocked()
		require.Error(t, err, br.name)
		require.True(t, errors.HasAssertionFailure(err), br.name)
		*br.v--
		require.NoError(t, c.checkLocked(), br.name)
	}

	// b's shared units are mapped read-only: one fewer counted shared is a
	// read-only unit where a writable one belongs, one more a writable
	// unit (a's own) counted read-only.
	sb := b.sl
	require.Positive(t, sb.shared)
	for _, d := range []int{-1, 1} {
		sb.shared += d
		require.Error(t, c.checkLocked(), "shared units off by %d", d)
		sb.shared -= d
	}
	require.NoError(t, c.checkLocked())

	hi := sa.hi
	sa.hi = 1
	require.Error(t, c.checkLocked(), "a bound below a unit in use")
	sa.hi = hi

	head := c.idleHead
	require.NotNil(t, head)
	c.idleHead, c.idleTail = nil, nil
	require.Error(t, c.checkLocked(), "an idle slot out of the list")
	c.idleHead, c.idleTail = head, head

	listed := c.ahead
	c.ahead = append([]*slot(nil), listed...)
	c.ahead = append(c.ahead, sa)
	require.Error(t, c.checkLocked(), "a slot listed twice for mapping ahead")
	c.ahead = listed

	if u, ok := c.aheadUnitLocked(sa); ok {
		require.True(t, sa.aheadListed, "unit %d wanted", u)
	}
	require.NoError(t, c.checkLocked())
}

// TestIdleListKeepsFreeOrder: idle slots are given back longest idle
// first whatever order their sequences were admitted in, and a failed
// admission puts its slot back in its place.
func TestIdleListKeepsFreeOrder(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	cfg := tinyConfig(TokenMajor, 256, 4)
	cfg.NoPrefixSharing = true
	c := e.cache(t, cfg)
	var seqs []*Seq
	for i := range 4 {
		tokens := make([]int, 4*(i+1)) // i+1 units of 4 tokens
		tokens[0] = i
		s, err := c.Admit(tokens[:1], 0)
		require.NoError(t, err)
		_, err = s.Append(tokens)
		require.NoError(t, err)
		seqs = append(seqs, s)
	}
	for _, i := range []int{2, 0, 3, 1} {
		require.NoError(t, seqs[i].Free())
	}
	order := func() []int {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []int
		for sl := c.idleHead; sl != nil; sl = sl.idleNext {
			out = append(out, sl.idx)
		}
		return out
	}
	require.Equal(t, []int{seqs[2].Slot(), seqs[0].Slot(), seqs[3].Slot(), seqs[1].Slot()}, order())
	// An admission takes its slot out of the list while it matches, and
	// one that fails puts it back in its place (done here by hand, as
	// Admit does).
	c.mu.Lock()
	sl := c.pickSlotLocked(nil)
	sl.admitting = true
	c.refileIdleLocked(sl)
	sl.admitting = false
	c.refileIdleLocked(sl)
	require.NoError(t, c.checkLocked())
	c.mu.Unlock()
	require.Equal(t, []int{seqs[2].Slot(), seqs[0].Slot(), seqs[3].Slot(), seqs[1].Slot()}, order())
	// Lowering the budget by the longest idle slot's pages gives back
	// that slot, whole.
	st := c.Stats()
	_, err := c.SetBudget(uint64(st.PagesCommitted-3)*page, Drop)
	require.NoError(t, err)
	require.Equal(t, []int{seqs[0].Slot(), seqs[3].Slot(), seqs[1].Slot()}, order())
	require.NoError(t, c.Check())
}
