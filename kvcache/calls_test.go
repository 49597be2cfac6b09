package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
)

// TestDriverCalls counts the driver calls, by kind, of admitting a
// sequence whose prompt's whole units the prefix store holds, of its
// Free, and of a preemption.
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
			t.Logf("admit, %d tokens borrowed: %+v", b.Matched(), t1.Sub(t0))
			require.NoError(t, b.MarkWritten(b.Len()))
			require.NoError(t, b.Free())
			t2 := at()
			t.Logf("free: %+v", t2.Sub(t1))
			s, err := c.Admit(append(prompt, 4, 5), 0)
			require.NoError(t, err)
			_, err = s.Append(append(prompt, 4, 5)[s.Len():])
			require.NoError(t, err)
			t3 := at()
			require.NoError(t, s.Preempt(Drop))
			t4 := at()
			t.Logf("admit again: %+v; preempt: %+v", t3.Sub(t2), t4.Sub(t3))
			require.NoError(t, s.Free())
			require.NoError(t, c.Close())
		})
	}
}
