package acl

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// openHardware opens the machine's own AscendCL runtime (Options.Library
// empty: $VMARENA_ACL_LIBRARY, else libascendcl.so), each NPU capped at
// chunks of its granularity so the suite's fill-to-capacity tests stay
// small, or skips the test saying why there is none.
func openHardware(t *testing.T, chunks uint64) *Driver {
	t.Helper()
	rep, err := Probe("")
	if err != nil {
		t.Skipf("no AscendCL runtime on this machine: %v", err)
	}
	var gran uint64
	for _, d := range rep.Devices {
		gran = max(gran, d.MinGranularity)
	}
	if gran == 0 {
		t.Skipf("AscendCL runtime %s has no NPU with virtual memory management", rep.Library)
	}
	d, err := Open(Options{Capacity: chunks * gran})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := d.tearDown(); err != nil {
			t.Errorf("tear down the AscendCL driver: %v", err)
		}
	})
	return d
}

// TestHardwareConformance runs the conformance suite on the machine's
// NPUs: `go test ./driver/acl -run Hardware -v`. It skips where there is
// no AscendCL runtime, and where there is one NPU (the suite needs two
// devices; TestHardwareSmoke covers one).
func TestHardwareConformance(t *testing.T) {
	probe := openHardware(t, 64)
	if n := len(probe.Devices()); n < 2 {
		t.Skipf("the conformance suite needs 2 NPUs, this machine has %d: TestHardwareSmoke runs on one", n)
	}
	drivertest.Run(t, func(t *testing.T) driver.Driver { return openHardware(t, 64) })
}

// TestHardwareSmoke is the round trip on each NPU of the machine: reserve,
// create, map, grant, write and read back through the synchronous and the
// stream copies, fill, export the chunk as a token and import it again (a
// chunk over the same handle, as AscendCL refuses a process its own
// token), and give everything back.
func TestHardwareSmoke(t *testing.T) {
	d := openHardware(t, 8)
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
			require.NoError(t, err, "import of this process's own token")
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
