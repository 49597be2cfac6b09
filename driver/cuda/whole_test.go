package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// wholeMappingAccess checks, on device 0 alone, what an H100 (CUDA 13.0)
// showed: cuMemSetAccess takes a run of adjacent whole mappings but never
// a piece of one, so a SetAccess over part of a mapping is kept per
// granule in the record (and enforced on the driver's own copies) while
// the hardware gets the device's widest access in the whole mapping.
// calls counts cuMemSetAccess calls where it can (the stand-in); nil on
// hardware.
func wholeMappingAccess(t *testing.T, d *Driver, calls func() uint64) {
	g := d.Devices()[0].MinGranularity
	base, err := d.Reserve(3*g, 0, 0)
	require.NoError(t, err)
	at := func(i uint64) driver.Addr { return base + driver.Addr(i*g) }
	a, err := d.Create(0, 2*g, driver.ChunkOptions{})
	require.NoError(t, err)
	b, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(at(0), a))
	require.NoError(t, d.Map(at(2), b))
	counted := func(want uint64, fn func() error, why string) {
		t.Helper()
		var before uint64
		if calls != nil {
			before = calls()
		}
		require.NoError(t, fn(), why)
		if calls != nil {
			require.Equal(t, want, calls()-before, "cuMemSetAccess calls: %s", why)
		}
	}
	access := func(i uint64) driver.Access {
		t.Helper()
		got, err := d.Access(at(i), 0)
		require.NoError(t, err)
		return got
	}

	counted(1, func() error { return d.SetAccess(at(0), 3*g, 0, driver.AccessRead) }, "two adjacent whole mappings, one call")
	counted(1, func() error { return d.SetAccess(at(1), g, 0, driver.AccessReadWrite) }, "the second half of the first mapping")
	require.Equal(t, []driver.Access{driver.AccessRead, driver.AccessReadWrite, driver.AccessRead},
		[]driver.Access{access(0), access(1), access(2)}, "the record keeps each granule's")
	if d.Supports(driver.FeatureHostAccess) {
		msg := []byte("whole mappings")
		require.NoError(t, d.Write(at(1), msg))
		got := make([]byte, len(msg))
		require.NoError(t, d.Read(at(1), got))
		require.Equal(t, msg, got)
		drivertest.RequireIs(t, d.Write(at(0), msg), driver.ErrAccessDenied) // read-only in the record
	}
	counted(0, func() error { return d.SetAccess(at(0), g, 0, driver.AccessNone) }, "the first mapping keeps read-write in its second granule")
	require.Equal(t, driver.AccessNone, access(0))
	counted(2, func() error { return d.SetAccess(at(0), 3*g, 0, driver.AccessNone) }, "the two mappings change differently")

	require.NoError(t, d.Unmap(at(0), 2*g))
	require.NoError(t, d.Unmap(at(2), g))
	require.NoError(t, d.Release(a))
	require.NoError(t, d.Release(b))
	require.NoError(t, d.Unreserve(base, 3*g))
}

// TestWholeMappingAccess: wholeMappingAccess on the stand-in, whose
// cuMemSetAccess refuses a piece of a mapping as an H100 does.
func TestWholeMappingAccess(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	wholeMappingAccess(t, d, func() uint64 { return lib.Calls("cuMemSetAccess") })
}

// TestHardwareWholeMappingAccess: wholeMappingAccess on the machine's own
// first GPU (the conformance checks of part-of-a-mapping access need a
// second device); it skips where there is none.
func TestHardwareWholeMappingAccess(t *testing.T) {
	wholeMappingAccess(t, vendor.OpenHardware(t, 8), nil)
}
