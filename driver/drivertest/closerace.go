package drivertest

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// StreamsDriver is a driver with streams (driver.Streams).
type StreamsDriver interface {
	driver.Driver
	driver.Streams
}

// CloseRacingMap checks that a chunk mapped while Close runs either makes
// Close refuse (ErrBusy), changing nothing, or is refused itself
// (ErrClosed) because the driver closed: never a Close that refuses with
// the streams closed and the books open for good. The map comes from a
// host function, which Close waits for, once CreateEvent answers
// ErrClosed (the sign that Close has begun closing the streams), so the
// interleaving is certain. d has nothing mapped; CloseRacingMap closes
// it.
func CloseRacingMap(t *testing.T, d StreamsDriver) {
	t.Helper()
	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	mapped := make(chan error, 1)
	polled := make(chan error, 1)
	require.NoError(t, d.LaunchHostFunc(s, "maps while Close runs", func() error {
		err := untilClosing(d)
		polled <- err
		if err == nil {
			mapped <- d.Map(base, h)
		}
		return nil
	}))
	closeErr := d.Close()
	require.NoError(t, <-polled)
	mapErr := <-mapped
	if closeErr == nil {
		RequireIs(t, mapErr, driver.ErrClosed)
		_, err := d.Reserve(g, 0, 0)
		RequireIs(t, err, driver.ErrClosed)
		RequireIs(t, d.Close(), driver.ErrClosed)
		return
	}
	// Close refused: nothing changed, so the driver works on and a Close
	// with nothing mapped takes everything down.
	RequireIs(t, closeErr, driver.ErrBusy)
	require.NoError(t, mapErr)
	_, err = d.CreateStream(0)
	require.NoError(t, err, "a refused Close left the streams open")
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Close())
	_, err = d.Reserve(g, 0, 0)
	RequireIs(t, err, driver.ErrClosed)
}

// CloseFromHostFunc checks that a host function Close waits for may call
// Close too and gets ErrClosed at once (the driver is closing) rather
// than waiting for the first Close, which waits for it; the first Close
// succeeds. The host function calls Close once CreateEvent answers
// ErrClosed, the sign that Close has begun closing the streams. name
// starts the second Close's message. d has nothing mapped;
// CloseFromHostFunc closes it.
func CloseFromHostFunc(t *testing.T, d StreamsDriver, name string) {
	t.Helper()
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	inner := make(chan error, 1)
	require.NoError(t, d.LaunchHostFunc(s, "closes while Close runs", func() error {
		if err := untilClosing(d); err != nil {
			inner <- err
			return nil
		}
		inner <- d.Close()
		return nil
	}))
	require.NoError(t, d.Close())
	RequireIs(t, <-inner, driver.ErrClosed, name+": close")
	RequireIs(t, d.Close(), driver.ErrClosed)
}

// untilClosing returns once d's CreateEvent answers ErrClosed (Close has
// begun closing the streams), or with any other error it answers.
func untilClosing(d StreamsDriver) error {
	for {
		e, err := d.CreateEvent(0)
		if err == nil {
			err = d.DestroyEvent(e)
		}
		if errors.Is(err, driver.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		runtime.Gosched()
	}
}
