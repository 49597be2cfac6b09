package acceltest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// deviceSyncer is sleep.DeviceSyncer (which this package may not import).
type deviceSyncer interface {
	SyncDevice(dev driver.DeviceID) error
}

// syncWatchdog is how long SyncDevice may take before the test calls it
// hung: far beyond what its work needs, never a pass/fail timing.
const syncWatchdog = 20 * time.Second

// SyncDeviceWaits: SyncDevice(0) returns only after the work queued at the
// call has run — a host function on one of the driver's own streams
// blocking on a channel, and work held on a stream of the device the
// driver never made (standin.Lib.Hold, as PyTorch's would be) — calling
// fn, the vendor's whole-device synchronisation, once. A device the driver
// lacks is ErrNoDevice and calls nothing; f refused is its sentinel; a
// library without fn (omit group "devsync") is ErrUnsupported naming it.
func (v Vendor[D]) SyncDeviceWaits(t *testing.T, cfg standin.Config, fn string, f Fault) {
	d, lib := v.OpenStandin(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
	t.Cleanup(lib.Release) // before the stand-in's teardown: nothing stays held
	ds, ok := any(d).(deviceSyncer)
	require.True(t, ok, "the %s driver has no SyncDevice", v.Standin)

	s, err := d.CreateStream(0)
	require.NoError(t, err)
	gate := make(chan struct{})
	var ran atomic.Bool
	require.NoError(t, d.LaunchHostFunc(s, "gate", func() error { <-gate; ran.Store(true); return nil }))
	require.NoError(t, lib.Hold(0))

	type result struct {
		err  error
		ran  bool
		held uint64
	}
	res := make(chan result, 1)
	go func() {
		err := ds.SyncDevice(0)
		res <- result{err, ran.Load(), lib.Held()}
	}()
	// Give SyncDevice the chance to return early, were it wrong; nothing
	// is asserted on time.
	time.Sleep(20 * time.Millisecond)
	close(gate)
	lib.Release()
	select {
	case r := <-res:
		require.NoError(t, r.err)
		require.True(t, r.ran, "SyncDevice returned before the driver's own stream's work ran")
		require.Equal(t, uint64(1), r.held, "SyncDevice returned before the work on the stream it never made ran")
	case <-time.After(syncWatchdog):
		t.Fatalf("SyncDevice(0) did not return within %v of the work's release", syncWatchdog)
	}
	require.Equal(t, uint64(1), lib.Calls(fn))

	for _, bad := range []driver.DeviceID{-1, driver.DeviceID(len(d.Devices()))} {
		drivertest.RequireIs(t, ds.SyncDevice(bad), driver.ErrNoDevice)
	}
	require.Equal(t, uint64(1), lib.Calls(fn), "a bad device calls nothing")

	lib.Fail(fn, 1, 1, f.Code)
	drivertest.RequireIs(t, ds.SyncDevice(0), f.Sentinel, f.Message)
	require.NoError(t, ds.SyncDevice(0), "a refused synchronisation leaves the device usable")
	require.NoError(t, d.DestroyStream(s))

	old := cfg
	old.Omit = []string{"devsync"}
	d2, _ := v.OpenStandin(t, old, func(path string) (D, error) { return v.Open(path, 0) })
	drivertest.RequireIs(t, any(d2).(deviceSyncer).SyncDevice(0), driver.ErrUnsupported, fn)
}
