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

// TestCreateFailureChangesNothing: aclrtMallocPhysical and aclrtMapMem
// refused: nothing recorded, nothing held.
func TestCreateFailureChangesNothing(t *testing.T) {
	vendor.CreateAndMapFailuresChangeNothing(t, small,
		acceltest.Fault{Fn: "aclrtMallocPhysical", Code: 207001, Sentinel: driver.ErrOutOfMemory, Message: "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)"},
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
