package acceltest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// streamHandleSyncer is the accelerator drivers' SyncStreamHandle, which
// libvmarena calls before a free.
type streamHandleSyncer interface {
	SyncStreamHandle(dev driver.DeviceID, stream uintptr) error
}

// SyncStreamHandleWaits: SyncStreamHandle(0, 0), on a driver opened over
// a fresh stand-in configured with cfg, waits for work held on the
// default stream of device 0 by someone other than the driver
// (standin.Lib.Hold, as a framework's would be) and returns once it has
// run; a device the driver lacks is ErrNoDevice; a nil driver is
// ErrInvalid; one opened over the same stand-in and closed is ErrClosed.
// It returns the driver, for the vendor's own checks.
func (v Vendor[D]) SyncStreamHandleWaits(t *testing.T, cfg standin.Config) D {
	t.Helper()
	open := func(path string) (D, error) { return v.Open(path, 0) }
	d, lib := v.OpenStandin(t, cfg, open)
	closed, err := open(lib.Path())
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	var nilDriver D
	syncer := func(x D) streamHandleSyncer {
		s, ok := any(x).(streamHandleSyncer)
		require.True(t, ok, "the %s driver has no SyncStreamHandle", v.Standin)
		return s
	}
	ds := syncer(d)
	require.NoError(t, lib.Hold(0))
	t.Cleanup(lib.Release)
	done := make(chan error, 1)
	go func() { done <- ds.SyncStreamHandle(0, 0) }()
	// One that did not wait would return in the pause (a slow machine
	// could make this miss such a bug, never fail a right one).
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("SyncStreamHandle returned (%v) while the stream's work was held", err)
	default:
	}
	lib.Release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(syncWatchdog):
		t.Fatal("SyncStreamHandle did not return after the held work finished")
	}
	require.Equal(t, uint64(1), lib.Held(), "it returned after the held work ran")

	drivertest.RequireIs(t, ds.SyncStreamHandle(driver.DeviceID(len(d.Devices())), 0), driver.ErrNoDevice)
	drivertest.RequireIs(t, syncer(nilDriver).SyncStreamHandle(0, 0), driver.ErrInvalid)
	drivertest.RequireIs(t, syncer(closed).SyncStreamHandle(0, 0), driver.ErrClosed)
	return d
}
