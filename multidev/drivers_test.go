package multidev

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

// The tests of the arena's own logic over several devices — the model,
// placement, OnFull, grants and reachability, migration — run on every
// driver of this table: the host driver, and the CUDA and AscendCL
// drivers over their C stand-ins (driver/cuda/cudatest,
// driver/acl/acltest), whose peer access is the vendor's. Tests that
// compare with the host driver's own figures (heap bytes, the kernel's
// mappings) stay host-only.

// testDriver is what the tests need of a driver: the contract, and the
// figures and self-check that every driver here has.
type testDriver interface {
	driver.Driver
	Used(driver.DeviceID) uint64
	Check() error
}

// machine is the devices a test asks for.
type machine struct {
	devices  int
	capacity uint64 // of each device
	noPeer   bool   // devices cannot reach each other's memory
}

// backend opens a driver of one kind for a test; the driver is closed
// when the test ends, and a stand-in must then hold nothing.
type backend struct {
	name string
	open func(t testing.TB, m machine) testDriver
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
func overStandin[D testDriver, O any](open func(testing.TB, cudatest.Config, O) (D, *cudatest.Lib)) func(testing.TB, machine) testDriver {
	return func(t testing.TB, m machine) testDriver {
		var opts O
		d, _ := open(t, m.standin(), opts)
		return d
	}
}

func openHost(t testing.TB, m machine) testDriver {
	drv, err := host.New(host.Options{Devices: m.devices, Capacity: m.capacity, Granularity: g, NoPeerAccess: m.noPeer})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return drv
}

// standin is the stand-in machine with the host driver's shape in these
// tests: minimum granularity g, recommended 2 MiB.
func (m machine) standin() cudatest.Config {
	return cudatest.Config{Devices: m.devices, Capacity: m.capacity, MinGranularity: g, RecommendedGranularity: 2 * units.MiB, NoPeer: m.noPeer}
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

// env is newEnv on d: four devices of capacity bytes each.
func (d backend) env(t testing.TB, capacity uint64, noPeer bool) *env {
	t.Helper()
	drv := d.open(t, machine{devices: 4, capacity: capacity, noPeer: noPeer})
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// fuzzDrivers are the drivers for the inputs of a fuzz target: each opened
// once per machine, before f.Fuzz — a stand-in is a library loaded for
// good, so one per input would pile up thousands in a fuzzing run. An
// input finds its driver as the last one left it; one that a failed input
// left holding memory is replaced, for that input, by a fresh one.
func fuzzDrivers(f *testing.F, ms ...machine) []backend {
	var out []backend
	for _, d := range drivers {
		shared := map[machine]testDriver{}
		for _, m := range ms {
			shared[m] = d.open(f, m)
		}
		out = append(out, backend{d.name, func(t testing.TB, m machine) testDriver {
			if s, ok := shared[m]; ok && holdsNothing(s, m.devices) {
				return s
			}
			return d.open(t, m)
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
