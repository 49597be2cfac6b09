package pool

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

// The tests of the pool's own logic — the model, stream-ordered reuse and
// its policies, the release threshold, trimming, access, default pools —
// run on every driver of this table: the host driver, and the CUDA and
// AscendCL drivers over their C stand-ins (driver/cuda/cudatest,
// driver/acl/acltest), whose streams are the vendor's and which have no
// HostMapper: bytes move with the driver's Read and Write there, and
// stream copies (from pinned host buffers: AscendCL wants them 64-byte
// aligned). Tests of the host driver's own behaviour, or of drivers made
// to misbehave, stay host-only.

// testDriver is what the tests need of a driver: the contract with
// streams, and the figures and self-check that every driver here has.
type testDriver interface {
	driver.Driver
	driver.Streams
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

// hostBuffer is n bytes of pinned host memory (HostAlloc), freed when the
// test ends: an async copy's host buffer on every driver, AscendCL's too,
// which wants it 64-byte aligned.
func hostBuffer(t testing.TB, d testDriver, n int) []byte {
	t.Helper()
	b, err := d.HostAlloc(uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.HostFree(b)) })
	return b[:n]
}
