package acl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
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
			base, h, s := mappedWithStream(t, d)
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

// mappedWithStream maps one granule at a fresh reservation, read-write
// for device 0, and makes a stream of device 0.
func mappedWithStream(t *testing.T, d *Driver) (driver.Addr, driver.Handle, driver.Stream) {
	t.Helper()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	return base, h, s
}

// TestSetAccessRollsBackOnACLFailure: access over three mappings (one
// aclrtMemSetAccess each: AscendCL's stays inside one mapping), the second
// refused: the first mapping is set back on the device too, as the
// stand-in's own view of the hardware shows, and the record is unchanged.
func TestSetAccessRollsBackOnACLFailure(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	at := func(i int) driver.Addr { return base + driver.Addr(uint64(i)*g) }
	for i := range 3 {
		h, err := d.Create(0, g, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(at(i), h))
	}
	before := lib.Calls("aclrtMemSetAccess")
	lib.Fail("aclrtMemSetAccess", 2, 1, 207001)
	err = d.SetAccess(base, 3*g, 0, driver.AccessReadWrite)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "aclrtMemSetAccess: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)")
	require.Equal(t, before+3, lib.Calls("aclrtMemSetAccess"), "one set, one refused, one set back")
	for i := range 3 {
		a, err := d.Access(at(i), 0)
		require.NoError(t, err)
		require.Equal(t, driver.AccessNone, a, "the record, mapping %d", i)
		require.Equal(t, 0, lib.Access(uint64(at(i)), 0), "the hardware, mapping %d", i)
	}
	lib.Clear()
	require.NoError(t, d.SetAccess(at(1), 2*g, 0, driver.AccessReadWrite))
	require.Equal(t, 3, lib.Access(uint64(at(2)), 0))
	require.Equal(t, 0, lib.Access(uint64(at(0)), 0))
	require.Equal(t, -1, lib.Access(uint64(at(3)), 0), "never mapped")
	for i := range 3 {
		require.NoError(t, d.Unmap(at(i), g))
	}
}

// TestCreateFailureChangesNothing: aclrtMallocPhysical and aclrtMapMem
// refused: nothing recorded, nothing held.
func TestCreateFailureChangesNothing(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	lib.Fail("aclrtMallocPhysical", 1, 1, 207001)
	_, err := d.Create(1, g, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)")
	require.Zero(t, d.Used(1))
	require.Zero(t, lib.Live("allocations"))

	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	lib.Fail("aclrtMapMem", 1, 1, 107000)
	drivertest.RequireIs(t, d.Map(base, h), driver.ErrInvalid, "aclrtMapMem: ACL_ERROR_RT_PARAM_INVALID (107000)")
	require.Zero(t, lib.Live("mappings"))
	require.NoError(t, d.Map(base, h), "the same map succeeds once AscendCL does")
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
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
