package kvcache

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// TestGiveBack: GiveBack lowers the budget by what Spare counts — the
// free budget, idle slots' pages, cached prefix units — never below the
// running sequences' pages or one page, and never preempts; bad input
// changes nothing.
func TestGiveBack(t *testing.T) {
	e := simEnv(t, 64*page, page)
	c := e.cache(t, tinyConfig(TokenMajor, 64, 8))
	run := func(first, n int) *Seq {
		prompt := make([]int, n)
		for i := range prompt {
			prompt[i] = first + i
		}
		s, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		_, err = s.Append(prompt[s.Len():])
		require.NoError(t, err)
		return s
	}
	keep := run(1000, 16) // 4 pages of 4 tokens
	for i := range 3 {
		require.NoError(t, run(2000+100*i, 32).Free()) // 8 pages each, cached or idle
	}
	require.Equal(t, uint64(60*page), c.Spare(), "all but the running sequence's 4 pages")

	before := c.Stats()
	_, err := c.GiveBack(0)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.Equal(t, before, c.Stats())

	got, err := c.GiveBack(40*page + 1) // rounded up to 41 pages
	require.NoError(t, err)
	require.Equal(t, uint64(41*page), got)
	require.Equal(t, uint64(23*page), c.Stats().Budget)
	require.LessOrEqual(t, e.used(t), uint64(23*page))
	got, err = c.GiveBack(1 << 40)
	require.NoError(t, err)
	require.Equal(t, uint64(19*page), got)
	st := c.Stats()
	require.Equal(t, uint64(4*page), st.Budget)
	require.Equal(t, 4, st.PagesCommitted)
	require.Zero(t, st.Preemptions)
	require.Equal(t, 16, keep.Len())
	require.Zero(t, c.Spare())
	got, err = c.GiveBack(page)
	require.NoError(t, err)
	require.Zero(t, got, "nothing is spare")
	require.NoError(t, c.Check())
	require.NoError(t, keep.Free())
	require.Equal(t, uint64(3*page), c.Spare(), "the budget keeps a page")
	require.NoError(t, c.Close())
	_, err = c.GiveBack(page)
	require.True(t, errors.Is(err, driver.ErrClosed), "%v", err)
	require.Zero(t, c.Spare())
}

// TestGiveBackHugeWant: a want near the top of uint64 (a caller asking
// for everything, math.MaxUint64) gives back all that Spare counts, as a
// want of exactly the spare bytes does; the books stay consistent and a
// later Admit and Append work.
func TestGiveBackHugeWant(t *testing.T) {
	for _, want := range []uint64{math.MaxUint64, math.MaxUint64 - page + 2} {
		e := simEnv(t, 64*page, page)
		c := e.cache(t, tinyConfig(TokenMajor, 64, 8))
		s, err := c.Admit(family(0, 16), 0)
		require.NoError(t, err)
		_, err = s.Append(family(0, 16))
		require.NoError(t, err)
		spare := c.Spare()
		require.Equal(t, uint64(60*page), spare)
		got, err := c.GiveBack(want)
		require.NoError(t, err)
		require.Equal(t, spare, got, "want %d: everything spare", want)
		require.Equal(t, uint64(4*page), c.Stats().Budget)
		require.Zero(t, c.Spare())
		require.NoError(t, c.Check())
		_, err = c.SetBudget(8*page, Drop)
		require.NoError(t, err)
		_, err = s.Append([]int{7})
		require.NoError(t, err)
		require.NoError(t, c.Check())
	}
}

// TestGiveBackPastAHugeBudget: under a budget past the pages the books
// count (SetBudget(math.MaxUint64), no limit), GiveBack lowers the budget
// by what it was asked, in whole pages, and says so: the bytes it returns
// are the budget's fall, never more than the want rounded up to a page.
func TestGiveBackPastAHugeBudget(t *testing.T) {
	e := simEnv(t, 64*page, page)
	c := e.cache(t, tinyConfig(TokenMajor, 64, 8))
	_, err := c.SetBudget(math.MaxUint64, Drop)
	require.NoError(t, err)
	got, err := c.GiveBack(page + 1)
	require.NoError(t, err)
	require.Equal(t, uint64(2*page), got)
	require.Equal(t, uint64(math.MaxUint64-2*page), c.Stats().Budget)
	require.NoError(t, c.Check())
	s, err := c.Admit(family(0, 16), 0)
	require.NoError(t, err)
	_, err = s.Append(family(0, 16))
	require.NoError(t, err)
	require.NoError(t, c.Check())
}
