package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The tests of the arena's own logic — the models, growth, trimming,
// moves, the allocator's placement, giving back and stitching — run on
// every driver of driver/testdrivers: the host driver, and the CUDA and
// AscendCL drivers over their C stand-ins of libcuda and libascendcl,
// which have no HostMapper:
// bytes move with the driver's Read and Write there. Tests that compare
// with the host driver's own figures (heap bytes, the kernel's mappings)
// stay host-only.

// testDriver is what the tests need of a driver.
type testDriver = testdrivers.Driver

// backend opens drivers of one kind (driver/testdrivers), on this
// package's machines: devices of capacity bytes, granularity g.
type backend struct{ testdrivers.Backend }

func wrap(bs []testdrivers.Backend) []backend {
	out := make([]backend, len(bs))
	for i, b := range bs {
		out[i] = backend{b}
	}
	return out
}

// machine is this package's machine: devices of capacity bytes each.
func machine(devices int, capacity uint64) testdrivers.Machine {
	return testdrivers.Machine{Devices: devices, Capacity: capacity, Granularity: g}
}

// open opens a driver of d's kind with devices of capacity bytes each.
func (d backend) open(t testing.TB, devices int, capacity uint64) testDriver {
	return d.Open(t, machine(devices, capacity))
}

// openHost opens a host driver with devices of capacity bytes each.
func openHost(t testing.TB, devices int, capacity uint64) testDriver {
	return backend{testdrivers.Host()}.open(t, devices, capacity)
}

// standin is the stand-in machine of these tests, for the fault sweeps.
func standin(devices int, capacity uint64) cudatest.Config {
	return machine(devices, capacity).Standin()
}

// onEveryDriver runs test once per driver, as a subtest named after it.
func onEveryDriver(t *testing.T, test func(t *testing.T, d backend)) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) { test(t, backend{b}) })
}

// env is newEnv on d: two devices of capacity bytes each.
func (d backend) env(t testing.TB, capacity uint64) *env {
	t.Helper()
	drv := d.open(t, 2, capacity)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// fuzzDrivers are the drivers for a fuzz target's inputs, opened once
// (testdrivers.ForFuzz) on a machine of devices of capacity bytes.
func fuzzDrivers(f *testing.F, devices int, capacity uint64) []backend {
	return wrap(testdrivers.ForFuzz(f, machine(devices, capacity)))
}

// hostMapped reports whether the env's driver maps device memory into
// this process (View.Bytes and Allocator.Bytes work).
func (e *env) hostMapped() bool {
	_, ok := e.drv.(driver.HostMapper)
	return ok
}

// The tests read and write the memory they were handed through its slice
// where the driver maps it into this process (Allocator.Bytes,
// View.Bytes), as the host tests always did, and with the driver's Read
// and Write elsewhere.

// setByte writes v at byte i of the live allocation p of al.
func (e *env) setByte(t testing.TB, al *Allocator, p driver.Addr, i uint64, v byte) {
	t.Helper()
	if e.hostMapped() {
		b, err := al.Bytes(p)
		require.NoError(t, err)
		b[i] = v
		return
	}
	n, err := al.Size(p)
	require.NoError(t, err)
	require.Less(t, i, n, "byte %d of the allocation at %s", i, p)
	require.NoError(t, e.drv.Write(p+driver.Addr(i), []byte{v}))
}

// byteAt reads byte i of the live allocation p of al.
func (e *env) byteAt(t testing.TB, al *Allocator, p driver.Addr, i uint64) byte {
	t.Helper()
	if e.hostMapped() {
		b, err := al.Bytes(p)
		require.NoError(t, err)
		return b[i]
	}
	n, err := al.Size(p)
	require.NoError(t, err)
	require.Less(t, i, n, "byte %d of the allocation at %s", i, p)
	out := make([]byte, 1)
	require.NoError(t, e.drv.Read(p+driver.Addr(i), out))
	return out[0]
}

// writeView writes p at offset off of the live view v.
func (e *env) writeView(t testing.TB, v *View, off uint64, p []byte) {
	t.Helper()
	if e.hostMapped() {
		b, err := v.Bytes()
		require.NoError(t, err)
		copy(b[off:], p)
		return
	}
	require.LessOrEqual(t, off+uint64(len(p)), v.Len())
	require.NoError(t, e.drv.Write(v.Addr()+driver.Addr(off), p))
}

// readView reads n bytes at offset off of the live view v.
func (e *env) readView(t testing.TB, v *View, off uint64, n int) []byte {
	t.Helper()
	if e.hostMapped() {
		b, err := v.Bytes()
		require.NoError(t, err)
		return append([]byte(nil), b[off:off+uint64(n)]...)
	}
	require.LessOrEqual(t, off+uint64(n), v.Len())
	out := make([]byte, n)
	require.NoError(t, e.drv.Read(v.Addr()+driver.Addr(off), out))
	return out
}

// peek reads n bytes at addr, wherever they lie: memory a test no longer
// holds an allocation or view of (a chunk lent to a stitch).
func (e *env) peek(t testing.TB, addr driver.Addr, n int) []byte {
	t.Helper()
	out := make([]byte, n)
	if hm, ok := e.drv.(driver.HostMapper); ok {
		b, err := hm.HostBytes(addr, uint64(n))
		require.NoError(t, err)
		copy(out, b)
		return out
	}
	require.NoError(t, e.drv.Read(addr, out))
	return out
}
