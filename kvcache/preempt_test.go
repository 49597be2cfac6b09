package kvcache

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// grow admits a prompt and appends it and n more tokens in steps of
// step, writing every step; it returns the sequence and its tokens.
func grow(t testing.TB, c *Cache, prompt []int, n, step int) (*Seq, []int) {
	t.Helper()
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	tokens := append([]int(nil), prompt[:s.Len()]...)
	if s.Len() < len(prompt) {
		tokens = append(tokens, prompt[s.Len():]...)
		st, err := s.Append(prompt[s.Len():])
		require.NoError(t, err)
		writeStep(t, st, tokens, 0)
	}
	for i := 0; i < n; i += step {
		more := make([]int, min(step, n-i))
		for j := range more {
			more[j] = 7000 + len(tokens) + j
		}
		tokens = append(tokens, more...)
		st, err := s.Append(more)
		require.NoError(t, err)
		writeStep(t, st, tokens, 0)
	}
	return s, tokens
}

// TestMapAhead: with mapping ahead, a sequence decoding token by token
// finds every page committed before it needs it — only the prompt's
// Append may commit for itself — where without it every page crossing is
// a wait. The content is the same either way.
func TestMapAhead(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			waits := map[bool]int{}
			for _, ahead := range []bool{false, true} {
				e := hostEnv(t, 64*units.MiB)
				cfg := tinyConfig(layout, 256, 2)
				if ahead {
					cfg.MapAhead = 6
				}
				c := e.cache(t, cfg)
				s, err := c.Admit([]int{1, 2, 3}, 0)
				require.NoError(t, err)
				tokens := []int{1, 2, 3}
				st, err := s.Append(tokens)
				require.NoError(t, err)
				writeStep(t, st, tokens, 0)
				for i := 0; i < 150; i++ {
					bounded(t, "waiting for the mapper", func() struct{} { c.waitMapperIdle(); return struct{}{} })
					tokens = append(tokens, 100+i)
					st, err := s.Append(tokens[len(tokens)-1:])
					require.NoError(t, err)
					writeStep(t, st, tokens, 0)
				}
				checkSeq(t, s, tokens, 0, 0, len(tokens))
				stats := c.Stats()
				waits[ahead] = stats.Waits
				if ahead {
					require.Positive(t, stats.MapperCommits)
					// The prompt's Append may wait for its unit, or find it
					// committed already by the mapper, woken at Admit: the
					// decode steps after it never wait.
					require.LessOrEqual(t, stats.Waits, 1, "only the prompt's append may wait")
				} else {
					require.Zero(t, stats.MapperCommits)
					require.Equal(t, c.g.unitsFor(len(tokens)), stats.Waits, "a wait at every unit")
				}
				require.NoError(t, c.Check())
				require.NoError(t, s.Free())
				require.NoError(t, c.Close())
				require.Zero(t, e.used(t))
			}
			t.Logf("%s: %d waits without mapping ahead, %d with", layout, waits[false], waits[true])
		})
	}
}

// TestMapAheadStaysInBudget: the mapper never commits past the budget;
// an Append then commits itself (after reclaiming) and counts a wait.
func TestMapAheadStaysInBudget(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(TokenMajor, 256, 2)
	cfg.MapAhead, cfg.Budget = 12, 3*page
	c := e.cache(t, cfg)
	s, err := c.Admit([]int{1}, 0)
	require.NoError(t, err)
	_, err = s.Append([]int{1})
	require.NoError(t, err)
	bounded(t, "waiting for the mapper", func() struct{} { c.waitMapperIdle(); return struct{}{} })
	require.Equal(t, 3, c.Stats().PagesCommitted, "the mapper filled the budget and stopped")
	_, err = s.Append(make([]int, 11)) // 12 tokens: 3 pages, all there
	require.NoError(t, err)
	bounded(t, "waiting for the mapper", func() struct{} { c.waitMapperIdle(); return struct{}{} })
	_, err = s.Append(make([]int, 1))
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "budget")
	require.Equal(t, 1, c.Stats().Waits)
	require.NoError(t, c.Check())
}

// TestPreemptSwapResume: a swapped sequence gives its pages back, keeps
// its slot, and resumes at the same addresses with identical content.
func TestPreemptSwapResume(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, tinyConfig(layout, 256, 2))
			s, tokens := grow(t, c, []int{4, 5, 6}, 77, 10)
			addr := firstAddr(t, s, 1)
			committed := e.used(t)
			require.NoError(t, s.Preempt(Swap))
			st := c.Stats()
			require.Zero(t, st.PagesCommitted, "its pages are gone")
			require.Equal(t, committed, uint64(st.PooledPages)*page, "to the page pool")
			require.Equal(t, committed, e.used(t), "which keeps them committed")
			require.Equal(t, 1, st.Preempted)
			require.Equal(t, 1, st.Swaps)
			require.Equal(t, uint64(c.g.regions)*c.g.swapRegionBytes(len(tokens)), st.SwappedBytes)
			_, err := s.Append([]int{1})
			drivertest.RequireIs(t, err, driver.ErrInvalid, "preempted", "Resume")
			_, err = s.K(0)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "preempted")
			drivertest.RequireIs(t, s.Preempt(Drop), driver.ErrInvalid, "preempted")
			require.NoError(t, c.Check())

			step, err := s.Resume()
			require.NoError(t, err)
			require.Zero(t, step.N)
			require.Equal(t, committed, e.used(t))
			require.Equal(t, addr, firstAddr(t, s, 1), "same addresses")
			checkSeq(t, s, tokens, 0, 0, len(tokens))
			_, err = s.Resume()
			drivertest.RequireIs(t, err, driver.ErrInvalid, "running")
			require.NoError(t, c.Check())
			require.NoError(t, s.Free())
		})
	}
}

// TestPreemptDropResume: a dropped sequence keeps its tokens; Resume
// hands back views of every position to recompute.
func TestPreemptDropResume(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(PerLayer, 256, 2))
	s, tokens := grow(t, c, []int{4, 5, 6}, 40, 7)
	require.NoError(t, s.Preempt(Drop))
	require.Equal(t, tokens, s.Tokens())
	require.Equal(t, 1, c.Stats().Drops)
	step, err := s.Resume()
	require.NoError(t, err)
	require.Equal(t, 0, step.Pos)
	require.Equal(t, len(tokens), step.N)
	writeStep(t, step, tokens, 0)
	checkSeq(t, s, tokens, 0, 0, len(tokens))
	require.NoError(t, c.Check())
}

// TestSetBudget: lowering the budget gives back idle pages first, then
// surplus, then preempts the latest admitted sequences; a resume that
// does not fit is refused and changes nothing; raising it lets it in.
func TestSetBudget(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(TokenMajor, 256, 4))
	a, aTokens := grow(t, c, []int{1}, 39, 8)      // 10 pages
	b, bTokens := grow(t, c, []int{2}, 19, 8)      // 5 pages
	idle, _ := grow(t, c, []int{3}, 23, 8)         // 6 pages
	last, lastTokens := grow(t, c, []int{4}, 7, 8) // 2 pages: the latest
	require.NoError(t, idle.Free())
	require.Equal(t, 23, c.Stats().PagesCommitted)

	got, err := c.SetBudget(17*page, Drop)
	require.NoError(t, err)
	require.Empty(t, got, "the idle slot's 6 pages were enough")
	st := c.Stats()
	require.Equal(t, 17, st.PagesCommitted)
	require.Equal(t, 6, st.ReclaimedPages)

	got, err = c.SetBudget(12*page, Swap)
	require.NoError(t, err)
	require.Equal(t, []*Seq{last, b}, got, "the latest admitted first, until it fits")
	require.Equal(t, 10, c.Stats().PagesCommitted)
	require.Equal(t, 2, c.Stats().Preemptions)

	_, err = b.Resume()
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "budget")
	require.Equal(t, 1, c.Stats().Preempted-1, "b and last stay preempted")
	ok, err := c.CanAdmit([]int{9}, 0, 11)
	require.NoError(t, err)
	require.False(t, ok, "three pages do not fit in 12 with 10 committed")
	ok, err = c.CanAdmit([]int{9}, 0, 7)
	require.NoError(t, err)
	require.True(t, ok, "two do")

	_, err = c.SetBudget(64*page, Swap)
	require.NoError(t, err)
	for _, s := range []*Seq{b, last} {
		step, err := s.Resume()
		require.NoError(t, err)
		require.Zero(t, step.N)
	}
	checkSeq(t, a, aTokens, 0, 0, len(aTokens))
	checkSeq(t, b, bTokens, 0, 0, len(bTokens))
	checkSeq(t, last, lastTokens, 0, 0, len(lastTokens))
	require.NoError(t, c.Check())

	_, err = c.SetBudget(0, Swap)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "zero")
	_, err = c.SetBudget(page, 0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "preempt mode 0")
	drivertest.RequireIs(t, a.Preempt(7), driver.ErrInvalid, "preempt mode 7")
	_, err = c.CanAdmit(nil, 0, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "at least one token")
	require.Equal(t, uint64(64*page), c.Stats().Budget)
}

// TestConcurrentSequences: sequences appended, written and read from
// goroutines of their own, with the mapper committing ahead and a
// goroutine moving the budget up and down (never below what the tokens
// need: nothing is preempted under a writer), end with every byte as
// written and the books consistent. Run it with -race.
func TestConcurrentSequences(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 128*units.MiB)
			cfg := tinyConfig(layout, 192, 4)
			cfg.MapAhead = 8
			c := e.cache(t, cfg)
			var wg sync.WaitGroup
			stop := make(chan struct{})
			errs := make(chan error, 8)
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for round := 0; round < 3; round++ {
						prompt := []int{g, round}
						s, err := c.Admit(prompt, 0)
						if err != nil {
							errs <- err
							return
						}
						tokens := []int{}
						for len(tokens) < 150 {
							n := 1 + rng.IntN(9)
							more := make([]int, n)
							for j := range more {
								if p := len(tokens) + j; p < len(prompt) {
									more[j] = prompt[p]
								} else {
									more[j] = 100*g + p
								}
							}
							st, err := s.Append(more)
							if err != nil {
								errs <- err
								return
							}
							tokens = append(tokens, more...)
							writeStep(t, st, tokens, 0)
						}
						checkSeq(t, s, tokens, 0, 0, len(tokens))
						if err := s.Free(); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			go func() {
				defer close(stop)
				wg.Wait()
			}()
			budgets := 0
			bounded(t, "the sequences", func() struct{} {
				for {
					select {
					case <-stop:
						return struct{}{}
					default:
					}
					// 4 sequences of 192 tokens fit in 4*192*16 KiB = 12 MiB.
					b := uint64(12+budgets%8) * units.MiB
					runtime.Gosched()
					if _, err := c.SetBudget(b, Drop); err != nil {
						errs <- err
						return struct{}{}
					}
					budgets++
				}
			})
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Zero(t, c.Stats().Preemptions)
			require.NoError(t, c.Check())
			t.Log(fmt.Sprintf("%d budget changes; %+v", budgets, c.Stats()))
		})
	}
}

// TestConcurrentMisuse: the same sequence appended, preempted, resumed
// and freed from several goroutines at once, with the mapper committing
// ahead: every call either takes effect or is refused with its sentinel
// (a call that waited for the mapper checks again what it found), exactly
// one Free succeeds, and the books stay consistent.
func TestConcurrentMisuse(t *testing.T) {
	for round := 0; round < 20; round++ {
		e := hostEnv(t, 64*units.MiB)
		cfg := tinyConfig(TokenMajor, 4096, 2)
		cfg.MapAhead = 64
		c := e.cache(t, cfg)
		s, err := c.Admit([]int{1}, 0)
		require.NoError(t, err)
		_, err = s.Append([]int{1})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var mu sync.Mutex
		frees := 0
		unexpected := []error{}
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 30; i++ {
					var err error
					switch (g + i) % 4 {
					case 0:
						_, err = s.Append([]int{5, 6, 7})
					case 1:
						err = s.Preempt(Drop)
					case 2:
						_, err = s.Resume()
					case 3:
						if i > 20 {
							err = s.Free()
							if err == nil {
								mu.Lock()
								frees++
								mu.Unlock()
							}
						}
					}
					if err != nil && !errors.IsAny(err, driver.ErrInvalid, driver.ErrClosed, driver.ErrOutOfMemory) {
						mu.Lock()
						unexpected = append(unexpected, err)
						mu.Unlock()
					}
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		bounded(t, "the goroutines", func() struct{} { <-done; return struct{}{} })
		require.Empty(t, unexpected)
		require.Equal(t, 1, frees)
		require.NoError(t, c.Check())
		require.NoError(t, c.Close())
		require.Zero(t, e.used(t))
	}
}
