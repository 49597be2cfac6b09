package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl/acltest"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The tests of the arena's own logic — the models, growth, trimming,
// moves, the allocator's placement, giving back and stitching — run on
// every driver of this table: the host driver, and the CUDA and AscendCL
// drivers over their C stand-ins of libcuda and libascendcl
// (driver/cuda/cudatest, driver/acl/acltest), which have no HostMapper:
// bytes move with the driver's Read and Write there. Tests that compare
// with the host driver's own figures (heap bytes, the kernel's mappings)
// stay host-only.

// testDriver is what the tests need of a driver: the contract, and the
// figures and self-check that every driver here has.
type testDriver interface {
	driver.Driver
	Used(driver.DeviceID) uint64
	Check() error
}

// backend opens a driver of one kind for a test; the driver is closed
// when the test ends, and a stand-in must then hold nothing.
type backend struct {
	name string
	open func(t testing.TB, devices int, capacity uint64) testDriver
}

// drivers are the drivers the shared tests run on, one line each (a
// driver over a stand-in: its test package's Open, cudatest's, acltest's).
var drivers = []backend{
	{"host", openHost},
	{"cuda", overStandin(cudatest.Open)},
	{"acl", overStandin(acltest.Open)},
}

// overStandin opens a driver over a fresh stand-in with a vendor's test
// opener (cudatest.Open, acltest.Open: the same Config and Lib), with the
// stand-in machine of these tests and the driver's default options.
func overStandin[D testDriver, O any](open func(testing.TB, cudatest.Config, O) (D, *cudatest.Lib)) func(testing.TB, int, uint64) testDriver {
	return func(t testing.TB, devices int, capacity uint64) testDriver {
		var opts O
		d, _ := open(t, standin(devices, capacity), opts)
		return d
	}
}

func openHost(t testing.TB, devices int, capacity uint64) testDriver {
	drv, err := host.New(host.Options{Devices: devices, Capacity: capacity, Granularity: g})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return drv
}

// standin is the stand-in machine with the host driver's shape in these
// tests: devices of capacity bytes, minimum granularity g, recommended
// 2 MiB.
func standin(devices int, capacity uint64) cudatest.Config {
	return cudatest.Config{Devices: devices, Capacity: capacity, MinGranularity: g, RecommendedGranularity: 2 * units.MiB}
}

// seeds is how many of a model test's n seeds run on d: all on the host
// driver, half over a stand-in, where every byte the model reads or
// writes is a copy by the vendor library and the layer's logic is the same — it keeps
// the suite's time on two cores in bounds.
func (d backend) seeds(n int) int {
	if d.name == "host" {
		return n
	}
	return (n + 1) / 2
}

// onEveryDriver runs test once per driver, as a subtest named after it.
func onEveryDriver(t *testing.T, test func(t *testing.T, d backend)) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) { test(t, d) })
	}
}

// env is newEnv on d: two devices of capacity bytes each.
func (d backend) env(t testing.TB, capacity uint64) *env {
	t.Helper()
	drv := d.open(t, 2, capacity)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// fuzzDrivers are the drivers for the inputs of a fuzz target: each opened
// once, before f.Fuzz — a stand-in is a library loaded for good, so one
// per input would pile up thousands in a fuzzing run. An input finds its
// driver as the last one left it; one that a failed input left holding
// memory is replaced, for that input, by a fresh one.
func fuzzDrivers(f *testing.F, devices int, capacity uint64) []backend {
	var out []backend
	for _, d := range drivers {
		shared := d.open(f, devices, capacity)
		out = append(out, backend{d.name, func(t testing.TB, n int, c uint64) testDriver {
			if n == devices && c == capacity && holdsNothing(shared, devices) {
				return shared
			}
			return d.open(t, n, c)
		}})
	}
	return out
}

// holdsNothing reports whether no memory is committed on d's devices.
func holdsNothing(d testDriver, devices int) bool {
	for dev := range devices {
		if d.Used(driver.DeviceID(dev)) != 0 {
			return false
		}
	}
	return true
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
