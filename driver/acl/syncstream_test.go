package acl

import "testing"

// TestSyncStreamHandle: SyncStreamHandle(dev, 0) waits for work queued on
// the default stream by someone else (the stand-in's held work, as
// torch_npu's would be; the test's thread has no context of its own, so
// the whole device is waited for), then returns; bad devices, nil and
// closed drivers are refused.
func TestSyncStreamHandle(t *testing.T) {
	vendor.SyncStreamHandleWaits(t, small)
}
