package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestUnwrittenNeverServed: a sequence admitted and appended, then ended
// (Free, Preempt Drop or Swap, a budget cut) before its keys and values
// were written and marked, publishes nothing: the next request with its
// prompt matches no token and computes its own. (Before MarkWritten, its
// prompt units were published at Free or Preempt, and the next request
// matched whole units of zeros.)
func TestUnwrittenNeverServed(t *testing.T) {
	ends := map[string]func(t *testing.T, c *Cache, s *Seq){
		"Free":         func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Free()) },
		"Preempt Drop": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Drop)) },
		"Preempt Swap": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Swap)) },
		"SetBudget": func(t *testing.T, c *Cache, s *Seq) {
			pre, err := c.SetBudget(page, Drop)
			require.NoError(t, err)
			require.Equal(t, []*Seq{s}, pre)
			_, err = c.SetBudget(64*units.MiB, Drop)
			require.NoError(t, err)
		},
	}
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		for name, end := range ends {
			t.Run(layout.String()+"/"+name, func(t *testing.T) {
				e := hostEnv(t, 64*units.MiB)
				c := e.cache(t, microConfig(layout, 4096, 4))
				unit := c.TokensPerGroup()
				if layout == PerLayer {
					unit = 1024
				}
				prompt := seqTokens(2*unit+40, 2*unit+40, 0)
				a, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				_, err = a.Append(prompt) // rows handed out, never written
				require.NoError(t, err)
				end(t, c, a)

				b, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				require.Zero(t, b.Matched(), "no unwritten unit is served")
				require.Zero(t, b.Len())
				require.Zero(t, c.Stats().PrefixHits)
				require.NoError(t, c.Check())
			})
		}
	}
}

// TestMarkWritten: only the whole prompt units below what MarkWritten
// said are published, as soon as it says so; a sequence that wrote part
// of its prompt shares that part; MarkWritten refuses what it cannot
// mean, changing nothing.
func TestMarkWritten(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, microConfig(layout, 4096, 4))
			unit := c.TokensPerGroup()
			if layout == PerLayer {
				unit = 1024
			}
			prompt := seqTokens(3*unit+40, 3*unit+40, 0)
			a, err := c.Admit(prompt, 7)
			require.NoError(t, err)
			step, err := a.Append(prompt)
			require.NoError(t, err)
			writeStep(t, step, prompt, 7)
			require.Zero(t, a.Written())

			// Refusals change nothing.
			before := c.Stats()
			for _, n := range []int{-1, len(prompt) + 1} {
				drivertest.RequireIs(t, a.MarkWritten(n), driver.ErrInvalid, "the sequence holds")
			}
			require.Zero(t, a.Written())
			require.Equal(t, before, c.Stats())

			// Two units and a bit: two units published, not the third.
			require.NoError(t, a.MarkWritten(2*unit+5))
			require.Equal(t, 2*unit+5, a.Written())
			drivertest.RequireIs(t, a.MarkWritten(unit), driver.ErrInvalid, "only grows")
			require.Equal(t, 2*unit+5, a.Written())
			b, err := c.Admit(prompt, 7)
			require.NoError(t, err)
			require.Equal(t, 2*unit, b.Matched(), "the two written units")
			checkSeq(t, b, prompt, 7, 0, 2*unit)
			require.NoError(t, b.Free())

			require.NoError(t, a.MarkWritten(len(prompt)))
			b, err = c.Admit(prompt, 7)
			require.NoError(t, err)
			require.Equal(t, 3*unit, b.Matched(), "all three")
			checkSeq(t, b, prompt, 7, 0, 3*unit)
			require.NoError(t, c.Check())

			// A preempted sequence marks nothing; a freed one neither.
			require.NoError(t, b.Preempt(Drop))
			require.Zero(t, b.Written(), "dropped: its rows are gone")
			drivertest.RequireIs(t, b.MarkWritten(3*unit), driver.ErrInvalid, "preempted")
			_, err = b.Resume()
			require.NoError(t, err)
			require.Equal(t, b.Matched(), b.Written(), "resumed: the rows matched again")
			require.Less(t, b.Matched(), 3*unit, "the last token is left to compute")
			require.NoError(t, b.Free())
			drivertest.RequireIs(t, b.MarkWritten(3*unit), driver.ErrClosed, "freed")
			var zero Seq
			drivertest.RequireIs(t, zero.MarkWritten(0), driver.ErrInvalid)
			require.Zero(t, zero.Written())
			require.NoError(t, a.Free())
			require.NoError(t, c.Check())
		})
	}
}
