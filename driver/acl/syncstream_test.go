package acl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// TestSyncStreamHandle: SyncStreamHandle(dev, 0) waits for work queued on
// the default stream by someone else (the stand-in's held work, as
// torch_npu's would be), then returns; bad devices, nil and closed
// drivers are refused.
func TestSyncStreamHandle(t *testing.T) {
	lib := standin.Open(t, standin.ACL, small)
	d, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)

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
	case <-time.After(time.Minute):
		t.Fatal("SyncStreamHandle did not return after the held work finished")
	}
	require.Equal(t, uint64(1), lib.Held(), "it returned after the held work ran")

	drivertest.RequireIs(t, d.SyncStreamHandle(2, 0), driver.ErrNoDevice)
	var nilDriver *Driver
	drivertest.RequireIs(t, nilDriver.SyncStreamHandle(0, 0), driver.ErrInvalid)
	closed, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	drivertest.RequireIs(t, closed.SyncStreamHandle(0, 0), driver.ErrClosed)
}
