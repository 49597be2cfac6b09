package kvcache

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestRevokeWaitsForAccess: goroutines reading and writing a sequence's
// tensors (K, and the rows Append handed out) in a loop while another
// preempts it, cuts the budget under it or closes the cache never touch
// unmapped memory: every At and Set either completes on mapped memory or
// answers ErrClosed. (Before the lease counted the accesses in flight, the
// check and the load raced the revoke-then-unmap, and the test binary died
// of a fault within a second.)
func TestRevokeWaitsForAccess(t *testing.T) {
	ends := map[string]func(t *testing.T, c *Cache, s *Seq){
		"Preempt": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Drop)) },
		"SetBudget": func(t *testing.T, c *Cache, s *Seq) {
			pre, err := c.SetBudget(page, Drop)
			require.NoError(t, err)
			require.Equal(t, []*Seq{s}, pre)
			_, err = c.SetBudget(64*units.MiB, Drop)
			require.NoError(t, err)
		},
		"Close": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, c.Close()) },
	}
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		for name, end := range ends {
			t.Run(layout.String()+"/"+name, func(t *testing.T) {
				e := hostEnv(t, 64*units.MiB)
				var c *Cache
				var s *Seq
				prompt := make([]int, 40)
				for i := range prompt {
					prompt[i] = i + 1
				}
				// fresh makes s run (admitted, or resumed) and returns the
				// rows it was handed to write.
				fresh := func() Step {
					if c == nil || c.Closed() {
						var err error
						c, err = New(e.space, e.mem, tinyConfig(layout, 64, 1))
						require.NoError(t, err)
						s = nil
					}
					if s == nil {
						var err error
						s, err = c.Admit(prompt, 0)
						require.NoError(t, err)
						step, err := s.Append(prompt)
						require.NoError(t, err)
						return step
					}
					step, err := s.Resume()
					require.NoError(t, err)
					return step
				}
				var cur atomic.Pointer[[]*tensor.Tensor]
				var stop atomic.Bool
				var faults atomic.Int64
				var wg sync.WaitGroup
				for g := 0; g < 2; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for !stop.Load() {
							ts := cur.Load()
							if ts == nil {
								continue
							}
							for _, tt := range *ts {
								idx := make([]int, tt.Dims())
								if _, err := tt.At(idx...); err != nil && !errors.Is(err, driver.ErrClosed) {
									faults.Add(1)
								}
								if err := tt.Set(float64(g), idx...); err != nil && !errors.Is(err, driver.ErrClosed) {
									faults.Add(1)
								}
							}
						}
					}()
				}
				bounded(t, "the rounds", func() struct{} {
					for round := 0; round < 200; round++ { // work counted, not timed
						step := fresh()
						k, err := s.K(0)
						require.NoError(t, err)
						v, err := s.V(3)
						require.NoError(t, err)
						last := step.Layers[3][len(step.Layers[3])-1]
						ts := []*tensor.Tensor{k, v, last.K, last.V}
						cur.Store(&ts)
						time.Sleep(10 * time.Microsecond)
						end(t, c, s)
					}
					return struct{}{}
				})
				stop.Store(true)
				wg.Wait()
				require.Zero(t, faults.Load(), "every access answered a value or ErrClosed")
				if !c.Closed() {
					require.NoError(t, c.Check())
					require.NoError(t, c.Close())
				}
			})
		}
	}
}
