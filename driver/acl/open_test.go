package acl

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/units"
)

// TestNoRuntime: each way a machine can lack AscendCL is a clear error
// and no crash.
func TestNoRuntime(t *testing.T) {
	t.Run("no library", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "libascendcl.so")
		_, err := Open(Options{Library: missing})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "no Ascend runtime found", missing)
		require.Contains(t, errors.FlattenHints(err), "set_env.sh")
		_, err = Probe(missing)
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "no Ascend runtime found")
	})
	t.Run("not AscendCL", func(t *testing.T) {
		_, err := Open(Options{Library: "libc.so.6"})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "is not the AscendCL runtime", "aclInit")
		_, err = Probe("libc.so.6")
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "is not the AscendCL runtime")
	})
	t.Run("no NPU", func(t *testing.T) {
		lib := standin.Open(t, standin.ACL, standin.Config{NoDevice: true})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrNoDevice, "the runtime sees no NPU")
		rep, err := Probe(lib.Path())
		require.NoError(t, err, "a runtime without NPUs probes")
		require.Empty(t, rep.Devices)
	})
	t.Run("device without VMM", func(t *testing.T) {
		lib := standin.Open(t, standin.ACL, standin.Config{NoVMM: true})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "has no virtual memory management",
			"aclrtMemGetAllocationGranularity: ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000)")
		require.Zero(t, lib.Live("contexts"), "a refused open lets every device go")
		rep, err := Probe(lib.Path())
		require.NoError(t, err, "probe reports such a device")
		require.Len(t, rep.Devices, 2)
		require.Zero(t, rep.Devices[0].MinGranularity)
		require.Equal(t, 64*units.MiB, rep.Devices[0].Memory)
	})
	t.Run("library without VMM", func(t *testing.T) {
		lib := standin.Open(t, standin.ACL, standin.Config{Omit: []string{"vmm"}})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "has no virtual memory management", "aclrtMallocPhysical")
		rep, err := Probe(lib.Path())
		require.NoError(t, err)
		require.Len(t, rep.Devices, 2)
		require.NotEmpty(t, rep.Missing)
	})
	t.Run("bad devices", func(t *testing.T) {
		lib := standin.Open(t, standin.ACL, small)
		for _, devs := range [][]int{{2}, {-1}, {0, 0}} {
			_, err := Open(Options{Library: lib.Path(), Devices: devs})
			drivertest.RequireIs(t, err, driver.ErrNoDevice)
		}
		require.Zero(t, lib.Live("contexts"), "refused opens let every device go")
	})
}

// TestProbe reports what the stand-in's NPUs are, holding nothing after.
func TestProbe(t *testing.T) {
	lib := standin.Open(t, standin.ACL, small)
	rep, err := Probe(lib.Path())
	require.NoError(t, err)
	require.Equal(t, lib.Path(), rep.Library)
	require.Len(t, rep.Devices, 2)
	require.Empty(t, rep.Missing)
	for i, d := range rep.Devices {
		require.Equal(t, i, d.ID)
		require.Equal(t, fmt.Sprintf("Ascend910B-vmstandin #%d", i), d.Name)
		require.Equal(t, 4*units.MiB, d.Memory)
		require.Equal(t, 4*units.MiB, d.Free)
		require.Equal(t, 64*units.KiB, d.MinGranularity)
		require.Equal(t, 2*units.MiB, d.RecommendedGranularity)
	}
	require.Zero(t, lib.Live("contexts"), "probe keeps no device set and no context")
}

// TestOptions: devices chosen and capped, the wait mode, and Close letting
// every context and device go.
func TestOptions(t *testing.T) {
	lib := standin.Open(t, standin.ACL, small)
	d, err := Open(Options{Library: lib.Path(), Devices: []int{1}, Capacity: 1*units.MiB + 1})
	require.NoError(t, err)
	devs := d.Devices()
	require.Len(t, devs, 1)
	require.Equal(t, units.MiB, devs[0].Capacity, "capped and rounded down to the granularity")
	require.Equal(t, driver.KindAscend, devs[0].Kind)
	require.Equal(t, uint64(64), devs[0].CopyAlign)
	require.Equal(t, "Ascend910B-vmstandin #1", devs[0].Name)
	require.Equal(t, WaitEvent, d.Wait(), "auto picks events when the library has them")
	require.Equal(t, int64(2), lib.Live("contexts"), "device 1 set, and a context made on it")
	h, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, 64*units.KiB, lib.Used(1), "driver device 0 is NPU 1")
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Close())
	require.Zero(t, lib.Live("contexts"), "Close destroys the context and resets the device")

	_, err = Open(Options{Library: lib.Path(), Wait: WaitMode(9)})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "wait mode 9")
	require.Zero(t, lib.Live("contexts"))
}

// TestMissingSymbols: a library without one group of symbols loses that
// feature only; Supports says so and its calls are ErrUnsupported.
func TestMissingSymbols(t *testing.T) {
	open := func(t *testing.T, omit ...string) (*Driver, *standin.Lib) {
		cfg := small
		cfg.Omit = omit
		return openStandin(t, cfg, Options{})
	}
	t.Run("export", func(t *testing.T) {
		d, _ := open(t, "export")
		require.False(t, d.Supports(driver.FeatureShareable))
		require.True(t, d.Supports(driver.FeatureStreams) && d.Supports(driver.FeatureHostAccess))
		_, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{Shareable: true})
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		h, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
		require.NoError(t, err, "the rest of the driver works")
		_, err = d.Export(h)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		drivertest.RequireIs(t, d.AllowPIDs(h, []int{1}), driver.ErrUnsupported)
		require.NoError(t, d.Release(h))
	})
	t.Run("streams", func(t *testing.T) {
		d, _ := open(t, "streams")
		require.False(t, d.Supports(driver.FeatureStreams))
		_, err := d.CreateStream(0)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		require.True(t, d.Supports(driver.FeatureHostAccess) && d.Supports(driver.FeatureShareable))
	})
	t.Run("hostalloc", func(t *testing.T) {
		d, _ := open(t, "hostalloc")
		require.False(t, d.Supports(driver.FeatureStreams), "the driver's streams copy through pinned host memory")
		_, err := d.HostAlloc(4096)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		require.True(t, d.Supports(driver.FeatureHostAccess))
	})
	t.Run("synccopy", func(t *testing.T) {
		d, _ := open(t, "synccopy")
		require.False(t, d.Supports(driver.FeatureHostAccess))
		drivertest.RequireIs(t, d.Read(0, make([]byte, 1)), driver.ErrUnsupported)
		drivertest.RequireIs(t, d.Write(0, make([]byte, 1)), driver.ErrUnsupported)
		require.True(t, d.Supports(driver.FeatureStreams))
	})
	t.Run("events", func(t *testing.T) {
		d, _ := open(t, "events")
		require.Equal(t, WaitSync, d.Wait())
		require.True(t, d.Supports(driver.FeatureStreams))
		cfg := small
		cfg.Omit = []string{"events"}
		lib := standin.Open(t, standin.ACL, cfg)
		_, err := Open(Options{Library: lib.Path(), Wait: WaitEvent})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "aclrtCreateEvent")
	})
	t.Run("peer", func(t *testing.T) {
		d, _ := open(t, "peer")
		ok, err := d.CanAccessPeer(0, 1)
		require.NoError(t, err)
		require.False(t, ok)
		drivertest.RequireIs(t, d.EnablePeerAccess(0, 1), driver.ErrUnsupported)
	})
	t.Run("hostfunc", func(t *testing.T) {
		d, _ := open(t, "hostfunc")
		require.True(t, d.Supports(driver.FeatureStreams), "AscendCL has no symbol in that group")
	})
}

// TestResultsThroughTheDriver sends every code of the table through a real
// call: the stand-in's aclrtMallocPhysical answers it, and Create reports
// it marked with the code's sentinel and named as the CANN headers name
// it, having changed nothing.
func TestResultsThroughTheDriver(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	for code, res := range results {
		if code == 0 {
			continue
		}
		lib.Fail("aclrtMallocPhysical", 1, 1, int(code))
		_, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
		drivertest.RequireIs(t, err, res.Sentinel, fmt.Sprintf("aclrtMallocPhysical: %s (%d)", res.Name, code))
		require.Contains(t, errors.FlattenDetails(err), "injected failure", "the runtime's own message is kept")
		require.Zero(t, d.Used(0))
		require.Zero(t, lib.Used(0))
		require.Zero(t, lib.Live("allocations"))
	}
}

// TestOpenFailureLetsGo: AscendCL refusing part-way through Open (the
// second device's aclrtSetDevice, or its aclrtCreateContext) leaves no
// device set and no context behind.
func TestOpenFailureLetsGo(t *testing.T) {
	for _, c := range []struct {
		fn   string
		nth  int
		code int
		want error
	}{
		{"aclrtSetDevice", 4, 107001, driver.ErrNoDevice}, // two probes, then device 0, then device 1
		{"aclrtCreateContext", 4, 207001, driver.ErrOutOfMemory},
		{"aclrtGetMemInfo", 2, 500000, driver.ErrDeviceFault},
		{"aclrtDeviceCanAccessPeer", 1, 107000, driver.ErrInvalid},
	} {
		t.Run(c.fn, func(t *testing.T) {
			lib := standin.Open(t, standin.ACL, small)
			lib.Fail(c.fn, c.nth, 1, c.code)
			_, err := Open(Options{Library: lib.Path()})
			drivertest.RequireIs(t, err, c.want, c.fn)
			for _, what := range standin.LiveKinds {
				require.Zero(t, lib.Live(what), "%s left after a refused open", what)
			}
			lib.Clear()
			d, err := Open(Options{Library: lib.Path()})
			require.NoError(t, err, "the same open succeeds once AscendCL does")
			require.NoError(t, d.Close())
			require.Zero(t, lib.Live("contexts"))
		})
	}
}
