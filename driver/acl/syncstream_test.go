package acl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// TestSyncStreamHandle: SyncStreamHandle(dev, 0) waits for work queued on
// the default stream by someone else (the stand-in's held work, as
// torch_npu's would be; the test's thread has no context of its own, so
// the whole device is waited for), then returns; bad devices, nil and
// closed drivers are refused.
func TestSyncStreamHandle(t *testing.T) {
	lib := standin.Open(t, standin.ACL, small)
	d, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	closed, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	acceltest.SyncStreamHandleWaits(t, lib, d, (*Driver)(nil), closed, len(d.Devices()))
}
