package dl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// TestOnceBlockedLoad: a load that blocks holds up the callers of its own
// path for their wait only (ErrBusy), never those of another path; when
// it ends, later callers get its result, and it ran once.
func TestOnceBlockedLoad(t *testing.T) {
	var o Once[int]
	release := make(chan struct{})
	runs := 0
	blocked := func() (int, error) { runs++; <-release; return 7, nil }
	_, err := o.Load("stuck", 20*time.Millisecond, blocked)
	require.True(t, errors.Is(err, driver.ErrBusy), "%v", err)
	require.ErrorContains(t, err, "loading stuck has not finished")
	_, err = o.Load("stuck", 20*time.Millisecond, blocked)
	require.True(t, errors.Is(err, driver.ErrBusy), "a second caller waits for the same load, bounded")

	done := make(chan struct{})
	go func() {
		defer close(done)
		v, err := o.Load("other", time.Minute, func() (int, error) { return 3, nil })
		require.NoError(t, err)
		require.Equal(t, 3, v)
	}()
	<-done

	close(release)
	v, err := o.Load("stuck", time.Minute, blocked)
	require.NoError(t, err)
	require.Equal(t, 7, v)
	require.Equal(t, 1, runs, "the load ran once")
}

// TestOncePanic: a load that panics is an error, not a crash, and stays
// the path's answer.
func TestOncePanic(t *testing.T) {
	var o Once[int]
	for range 2 {
		_, err := o.Load("bad", time.Minute, func() (int, error) { panic("boom") })
		require.ErrorContains(t, err, "loading bad panicked: boom")
	}
}
