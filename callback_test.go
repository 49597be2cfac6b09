package vmarena_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
)

// closeWithin runs m.Close and fails the test if it has not returned
// within a few seconds.
func closeWithin(t *testing.T, m *vmarena.Memory) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return: it waits on a callback that calls the Memory")
		return nil
	}
}

// TestCloseCallsBack: what Close closes may run the caller's code and
// wait for it — a KV cache's Config.Events, told at its Close that the
// index was cleared, on the goroutine calling Close; a host function
// ahead of a pool's free in flight, which the pool's Destroy waits for —
// and that code may call the Memory: Usage answers, a maker refuses
// (ErrClosed), and Close returns.
func TestCloseCallsBack(t *testing.T) {
	t.Run("kv events", func(t *testing.T) {
		m, err := vmarena.Open(vmarena.Options{Driver: "sim", Capacity: 64 * vmarena.MiB})
		require.NoError(t, err)
		var usageErr, makeErr error
		told := 0
		cfg := small
		cfg.Events = func(b kvcache.EventBatch) {
			for _, e := range b.Events {
				if _, ok := e.(*kvcache.AllBlocksCleared); ok {
					told++
					_, usageErr = m.Usage()
					_, makeErr = m.NewArena(vmarena.MiB)
				}
			}
		}
		_, err = m.NewKVCache(cfg)
		require.NoError(t, err)
		require.NoError(t, closeWithin(t, m))
		require.Equal(t, 1, told, "the cache's Close told the index cleared")
		require.NoError(t, usageErr, "Usage while Close runs")
		require.ErrorIs(t, makeErr, driver.ErrClosed)
		require.NoError(t, m.Close())
	})
	t.Run("pool free in flight", func(t *testing.T) {
		m, err := vmarena.Open(vmarena.Options{Capacity: 64 * vmarena.MiB})
		require.NoError(t, err)
		pl, err := m.NewPool(pool.Props{})
		require.NoError(t, err)
		s, err := stream.New(m.Driver(), 0)
		require.NoError(t, err)
		p, err := pl.MallocAsync(vmarena.MiB, s)
		require.NoError(t, err)
		var usageErr error
		closing := make(chan struct{})
		require.NoError(t, s.Launch("usage", func() error {
			<-closing
			time.Sleep(50 * time.Millisecond) // Close is waiting for the free behind this
			_, usageErr = m.Usage()
			return nil
		}))
		require.NoError(t, pl.FreeAsync(p, s))
		close(closing)
		require.NoError(t, closeWithin(t, m))
		require.NoError(t, usageErr, "Usage while Close runs")
	})
}
