package cuda

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

// TestNoRuntime: each way a machine can lack CUDA is a clear error and no
// crash.
func TestNoRuntime(t *testing.T) {
	t.Run("no library", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "libcuda.so.1")
		_, err := Open(Options{Library: missing})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "no NVIDIA driver found", missing)
		_, err = Probe(missing)
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "no NVIDIA driver found")
	})
	t.Run("not libcuda", func(t *testing.T) {
		_, err := Open(Options{Library: "libc.so.6"})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "is not the CUDA driver", "cuInit")
	})
	t.Run("link stub", func(t *testing.T) {
		lib := standin.Open(t, standin.CUDA, standin.Config{Stub: true})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "cuInit: CUDA_ERROR_STUB_LIBRARY (34)")
		require.Contains(t, errors.FlattenHints(err), "link stub")
		_, err = Probe(lib.Path())
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "CUDA_ERROR_STUB_LIBRARY (34)")
	})
	t.Run("no GPU", func(t *testing.T) {
		lib := standin.Open(t, standin.CUDA, standin.Config{NoDevice: true})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrNoDevice, "cuInit: CUDA_ERROR_NO_DEVICE (100)")
	})
	t.Run("device without VMM", func(t *testing.T) {
		lib := standin.Open(t, standin.CUDA, standin.Config{NoVMM: true})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "does not support virtual memory management")
		rep, err := Probe(lib.Path())
		require.NoError(t, err, "probe reports such a device")
		require.Len(t, rep.Devices, 2)
		require.False(t, rep.Devices[0].VMM)
	})
	t.Run("library without VMM", func(t *testing.T) {
		lib := standin.Open(t, standin.CUDA, standin.Config{Omit: []string{"vmm"}})
		_, err := Open(Options{Library: lib.Path()})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "has no virtual memory management", "cuMemCreate")
	})
	t.Run("bad devices", func(t *testing.T) {
		lib := standin.Open(t, standin.CUDA, small)
		for _, devs := range [][]int{{2}, {-1}, {0, 0}} {
			_, err := Open(Options{Library: lib.Path(), Devices: devs})
			drivertest.RequireIs(t, err, driver.ErrNoDevice)
		}
	})
}

// TestProbe reports what the stand-in's devices are.
func TestProbe(t *testing.T) {
	lib := standin.Open(t, standin.CUDA, small)
	rep, err := Probe(lib.Path())
	require.NoError(t, err)
	require.Len(t, rep.Devices, 2)
	require.Empty(t, rep.Missing)
	require.NotZero(t, rep.Version)
	for i, d := range rep.Devices {
		require.Equal(t, i, d.Ordinal)
		require.True(t, d.VMM && d.POSIXFD && d.Pools)
		require.Equal(t, 4*units.MiB, d.Memory)
		require.Equal(t, 64*units.KiB, d.MinGranularity)
		require.Equal(t, 2*units.MiB, d.RecommendedGranularity)
		require.NotEmpty(t, d.Name)
	}
}

// TestOptions: devices chosen and capped, and the wait mode.
func TestOptions(t *testing.T) {
	d, _ := openStandin(t, small, Options{Devices: []int{1}, Capacity: 1*units.MiB + 1})
	devs := d.Devices()
	require.Len(t, devs, 1)
	require.Equal(t, units.MiB, devs[0].Capacity, "capped and rounded down to the granularity")
	require.Equal(t, driver.KindCUDA, devs[0].Kind)
	require.Equal(t, WaitHostFunc, d.Wait(), "auto picks host functions when the library has them")
	h, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Release(h))
}

// TestMissingSymbols: a library without one group of symbols loses that
// feature only; Supports says so and its calls are ErrUnsupported.
func TestMissingSymbols(t *testing.T) {
	open := func(t *testing.T, omit ...string) *Driver {
		cfg := small
		cfg.Omit = omit
		d, _ := openStandin(t, cfg, Options{})
		return d
	}
	t.Run("export", func(t *testing.T) {
		d := open(t, "export")
		require.False(t, d.Supports(driver.FeatureShareable))
		_, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{Shareable: true})
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		h, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
		require.NoError(t, err, "the rest of the driver works")
		_, err = d.Export(h)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
	})
	t.Run("streams", func(t *testing.T) {
		d := open(t, "streams")
		require.False(t, d.Supports(driver.FeatureStreams))
		_, err := d.CreateStream(0)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		_, err = d.HostAlloc(4096)
		drivertest.RequireIs(t, err, driver.ErrUnsupported)
		require.True(t, d.Supports(driver.FeatureHostAccess))
	})
	t.Run("synccopy", func(t *testing.T) {
		d := open(t, "synccopy")
		require.False(t, d.Supports(driver.FeatureHostAccess))
		drivertest.RequireIs(t, d.Read(0, make([]byte, 1)), driver.ErrUnsupported)
	})
	t.Run("hostfunc", func(t *testing.T) {
		require.Equal(t, WaitEvent, open(t, "hostfunc").Wait())
	})
	t.Run("hostfunc and events", func(t *testing.T) {
		require.Equal(t, WaitSync, open(t, "hostfunc", "events").Wait())
		cfg := small
		cfg.Omit = []string{"hostfunc"}
		lib := standin.Open(t, standin.CUDA, cfg)
		_, err := Open(Options{Library: lib.Path(), Wait: WaitHostFunc})
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "cuLaunchHostFunc")
	})
	t.Run("peer", func(t *testing.T) {
		d := open(t, "peer")
		ok, err := d.CanAccessPeer(0, 1)
		require.NoError(t, err)
		require.False(t, ok)
		drivertest.RequireIs(t, d.EnablePeerAccess(0, 1), driver.ErrUnsupported)
	})
}

// TestResultsThroughTheDriver sends every code of the table through a real
// call: the stand-in's cuMemCreate answers it, and Create reports it
// marked with the code's sentinel and named as cuda.h names it, having
// changed nothing.
func TestResultsThroughTheDriver(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	for code, res := range results {
		if code == 0 {
			continue
		}
		lib.Fail("cuMemCreate", 1, 1, int(code))
		_, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
		drivertest.RequireIs(t, err, res.Sentinel, fmt.Sprintf("cuMemCreate: %s (%d)", res.Name, code))
		require.Zero(t, d.Used(0))
		require.Zero(t, lib.Used(0))
	}
}

// TestUnknownResultThroughTheDriver: a code the table lacks, as a newer
// driver might return, is a device fault named as the driver's own
// cuGetErrorName names it — or by its number, when it has no name either.
func TestUnknownResultThroughTheDriver(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	lib.Fail("cuMemCreate", 1, 1, 1234)
	_, err := d.Create(0, 64*units.KiB, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, driver.ErrDeviceFault, "cuMemCreate: CUresult 1234")
	require.NotZero(t, lib.Calls("cuGetErrorName"), "the driver was asked for the code's name")
}
