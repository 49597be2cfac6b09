package kvcache

import (
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
