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

// SyncStreamHandleWaits: SyncStreamHandle(0, 0) on d, opened over lib,
// waits for work held on the default stream of device 0 by someone other
// than the driver (standin.Lib.Hold, as a framework's would be) and
// returns once it has run; a device the driver lacks (ndev) is
// ErrNoDevice; a nil driver (nilDriver) is ErrInvalid; one reopened over
// lib and closed (closed) is ErrClosed.
func SyncStreamHandleWaits(t *testing.T, lib *standin.Lib, d, nilDriver, closed streamHandleSyncer, ndev int) {
	t.Helper()
	require.NoError(t, lib.Hold(0))
	t.Cleanup(lib.Release)
	done := make(chan error, 1)
	go func() { done <- d.SyncStreamHandle(0, 0) }()
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

	drivertest.RequireIs(t, d.SyncStreamHandle(driver.DeviceID(ndev), 0), driver.ErrNoDevice)
	drivertest.RequireIs(t, nilDriver.SyncStreamHandle(0, 0), driver.ErrInvalid)
	drivertest.RequireIs(t, closed.SyncStreamHandle(0, 0), driver.ErrClosed)
}
