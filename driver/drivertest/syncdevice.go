package drivertest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// DeviceSyncer is a driver with streams whose SyncDevice waits for the
// work queued on them (sleep.DeviceSyncer's method).
type DeviceSyncer interface {
	driver.Streams
	SyncDevice(dev driver.DeviceID) error
}

// SyncDeviceWaits checks that d.SyncDevice(0) returns only after the work
// queued on d's streams at the call has run (a host function blocking on
// a channel; a watchdog, no timing asserted), and that each of bad, a
// device d lacks, is ErrNoDevice.
func SyncDeviceWaits(t *testing.T, d DeviceSyncer, bad ...driver.DeviceID) {
	t.Helper()
	s, err := d.CreateStream(1)
	require.NoError(t, err)
	gate := make(chan struct{})
	var ran atomic.Bool
	require.NoError(t, d.LaunchHostFunc(s, "gate", func() error { <-gate; ran.Store(true); return nil }))
	res := make(chan bool, 1)
	go func() {
		err := d.SyncDevice(0)
		res <- err == nil && ran.Load()
	}()
	time.Sleep(10 * time.Millisecond) // a chance to return early, were it wrong
	close(gate)
	select {
	case ok := <-res:
		require.True(t, ok, "SyncDevice failed or returned before the queued work ran")
	case <-time.After(20 * time.Second):
		t.Fatal("SyncDevice did not return after the work was released")
	}
	for _, dev := range bad {
		RequireIs(t, d.SyncDevice(dev), driver.ErrNoDevice)
	}
	require.NoError(t, d.DestroyStream(s))
}
