package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestStaleTensorsAreClosed: a caller that keeps the tensors of a
// sequence past its Free, Preempt or the cache's Close gets ErrClosed from
// them and every view made of them, never a fault on the decommitted
// memory under them. (Before the lease, a K tensor read after Free and a
// reclaim segfaulted the test binary.)
func TestStaleTensorsAreClosed(t *testing.T) {
	ends := map[string]func(t *testing.T, c *Cache, s *Seq){
		"Free": func(t *testing.T, c *Cache, s *Seq) {
			require.NoError(t, s.Free())
			// Free keeps the slot's pages for the next sequence; a budget
			// of nothing takes them, so the memory really is gone.
			_, err := c.SetBudget(page, Drop)
			require.NoError(t, err)
		},
		"Preempt Drop":    func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Drop)) },
		"Preempt Swap":    func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Swap)) },
		"Close the cache": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, c.Close()) },
	}
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		for name, end := range ends {
			t.Run(layout.String()+"/"+name, func(t *testing.T) {
				e := hostEnv(t, 64*units.MiB)
				c := e.cache(t, tinyConfig(layout, 256, 2))
				prompt := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
				s, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				step, err := s.Append(prompt)
				require.NoError(t, err)
				writeStep(t, step, prompt, 0)
				k, err := s.K(1)
				require.NoError(t, err)
				view, err := k.Narrow(0, 0, 1)
				require.NoError(t, err)
				rows := step.Layers[0][0].V
				for _, tt := range []*tensor.Tensor{k, view, rows} {
					_, err := tt.At(make([]int, tt.Dims())...)
					require.NoError(t, err, "live while the sequence runs")
				}

				end(t, c, s)
				for i, tt := range []*tensor.Tensor{k, view, rows} {
					require.True(t, tt.Released(), "tensor %d", i)
					_, err := tt.At(make([]int, tt.Dims())...)
					drivertest.RequireIs(t, err, driver.ErrClosed, "released")
					drivertest.RequireIs(t, tt.Set(1, make([]int, tt.Dims())...), driver.ErrClosed)
					_, err = tt.Narrow(0, 0, 1)
					drivertest.RequireIs(t, err, driver.ErrClosed)
				}
				if name == "Close the cache" {
					return
				}
				require.NoError(t, c.Check())
			})
		}
	}
}

// TestTensorsOutliveGrowth: tensors handed out earlier stay usable while
// the sequence grows (the cache's views of the slot are remade larger,
// the memory under old tensors stays).
func TestTensorsOutliveGrowth(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(PerLayer, 512, 1))
	tokens := []int{1, 2, 3}
	s, err := c.Admit(tokens, 0)
	require.NoError(t, err)
	step, err := s.Append(tokens)
	require.NoError(t, err)
	writeStep(t, step, tokens, 0)
	k, err := s.K(0)
	require.NoError(t, err)
	want, err := k.At(2, 3, 4)
	require.NoError(t, err)
	for i := range 300 {
		tokens = append(tokens, 10+i)
		step, err := s.Append(tokens[len(tokens)-1:])
		require.NoError(t, err)
		writeStep(t, step, tokens, 0)
	}
	got, err := k.At(2, 3, 4)
	require.NoError(t, err, "an old tensor is still live after the sequence grew over several pages")
	require.Equal(t, want, got)
}
