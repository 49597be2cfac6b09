package multidev

import (
	"testing"

	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The tests of the arena's own logic over several devices — the model,
// placement, OnFull, grants and reachability, migration — run on every
// driver of driver/testdrivers: the host driver, and the CUDA and
// AscendCL drivers over their C stand-ins, whose peer access is the
// vendor's. Tests that
// compare with the host driver's own figures (heap bytes, the kernel's
// mappings) stay host-only.

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

// onEveryDriver runs test once per driver, as a subtest named after it;
// it skips a driver whose reservations bind one device (AscendCL): a
// range over several devices cannot be made there.
func onEveryDriver(t *testing.T, test func(t *testing.T, d backend)) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		b.SkipMixedDevices(t)
		test(t, backend{b})
	})
}

// machine is a machine of this package's tests: devices of capacity
// bytes each, of granularity g, reaching each other or not.
type machine struct {
	devices  int
	capacity uint64
	noPeer   bool
}

func (m machine) shape() testdrivers.Machine {
	return testdrivers.Machine{Devices: m.devices, Capacity: m.capacity, Granularity: g, NoPeer: m.noPeer}
}

// standin is the stand-in machine of m, for the fault sweeps.
func (m machine) standin() cudatest.Config { return m.shape().Standin() }

// open opens a driver of d's kind on m.
func (d backend) open(t testing.TB, m machine) testDriver { return d.Open(t, m.shape()) }

// env is newEnv on d: four devices of capacity bytes each.
func (d backend) env(t testing.TB, capacity uint64, noPeer bool) *env {
	t.Helper()
	drv := d.open(t, machine{devices: 4, capacity: capacity, noPeer: noPeer})
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// fuzzDrivers are the drivers for a fuzz target's inputs, opened once per
// machine of ms (testdrivers.ForFuzz), but those whose reservations bind
// one device.
func fuzzDrivers(f *testing.F, ms ...machine) []backend {
	shapes := make([]testdrivers.Machine, len(ms))
	for i, m := range ms {
		shapes[i] = m.shape()
	}
	var mixing []testdrivers.Backend // drivers that map several devices in one range
	for _, b := range testdrivers.ForFuzz(f, shapes...) {
		if !b.OneDevice {
			mixing = append(mixing, b)
		}
	}
	return wrap(mixing)
}
