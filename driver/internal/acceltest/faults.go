package acceltest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// Fault is one vendor call made to fail with a code of the vendor's, and
// what the driver must then report: the sentinel, and a fragment of the
// message naming the call and the code.
type Fault struct {
	Fn       string
	Code     int
	Sentinel error
	Message  string
}

// MappedWithStream maps one granule of g bytes at a fresh reservation,
// read-write for device 0, and makes a stream of device 0.
func MappedWithStream[D Driver](t *testing.T, d D, g uint64) (driver.Addr, driver.Handle, driver.Stream) {
	t.Helper()
	base, err := d.Reserve(d.Granularity(), 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	return base, h, s
}

// SetAccessRollsBack: access over three mappings whose access differs —
// the middle one readable already — so one vendor call each (a vendor call
// spans adjacent mappings only where their access changes alike), the
// second call refused with f: the first mapping is set back on the
// hardware too, as the stand-in's own view shows, and the record is
// unchanged; a later grant over the other two reaches the hardware.
func (v Vendor[D]) SetAccessRollsBack(t *testing.T, cfg standin.Config, f Fault) {
	d, lib, g, at := v.threeMapped(t, cfg)
	require.NoError(t, d.SetAccess(at(1), g, 0, driver.AccessRead))
	before := lib.Calls(f.Fn)
	lib.Fail(f.Fn, 2, 1, f.Code)
	err := d.SetAccess(at(0), 3*g, 0, driver.AccessReadWrite)
	drivertest.RequireIs(t, err, f.Sentinel, f.Message)
	require.Equal(t, before+3, lib.Calls(f.Fn), "one set, one refused, one set back")
	for i, want := range []driver.Access{driver.AccessNone, driver.AccessRead, driver.AccessNone} {
		a, err := d.Access(at(i), 0)
		require.NoError(t, err)
		require.Equal(t, want, a, "the record, mapping %d", i)
		require.Equal(t, int(want), lib.Access(uint64(at(i)), 0), "the hardware, mapping %d", i)
	}
	lib.Clear()
	require.NoError(t, d.SetAccess(at(1), 2*g, 0, driver.AccessReadWrite))
	require.Equal(t, 3, lib.Access(uint64(at(2)), 0))
	require.Equal(t, 0, lib.Access(uint64(at(0)), 0))
	require.Equal(t, -1, lib.Access(uint64(at(3)), 0), "never mapped")
	drivertest.RequireIs(t, d.Write(at(0), []byte("x")), driver.ErrAccessDenied)
	require.NoError(t, d.Write(at(1), []byte("x")))
	for i := range 3 {
		require.NoError(t, d.Unmap(at(i), g))
	}
}

// CreateAndMapFailuresChangeNothing: a chunk's creation refused with
// create, then its map refused with mapping: nothing recorded, nothing
// held by the vendor, and the same map succeeds once the vendor does.
func (v Vendor[D]) CreateAndMapFailuresChangeNothing(t *testing.T, cfg standin.Config, create, mapping Fault) {
	d, lib := v.OpenStandin(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
	g := cfg.MinGranularity
	lib.Fail(create.Fn, 1, 1, create.Code)
	_, err := d.Create(1, g, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, create.Sentinel, create.Message)
	require.Zero(t, lib.Used(1))
	require.Zero(t, lib.Live("allocations"))

	base, err := d.Reserve(d.Granularity(), 0, 0)
	require.NoError(t, err)
	h, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	lib.Fail(mapping.Fn, 1, 1, mapping.Code)
	drivertest.RequireIs(t, d.Map(base, h), mapping.Sentinel, mapping.Message)
	require.Zero(t, lib.Live("mappings"))
	require.NoError(t, d.Map(base, h), "the same map succeeds once the vendor does")
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
}

// StreamCallsFailCleanly: the vendor refusing to make a stream, pinned
// memory or peer access leaves nothing made — no stream of the driver's
// (the one under it is destroyed with it), no buffer, no peer access the
// copies would trust — and the same call succeeds once the vendor does.
func (v Vendor[D]) StreamCallsFailCleanly(t *testing.T, cfg standin.Config, stream, hostAlloc, peer Fault) {
	d, lib := v.OpenStandin(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
	lib.Fail(stream.Fn, 1, 1, stream.Code)
	_, err := d.CreateStream(0)
	drivertest.RequireIs(t, err, stream.Sentinel, stream.Message)
	require.Zero(t, lib.Live("streams"))
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	require.NoError(t, d.SyncStream(s))

	lib.Fail(hostAlloc.Fn, 1, 1, hostAlloc.Code)
	_, err = d.HostAlloc(4096)
	drivertest.RequireIs(t, err, hostAlloc.Sentinel, hostAlloc.Message)
	require.Zero(t, lib.Live("hostallocs"))

	// A copy from device 0 to device 1's memory needs peer access; the
	// refused enable must not count.
	// Each device's chunk has a reservation of its own (AscendCL binds a
	// reservation to one device's memory).
	g := cfg.MinGranularity
	base, err := d.Reserve(d.Granularity(), 0, 0)
	require.NoError(t, err)
	h0, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	h1, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	peerAt, err := d.Reserve(d.Granularity(), 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h0))
	require.NoError(t, d.Map(peerAt, h1))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, d.SetAccess(peerAt, g, 0, driver.AccessReadWrite))
	lib.Fail(peer.Fn, 1, 1, peer.Code)
	drivertest.RequireIs(t, d.EnablePeerAccess(0, 1), peer.Sentinel, peer.Message)
	require.NoError(t, d.CopyDtoD(peerAt, base, 64, s))
	drivertest.RequireIs(t, d.SyncStream(s), driver.ErrAccessDenied, "peer access from device 0")
	require.NoError(t, d.EnablePeerAccess(0, 1), "the retry")
	require.NoError(t, d.CopyDtoD(peerAt, base, 64, s))
	require.NoError(t, d.SyncStream(s))

	require.NoError(t, d.DestroyStream(s))
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Unmap(peerAt, g))
	require.NoError(t, d.Release(h0))
	require.NoError(t, d.Release(h1))
	require.NoError(t, d.Close(), "no buffer or stream left holds it open")
}

// SetAccessCalls: access granted over three adjacent mappings takes calls
// vendor calls — one when the vendor's call spans mappings (CUDA), one a
// mapping when it does not (AscendCL) — and reaches every mapping.
func (v Vendor[D]) SetAccessCalls(t *testing.T, cfg standin.Config, fn string, calls uint64) {
	d, lib, g, at := v.threeMapped(t, cfg)
	before := lib.Calls(fn)
	require.NoError(t, d.SetAccess(at(0), 3*g, 0, driver.AccessReadWrite))
	require.Equal(t, before+calls, lib.Calls(fn))
	for i := range 3 {
		require.Equal(t, int(driver.AccessReadWrite), lib.Access(uint64(at(i)), 0), "the hardware, mapping %d", i)
	}
	for i := range 3 {
		require.NoError(t, d.Unmap(at(i), g))
	}
}

// threeMapped opens the stand-in and maps three chunks of one granule g
// side by side at the start of a reservation of four: at(i) is the i-th
// granule.
func (v Vendor[D]) threeMapped(t *testing.T, cfg standin.Config) (d D, lib *standin.Lib, g uint64, at func(int) driver.Addr) {
	d, lib = v.OpenStandin(t, cfg, func(path string) (D, error) { return v.Open(path, 0) })
	g = cfg.MinGranularity
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	at = func(i int) driver.Addr { return base + driver.Addr(uint64(i)*g) }
	for i := range 3 {
		h, err := d.Create(0, g, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(at(i), h))
	}
	return d, lib, g, at
}
