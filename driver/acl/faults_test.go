package acl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/internal/units"
)

const g = 64 * units.KiB // the stand-in's granularity in these tests

// TestAsyncFailureReported: a copy AscendCL accepts and then fails when it
// runs (ACL_ERROR_RT_SYS_DMA, a DMA fault) is reported by the next
// SyncStream, naming the operation and the code, in both wait modes; the
// stream goes on afterwards (AscendCL has no sticky context fault).
func TestAsyncFailureReported(t *testing.T) {
	for _, w := range []WaitMode{WaitEvent, WaitSync} {
		t.Run(w.String(), func(t *testing.T) {
			d, lib := openStandin(t, small, Options{Wait: w})
			base, h, s := acceltest.MappedWithStream(t, d, g)
			buf, err := d.HostAlloc(128) // 64-byte aligned, as async copies need
			require.NoError(t, err)
			lib.Fail("aclrtMemcpyAsync:exec", 1, 1, 507013)
			require.NoError(t, d.CopyHtoD(base, buf, s), "AscendCL accepts the copy")
			err = d.SyncStream(s)
			wait := map[WaitMode]string{WaitEvent: "aclrtSynchronizeEvent", WaitSync: "aclrtSynchronizeStream"}[w]
			drivertest.RequireIs(t, err, driver.ErrDeviceFault, wait+": ACL_ERROR_RT_SYS_DMA (507013)", "copy 128 bytes from the host")
			require.NoError(t, d.SyncStream(s), "reported once")
			copy(buf, "after")
			require.NoError(t, d.CopyHtoD(base, buf[:5], s))
			require.NoError(t, d.SyncStream(s), "the stream goes on")
			got := make([]byte, 5)
			require.NoError(t, d.Read(base, got))
			require.Equal(t, "after", string(got))
			require.NoError(t, d.HostFree(buf))
			require.NoError(t, d.DestroyStream(s))
			require.NoError(t, d.Unmap(base, g))
			require.NoError(t, d.Release(h))
		})
	}
}

// TestSetAccessRollsBackOnACLFailure: the second of three
// aclrtMemSetAccess (one per mapping: AscendCL's stays inside one)
// refused; the first set back on the device too.
func TestSetAccessRollsBackOnACLFailure(t *testing.T) {
	vendor.SetAccessRollsBack(t, small, acceltest.Fault{Fn: "aclrtMemSetAccess", Code: 207001, Sentinel: driver.ErrOutOfMemory,
		Message: "aclrtMemSetAccess: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)"})
}

// TestCreateFailureChangesNothing: aclrtMallocPhysical and the map
// refused (aclrtMemMapNoAccess, or aclrtMapMem where the library lacks
// it): nothing recorded, nothing held.
func TestCreateFailureChangesNothing(t *testing.T) {
	create := acceltest.Fault{Fn: "aclrtMallocPhysical", Code: 207001, Sentinel: driver.ErrOutOfMemory, Message: "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)"}
	vendor.CreateAndMapFailuresChangeNothing(t, small, create,
		acceltest.Fault{Fn: "aclrtMemMapNoAccess", Code: 107000, Sentinel: driver.ErrInvalid, Message: "aclrtMemMapNoAccess: ACL_ERROR_RT_PARAM_INVALID (107000)"})
	old := small
	old.Omit = []string{"mapnoaccess"}
	vendor.CreateAndMapFailuresChangeNothing(t, old, create,
		acceltest.Fault{Fn: "aclrtMapMem", Code: 107000, Sentinel: driver.ErrInvalid, Message: "aclrtMapMem: ACL_ERROR_RT_PARAM_INVALID (107000)"})
}

// TestReserveAlignment: aclrtReserveMemAddress takes no alignment and the
// stand-in never aligns to more than the granularity; the driver reserves
// more and uses the aligned part, and gives the whole back.
func TestReserveAlignment(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	calls := lib.Calls("aclrtReserveMemAddress")
	plain, err := d.Reserve(2*g, 0, 0)
	require.NoError(t, err)
	require.Equal(t, calls+1, lib.Calls("aclrtReserveMemAddress"), "the granularity needs no more")

	calls = lib.Calls("aclrtReserveMemAddress")
	base, err := d.Reserve(2*g, 4*g, 0)
	require.NoError(t, err)
	require.Zero(t, uint64(base)%(4*g), "aligned as asked")
	require.Equal(t, calls+2, lib.Calls("aclrtReserveMemAddress"), "tried, then reserved more")
	require.Equal(t, int64(2), lib.Live("reservations"), "the first try was given back")
	h, err := d.Create(0, 2*g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h), "the aligned part lies inside AscendCL's reservation")
	require.NoError(t, d.Unmap(base, 2*g))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(base, 2*g))
	require.NoError(t, d.Unreserve(plain, 2*g))
	require.Zero(t, lib.Live("reservations"), "the whole over-reserved range went back")
}

// TestStreamCallsFailCleanly: aclrtCreateStream, aclrtMallocHost and
// aclrtDeviceEnablePeerAccess refused leave nothing made.
func TestStreamCallsFailCleanly(t *testing.T) {
	vendor.StreamCallsFailCleanly(t, small,
		acceltest.Fault{Fn: "aclrtCreateStream", Code: 207008, Sentinel: driver.ErrOutOfMemory, Message: "aclrtCreateStream: ACL_ERROR_RT_NO_STREAM_RESOURCE (207008)"},
		acceltest.Fault{Fn: "aclrtMallocHost", Code: 207001, Sentinel: driver.ErrOutOfMemory, Message: "aclrtMallocHost: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)"},
		acceltest.Fault{Fn: "aclrtDeviceEnablePeerAccess", Code: 207000, Sentinel: driver.ErrUnsupported, Message: "aclrtDeviceEnablePeerAccess: ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000)"})
}

// TestSharedHandleFreeRefused: the last chunk over a handle this process
// shares with its own import is released, and AscendCL refuses to free
// the handle: the release fails having changed nothing (the handle is
// still held, its token still exported), and a retry frees it.
func TestSharedHandleFreeRefused(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	h, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	sh, err := d.Export(h)
	require.NoError(t, err)
	imp, err := d.Import(sh, 1)
	require.NoError(t, err)
	require.NoError(t, d.Release(h), "the import still holds the handle: nothing freed")
	lib.Fail("aclrtFreePhysical", 1, 1, 207002)
	drivertest.RequireIs(t, d.Release(imp), driver.ErrDeviceFault, "aclrtFreePhysical: ACL_ERROR_RT_MEMORY_FREE (207002)")
	require.Equal(t, g, lib.Used(0), "the memory is still held")
	require.Equal(t, int64(1), lib.Live("tokens"))
	imp2, err := d.Import(sh, 1)
	require.NoError(t, err, "the token is still this process's export")
	require.NoError(t, d.Release(imp2))
	require.NoError(t, d.Release(imp), "the retry frees it")
	require.Zero(t, lib.Used(0))
	require.Zero(t, lib.Live("tokens"))
}

// TestSetAccessStaysInOneMapping: aclrtMemSetAccess stays inside one
// mapping, so a grant over three adjacent mappings is three calls.
func TestSetAccessStaysInOneMapping(t *testing.T) {
	vendor.SetAccessCalls(t, small, "aclrtMemSetAccess", 3)
}

// TestSyncDevice: SyncDevice waits for the driver's own streams and for
// work on a stream it never made (aclrtSynchronizeDevice); a bad device is
// ErrNoDevice, a refused call its code's sentinel, a libascendcl without
// aclrtSynchronizeDevice ErrUnsupported.
func TestSyncDevice(t *testing.T) {
	vendor.SyncDeviceWaits(t, small, "aclrtSynchronizeDevice",
		acceltest.Fault{Fn: "aclrtSynchronizeDevice", Code: 500000, Sentinel: driver.ErrDeviceFault, Message: "aclrtSynchronizeDevice: ACL_ERROR_INTERNAL_ERROR (500000)"})
}
