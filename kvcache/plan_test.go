package kvcache

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestRefusedPlansCallNoDriver: on the sim driver, which counts every
// driver call, a Resume whose prefix the store still holds but whose
// other pages the budget cannot hold, and an Admit whose prompt it cannot
// hold, are refused before any map, unmap or commit: the driver's tally,
// the store's LRU and every book are as they were, the refusals counted.
// CanResume and CanAdmit said so first; once the budget is raised both
// say yes and the calls succeed.
func TestRefusedPlansCallNoDriver(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	cfg := microConfig(TokenMajor, 4096, 4)
	cfg.Budget = 8 * page
	c := e.cache(t, cfg)
	drv := e.drv.(*sim.Driver)
	p := seqTokens(600, 0, 100_000) // two whole units of 256 tokens, and a part
	s := prefill(t, c, p, 0)
	_, err := s.Append([]int{1, 2, 3})
	require.NoError(t, err)
	require.NoError(t, s.Preempt(Drop))
	// Its two prompt units stay cached, and fill the budget.
	_, err = c.SetBudget(2*page, Drop)
	require.NoError(t, err)
	require.Equal(t, 2, c.Stats().CachedPages)

	before := snapBooks(t, c, e)
	calls := drv.Tally().Total()
	can, err := s.CanResume(0)
	require.NoError(t, err)
	require.False(t, can, "the two units are lent, the third has no page")
	_, err = s.Resume()
	requireRefused(t, err, before, snapBooks(t, c, e), [2]uint64{0, c.Stats().FailedResumes}, "resume")
	require.Equal(t, calls, drv.Tally().Total())

	other := seqTokens(700, 0, 200_000)
	fits, err := c.CanAdmit(other, 0, 0)
	require.NoError(t, err)
	require.False(t, fits)
	_, err = c.Admit(other, 0)
	requireRefused(t, err, before, snapBooks(t, c, e), [2]uint64{0, c.Stats().FailedAdmits}, "admit")
	require.Equal(t, calls, drv.Tally().Total())

	_, err = c.SetBudget(8*page, Drop)
	require.NoError(t, err)
	can, err = s.CanResume(0)
	require.NoError(t, err)
	require.True(t, can)
	step, err := s.Resume()
	require.NoError(t, err)
	require.Equal(t, 512, step.Pos, "its two prompt units lent again")
	fits, err = c.CanAdmit(other, 0, 0)
	require.NoError(t, err)
	require.True(t, fits)
	o, err := c.Admit(other, 0)
	require.NoError(t, err)
	_, err = o.Append(other)
	require.NoError(t, err)
	st := c.Stats()
	require.Equal(t, [2]uint64{1, 1}, [2]uint64{st.FailedAdmits, st.FailedResumes})
	_, err = s.CanResume(0)
	requireIs(t, err, driver.ErrInvalid, "a running sequence")
	require.NoError(t, c.Check())
}

// TestCanAdmitAskedAgain: CanAdmit asked again about the same slice
// answers as a fresh slice does while the store changes under it — units
// published, evicted — and a slice changed in place is a new question
// only as another slice.
func TestCanAdmitAskedAgain(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 4)
	cfg.Budget = 6 * page
	c := e.cache(t, cfg)
	prompt := seqTokens(1100, 1100, 0) // four whole units, and a part
	ask := func(what string) bool {
		t.Helper()
		got, err := c.CanAdmit(prompt, 0, 0)
		require.NoError(t, err, what)
		fresh, err := c.CanAdmit(append([]int(nil), prompt...), 0, 0)
		require.NoError(t, err, what)
		require.Equal(t, fresh, got, what)
		again, err := c.CanAdmit(prompt, 0, 0)
		require.NoError(t, err, what)
		require.Equal(t, got, again, what)
		return got
	}
	require.True(t, ask("empty"))
	// A sequence shares the first three units: published, then cached.
	s := prefill(t, c, seqTokens(800, 800, 0), 0)
	require.True(t, ask("three units mapped by another"))
	require.NoError(t, s.Free())
	require.True(t, ask("three units cached"))
	// Another prompt takes the budget: the cached units are evicted.
	o := prefill(t, c, seqTokens(1200, 0, 50_000), 0)
	require.False(t, ask("the budget taken"))
	require.NoError(t, o.Free())
	require.True(t, ask("the budget free again, two units gone"))
	n, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	require.Equal(t, 256, n.Matched(), "a chain is evicted from its end: its first unit stayed")
	require.NoError(t, c.Check())
}

// TestAdmitRechecksARewrittenSlice: a caller that rewrites its prompt
// buffer in place between CanAdmit and Admit (engines reuse buffers) is
// admitted for what the buffer holds then: no prefix of the old prompt is
// borrowed, and a negative token written in is refused with nothing
// changed.
func TestAdmitRechecksARewrittenSlice(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 4)
	cfg.Budget = 6 * page
	c := e.cache(t, cfg)
	s := prefill(t, c, seqTokens(800, 800, 0), 0)
	require.NoError(t, s.Free())
	buf := seqTokens(1100, 1100, 0)
	fits, err := c.CanAdmit(buf, 0, 0)
	require.NoError(t, err)
	require.True(t, fits)

	buf[0] = -1
	before := c.Stats()
	_, err = c.Admit(buf, 0)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "token -1 at position 0 is negative")
	require.Equal(t, before, c.Stats(), "a refused admission changes nothing")
	require.NoError(t, c.Check())

	copy(buf, seqTokens(1100, 0, 50_000))
	n, err := c.Admit(buf, 0)
	require.NoError(t, err)
	require.Zero(t, n.Matched(), "the rewritten prompt shares nothing with the cached one")
	require.NoError(t, c.Check())
}

// TestCanAdmitHugeOutput: Cache.CanAdmit and Seq.CanResume count an
// output past MaxContext as MaxContext in all; math.MaxInt overflowed
// the sum to a negative total, which every budget held.
func TestCanAdmitHugeOutput(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(PerLayer, 1024, 2)
	cfg.Budget = 8 * page
	c := e.cache(t, cfg)
	prompt := []int{1, 2}
	for _, out := range []int{1022, math.MaxInt} {
		ok, err := c.CanAdmit(prompt, 0, out)
		require.NoError(t, err)
		require.False(t, ok, "%d more", out)
	}
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	_, err = s.Append(prompt)
	require.NoError(t, err)
	require.NoError(t, s.Preempt(Drop))
	for _, more := range []int{1022, math.MaxInt} {
		ok, err := s.CanResume(more)
		require.NoError(t, err)
		require.False(t, ok, "%d more", more)
	}
}
