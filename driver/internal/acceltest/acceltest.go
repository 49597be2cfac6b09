// Package acceltest holds the tests the accelerator drivers (driver/cuda,
// driver/acl) share, written once for any of them: the conformance suite
// over a fresh stand-in of the vendor library torn down and checked for
// leaks, again over stand-ins that each lack one group of symbols, a full
// open-use-close that must leave the process as it found it, and the
// tests that run on a machine's own GPUs or NPUs. Each vendor package
// describes itself with a Vendor and calls these from its _test files.
package acceltest

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// Driver is what the shared tests need of an accelerator driver.
type Driver interface {
	driver.Driver
	driver.Streams
	driver.Sharing
	Check() error
}

// Vendor is one accelerator driver as the shared tests see it.
type Vendor[D Driver] struct {
	// Standin is the vendor's stand-in front-end.
	Standin standin.Vendor
	// Open opens the driver over the library at path ("" for the
	// machine's own), each device capped at capacity bytes (0: no cap).
	Open func(path string, capacity uint64) (D, error)
	// TearDown closes the driver whatever is still mapped.
	TearDown func(D) error
	// Probe is the largest minimum granularity of the machine's own
	// devices, or why there is no usable device.
	Probe func() (uint64, error)
	// Device is what the vendor's devices are called ("GPU", "NPU").
	Device string
}

// OpenStandin opens the driver with open over a fresh stand-in configured
// with cfg. When the test ends the driver is torn down whatever is left,
// and the stand-in must then hold nothing: every reservation, allocation,
// mapping, stream, event, pinned buffer, context and token the driver made
// was given back to the "vendor".
func (v Vendor[D]) OpenStandin(t *testing.T, cfg standin.Config, open func(path string) (D, error)) (D, *standin.Lib) {
	t.Helper()
	lib := standin.Open(t, v.Standin, cfg)
	d, err := open(lib.Path())
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := v.TearDown(d); err != nil {
			t.Errorf("tear down the %s driver: %v", v.Standin, err)
		}
		for _, what := range standin.LiveKinds {
			if n := lib.Live(what); n != 0 {
				t.Errorf("after tear down the %s stand-in still holds %d %s", v.Standin, n, what)
			}
		}
	})
	return d, lib
}

// Conformance runs the whole conformance suite over fresh stand-ins
// configured with cfg, opened with open.
func (v Vendor[D]) Conformance(t *testing.T, cfg standin.Config, open func(path string) (D, error)) {
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		d, _ := v.OpenStandin(t, cfg, open)
		return d
	})
}

// ConformanceWithoutGroups runs the suite over stand-ins that each lack
// one group of symbols (all but virtual memory management, without which
// there is no driver): a missing group makes its feature unsupported, and
// every rule of the contract still holds for the rest.
func (v Vendor[D]) ConformanceWithoutGroups(t *testing.T, cfg standin.Config) {
	if testing.Short() {
		t.Skip("the vendor's TestMissingSymbols covers each group's own feature")
	}
	for _, group := range standin.OmitGroups {
		if group == "vmm" {
			continue
		}
		t.Run(group, func(t *testing.T) {
			cfg := cfg
			cfg.Omit = []string{group}
			v.Conformance(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
		})
	}
}

// CloseLeavesNothing: a driver opened, used for everything it does (chunks
// mapped and granted, bytes moved both ways, a stream's copies, a pinned
// buffer, a chunk exported and imported back) and closed leaves the
// process as it found it — descriptors and kernel mappings — and the
// library holding nothing. The stand-in is loaded once, before: its own
// code and mappings are the library's, not the driver's.
func (v Vendor[D]) CloseLeavesNothing(t *testing.T, cfg standin.Config) {
	lib := standin.Open(t, v.Standin, cfg)
	g := cfg.MinGranularity
	work := func() {
		d, err := v.Open(lib.Path(), 0)
		require.NoError(t, err)
		base, err := d.Reserve(4*d.Granularity(), 0, 0)
		require.NoError(t, err)
		h, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
		require.NoError(t, err)
		require.NoError(t, d.Map(base, h))
		require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
		require.NoError(t, d.Write(base, []byte("leak?")))
		s, err := d.CreateStream(0)
		require.NoError(t, err)
		buf, err := d.HostAlloc(4096)
		require.NoError(t, err)
		require.NoError(t, d.CopyDtoH(buf[:64], base, s))
		require.NoError(t, d.SyncStream(s))
		require.Equal(t, "leak?", string(buf[:5]))
		x, err := d.Export(h)
		require.NoError(t, err)
		imp, err := d.Import(x, 1)
		require.NoError(t, err)
		closeHandle(t, x)
		// The import maps in a reservation of its own: AscendCL binds
		// a reservation to local or imported memory, never both.
		alias, err := d.Reserve(d.Granularity(), 0, 0)
		require.NoError(t, err)
		require.NoError(t, d.Map(alias, imp))
		require.NoError(t, d.Unmap(alias, g))
		require.NoError(t, d.Release(imp))
		require.NoError(t, d.HostFree(buf))
		require.NoError(t, d.DestroyStream(s))
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Close(), "the reservation goes with Close")
		require.Empty(t, lib.Leaks())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "%v before, %v after", before, after)
}

// closeHandle closes what the test holds of an exported handle: its
// descriptor, where it is one (a token is only a number).
func closeHandle(t *testing.T, x driver.Shareable) {
	t.Helper()
	if x.Type == driver.HandlePOSIXFD {
		require.NoError(t, os.NewFile(uintptr(x.FD), "exported chunk").Close())
	}
}

// OpenHardware opens the machine's own driver, each device capped at
// chunks of the devices' granularity so the suite's fill-to-capacity tests
// stay small, or skips the test saying why there is none.
func (v Vendor[D]) OpenHardware(t *testing.T, chunks uint64) D {
	t.Helper()
	gran, err := v.Probe()
	if err != nil {
		t.Skipf("no usable %s on this machine: %v", v.Device, err)
	}
	d, err := v.Open("", chunks*gran)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := v.TearDown(d); err != nil {
			t.Errorf("tear down the %s driver: %v", v.Standin, err)
		}
	})
	return d
}

// HardwareConformance runs the conformance suite on the machine's own
// devices, each capped at 64 granules. It skips where there are none; on
// a machine with one device, the checks that need a second one skip,
// each saying so.
func (v Vendor[D]) HardwareConformance(t *testing.T) {
	v.OpenHardware(t, 64)
	drivertest.Run(t, func(t *testing.T) driver.Driver { return v.OpenHardware(t, 64) })
}

// HardwareSmoke is the round trip on each of the machine's devices:
// reserve, create, map, grant, write and read back through the
// synchronous and the stream copies, fill, export and import the chunk
// again (a second chunk over the same memory), and give everything back.
func (v Vendor[D]) HardwareSmoke(t *testing.T) {
	d := v.OpenHardware(t, 8)
	for _, dev := range d.Devices() {
		g := dev.MinGranularity
		base, err := d.Reserve(2*d.Granularity(), 0, 0)
		require.NoError(t, err)
		h, err := d.Create(dev.ID, g, driver.ChunkOptions{Shareable: d.Supports(driver.FeatureShareable)})
		require.NoError(t, err)
		require.NoError(t, d.Map(base, h))
		require.NoError(t, d.SetAccess(base, g, dev.ID, driver.AccessReadWrite))
		msg := []byte("vmarena on " + dev.Name)
		require.NoError(t, d.Write(base, msg))
		got := make([]byte, len(msg))
		require.NoError(t, d.Read(base, got))
		require.Equal(t, msg, got)

		s, err := d.CreateStream(dev.ID)
		require.NoError(t, err)
		buf, err := d.HostAlloc(4096)
		require.NoError(t, err)
		require.NoError(t, d.Memset(base, 0x5a, 4096, s))
		require.NoError(t, d.CopyDtoH(buf, base, s))
		require.NoError(t, d.SyncStream(s))
		require.Equal(t, bytes.Repeat([]byte{0x5a}, 4096), buf)
		require.NoError(t, d.HostFree(buf))
		require.NoError(t, d.DestroyStream(s))

		if d.Supports(driver.FeatureShareable) {
			x, err := d.Export(h)
			require.NoError(t, err)
			imp, err := d.Import(x, dev.ID)
			require.NoError(t, err, "import of this process's own export")
			closeHandle(t, x)
			alias := base + driver.Addr(d.Granularity())
			require.NoError(t, d.Map(alias, imp))
			require.NoError(t, d.SetAccess(alias, g, dev.ID, driver.AccessRead))
			require.NoError(t, d.Read(alias, got[:1]))
			require.Equal(t, byte(0x5a), got[0], "one memory, two mappings")
			require.NoError(t, d.Unmap(alias, g))
			require.NoError(t, d.Release(imp))
		}
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(base, 2*d.Granularity()))
	}
}

// CloseRacingMap is drivertest.CloseRacingMap on the vendor's driver
// over the stand-in.
func (v Vendor[D]) CloseRacingMap(t *testing.T, cfg standin.Config) {
	d, _ := v.OpenStandin(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
	drivertest.CloseRacingMap(t, d)
}
