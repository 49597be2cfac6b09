package pool

import (
	"testing"

	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The tests of the pool's own logic — the model, stream-ordered reuse and
// its policies, the release threshold, trimming, access, default pools —
// run on every driver of driver/testdrivers: the host driver, and the
// CUDA and AscendCL drivers over their C stand-ins, whose streams are the vendor's and which have no
// HostMapper: bytes move with the driver's Read and Write there, and
// stream copies (from pinned host buffers: AscendCL wants them 64-byte
// aligned). Tests of the host driver's own behaviour, or of drivers made
// to misbehave, stay host-only.

// testDriver is what the tests need of a driver.
type testDriver = testdrivers.Driver

// backend opens drivers of one kind (driver/testdrivers).
type backend struct{ testdrivers.Backend }

func wrap(bs []testdrivers.Backend) []backend {
	out := make([]backend, len(bs))
	for i, b := range bs {
		out[i] = backend{b}
	}
	return out
}

// onEveryDriver runs test once per driver, as a subtest named after it.
func onEveryDriver(t *testing.T, test func(t *testing.T, d backend)) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) { test(t, backend{b}) })
}

// machine is this package's machine: devices of capacity bytes each, of
// granularity g.
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

// hostBuffer is n bytes of pinned host memory, freed when the test ends.
func hostBuffer(t testing.TB, d testDriver, n int) []byte { return testdrivers.HostBuffer(t, d, n) }
