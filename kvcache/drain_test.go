package kvcache

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestRevokeWaitsWithoutTheLock: an access through a sequence's tensor
// whose callback calls back into the cache (Stats, and an Admit, Append
// and Free of another sequence, where there is room) while the sequence is being freed,
// preempted or its cache closed: the revoke waits for the access with the
// cache's lock let go, so the callback's calls complete and then the
// revoke does. (Revoking under the lock, this deadlocked.) Nothing waits
// on the clock: the test orders the steps with channels, and polls only
// for the lease to be stopped.
func TestRevokeWaitsWithoutTheLock(t *testing.T) {
	ends := map[string]func(c *Cache, s *Seq) error{
		"Free":    func(c *Cache, s *Seq) error { return s.Free() },
		"Preempt": func(c *Cache, s *Seq) error { return s.Preempt(Drop) },
		"SetBudget": func(c *Cache, s *Seq) error {
			_, err := c.SetBudget(page, Drop)
			return err
		},
		"Close": func(c *Cache, s *Seq) error { return c.Close() },
	}
	for name, end := range ends {
		t.Run(name, func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, tinyConfig(PerLayer, 64, 2))
			prompt := []int{1, 2, 3, 4, 5, 6, 7, 8}
			s, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			_, err = s.Append(prompt)
			require.NoError(t, err)
			k, err := s.K(0)
			require.NoError(t, err)

			inside, proceed := make(chan struct{}), make(chan struct{})
			release := sync.OnceFunc(func() { close(proceed) })
			defer release() // a failed test lets the access end, and the cleanup's Close with it
			accessed := make(chan error, 1)
			go func() {
				accessed <- k.Access(true, func(b []byte) error {
					close(inside)
					<-proceed
					// Calls into the cache from inside the access.
					_ = c.Stats()
					if name == "Close" || name == "SetBudget" {
						return nil // closing, or a budget of one page: no room for another sequence
					}
					o, err := c.Admit([]int{9, 10}, 0)
					if err != nil {
						return err
					}
					if _, err := o.Append([]int{9, 10}); err != nil {
						return err
					}
					b[0] = 42 // the memory is still mapped
					return o.Free()
				})
			}()
			<-inside
			ended := make(chan error, 1)
			go func() { ended <- end(c, s) }()
			// The revoke has begun once the lease refuses a new access.
			for {
				if _, err := k.At(0, 0, 0); err != nil {
					drivertest.RequireIs(t, err, driver.ErrClosed)
					break
				}
				runtime.Gosched()
			}
			select {
			case err := <-ended:
				t.Fatalf("%s returned (%v) with an access in flight", name, err)
			default:
			}
			release()
			require.NoError(t, <-accessed)
			require.NoError(t, <-ended)
			if name != "Close" {
				require.NoError(t, c.Check())
			}
		})
	}
}
