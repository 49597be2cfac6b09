package acl

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// TestMapGrantsNothing: aclrtMapMem's mapping is accessible to its NPU at
// once, against the contract; the driver maps with aclrtMemMapNoAccess,
// or, where the library lacks it, takes the access back at once — and if
// that is refused, the map is undone and nothing changes.
func TestMapGrantsNothing(t *testing.T) {
	old := small
	old.Omit = []string{"mapnoaccess"}
	for name, cfg := range map[string]standin.Config{"aclrtMemMapNoAccess": small, "aclrtMapMem": old} {
		t.Run(name, func(t *testing.T) {
			d, lib := openStandin(t, cfg, Options{})
			base, err := d.Reserve(2*g, 0, 0)
			require.NoError(t, err)
			for dev := range driver.DeviceID(2) {
				h, err := d.Create(dev, g, driver.ChunkOptions{})
				require.NoError(t, err)
				at := base + driver.Addr(uint64(dev)*g)
				if dev == 1 {
					at, err = d.Reserve(g, 0, 0) // a reservation binds one NPU
					require.NoError(t, err)
				}
				require.NoError(t, d.Map(at, h))
				for other := range 2 {
					require.Equal(t, int(driver.AccessNone), lib.Access(uint64(at), other), "NPU %d's access to NPU %d's new mapping", other, dev)
				}
			}
			require.Equal(t, uint64(0), lib.Calls("aclrtMemMapNoAccess")+lib.Calls("aclrtMapMem")-2, "one map each")
		})
	}
	t.Run("revoke refused", func(t *testing.T) {
		d, lib := openStandin(t, old, Options{})
		base, err := d.Reserve(g, 0, 0)
		require.NoError(t, err)
		h, err := d.Create(0, g, driver.ChunkOptions{})
		require.NoError(t, err)
		lib.Fail("aclrtMemSetAccess", 1, 1, 507899)
		drivertest.RequireIs(t, d.Map(base, h), driver.ErrDeviceFault, "aclrtMemSetAccess: ACL_ERROR_RT_DRV_INTERNAL_ERROR (507899)")
		require.Zero(t, lib.Live("mappings"), "the map was undone")
		_, err = d.Access(base, 0)
		drivertest.RequireIs(t, err, driver.ErrNotMapped)
		require.NoError(t, d.Check())
		require.NoError(t, d.Map(base, h), "the retry maps")
		require.Equal(t, int(driver.AccessNone), lib.Access(uint64(base), 0))
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
	})
}

// TestSetAccessWholeMappings: aclrtMemSetAccess takes exactly one whole
// mapping. A grant over part of a mapping is recorded per granule — and
// the driver's own copies obey it — while the NPU's hardware access over
// the mapping is the widest it has anywhere in it; taking the grant back
// takes the hardware's back.
func TestSetAccessWholeMappings(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, 4*g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	at := func(i int) driver.Addr { return base + driver.Addr(uint64(i)*g) }
	hw := func(i int, dev int) driver.Access { return driver.Access(lib.Access(uint64(at(i)), dev)) }

	calls := lib.Calls("aclrtMemSetAccess")
	require.NoError(t, d.SetAccess(at(1), g, 0, driver.AccessReadWrite), "the second granule")
	require.Equal(t, calls+1, lib.Calls("aclrtMemSetAccess"), "one call, over the whole mapping")
	for i := range 4 {
		require.Equal(t, driver.AccessReadWrite, hw(i, 0), "the hardware of granule %d: the widest", i)
		require.Equal(t, driver.AccessNone, hw(i, 1))
	}
	a, err := d.Access(at(0), 0)
	require.NoError(t, err)
	require.Equal(t, driver.AccessNone, a, "the record keeps the granule")
	drivertest.RequireIs(t, d.Write(at(0), []byte("x")), driver.ErrAccessDenied)
	require.NoError(t, d.Write(at(1), []byte("x")))

	calls = lib.Calls("aclrtMemSetAccess")
	require.NoError(t, d.SetAccess(at(2), g, 0, driver.AccessRead), "a narrower grant beside")
	require.Equal(t, calls, lib.Calls("aclrtMemSetAccess"), "the widest did not change: no call")
	require.NoError(t, d.SetAccess(at(1), g, 0, driver.AccessNone))
	require.Equal(t, driver.AccessRead, hw(0, 0), "the widest is now read")
	require.NoError(t, d.SetAccess(at(2), g, 0, driver.AccessNone))
	require.Equal(t, driver.AccessNone, hw(3, 0), "nothing granted, nothing in the hardware")
	require.NoError(t, d.Check())
	require.NoError(t, d.Unmap(base, 4*g))
	require.NoError(t, d.Release(h))
}

// TestHostPID: the ID AscendCL's allow-lists know this process by is
// aclrtDeviceGetBareTgid's (the stand-in runs in no container: getpid);
// a library without the sharing calls says it has none, and a closed
// driver is ErrClosed.
func TestHostPID(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	calls := lib.Calls("aclrtDeviceGetBareTgid")
	pid, err := d.HostPID()
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), pid)
	require.Equal(t, calls+1, lib.Calls("aclrtDeviceGetBareTgid"))
	lib.Fail("aclrtDeviceGetBareTgid", 1, 1, 107000)
	_, err = d.HostPID()
	drivertest.RequireIs(t, err, driver.ErrInvalid, "aclrtDeviceGetBareTgid: ACL_ERROR_RT_PARAM_INVALID (107000)")

	noShare := small
	noShare.Omit = []string{"export"}
	d2, _ := openStandin(t, noShare, Options{})
	_, err = d2.HostPID()
	drivertest.RequireIs(t, err, driver.ErrUnsupported)

	d3, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	require.NoError(t, d3.Close())
	_, err = d3.HostPID()
	drivertest.RequireIs(t, err, driver.ErrClosed)
}
