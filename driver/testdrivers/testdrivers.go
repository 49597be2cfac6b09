// Package testdrivers is the table of drivers the layers' tests run on:
// the host driver, and the CUDA and AscendCL drivers over the C stand-ins
// of their vendor libraries (driver/cuda/cudatest, driver/acl/acltest),
// each opened with the same shape of machine. A layer's test of its own
// logic — a model, growth, giving back, a pool's reuse — runs once per
// driver, so what it proves on the host holds over a vendor's library too.
//
// The stand-in drivers have no HostMapper: bytes move with the driver's
// Read and Write, or stream copies from pinned buffers (HostBuffer), there.
package testdrivers

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/acl/acltest"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
)

// Driver is what the layers' tests need of a driver: the contract with
// streams, and the figures and self-check every driver here has.
type Driver interface {
	driver.Driver
	driver.Streams
	Used(driver.DeviceID) uint64
	Check() error
}

// Machine is the shape of the devices a test asks for. It is comparable:
// fuzz targets key their shared drivers by it.
type Machine struct {
	Devices     int
	Capacity    uint64 // of each device
	Granularity uint64 // each device's minimum granularity
	NoPeer      bool   // the devices cannot reach each other's memory
}

// Backend opens drivers of one kind. A driver it opens is closed when the
// test ends, which fails if something the test made still maps memory;
// a stand-in must then hold nothing.
type Backend struct {
	Name string
	Open func(t testing.TB, m Machine) Driver
	// OneDevice: each reservation binds one device's memory, local or
	// imported, never both (AscendCL's aclrtMapMem); Map refuses the
	// rest with ErrUnsupported (acl.Driver.ReservationsBindOneDevice).
	OneDevice bool
}

// SkipMixedDevices skips t on a backend whose reservations bind one
// device (OneDevice): a range over several devices, or a move between
// devices inside one range, is refused there, as on the real hardware.
func (b Backend) SkipMixedDevices(t testing.TB) {
	t.Helper()
	if b.OneDevice {
		t.Skipf("%s binds a reservation to one device's memory: a range over several devices cannot be made on it", b.Name)
	}
}

// Host is the host driver's backend, for the tests that stay host-only.
func Host() Backend { return Backend{Name: "host", Open: openHost} }

// All are the backends every shared test runs on.
func All() []Backend {
	return []Backend{
		Host(),
		{Name: "cuda", Open: func(t testing.TB, m Machine) Driver {
			d, _ := cudatest.Open(t, m.Standin(), cuda.Options{})
			return d
		}},
		{Name: "acl", Open: func(t testing.TB, m Machine) Driver {
			d, _ := acltest.Open(t, m.Standin(), acl.Options{})
			return d
		}, OneDevice: true},
	}
}

func openHost(t testing.TB, m Machine) Driver {
	drv, err := host.New(host.Options{Devices: m.Devices, Capacity: m.Capacity, Granularity: m.Granularity, NoPeerAccess: m.NoPeer})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return drv
}

// Standin is the stand-in machine of m's shape, the recommended
// granularity 2 MiB as on GPUs and NPUs.
func (m Machine) Standin() cudatest.Config {
	return cudatest.Config{Devices: m.Devices, Capacity: m.Capacity, MinGranularity: m.Granularity,
		RecommendedGranularity: max(m.Granularity, 2*units.MiB), NoPeer: m.NoPeer}
}

// Seeds is how many of a model test's n seeds run on b: all on the host
// driver, half over a stand-in, where every byte the model reads or
// writes is a copy by the vendor library and the layer's logic is the
// same — it keeps the suite's time on two cores in bounds.
func (b Backend) Seeds(n int) int {
	if b.Name == "host" {
		return n
	}
	return (n + 1) / 2
}

// Each runs test once per backend, as a subtest named after it.
func Each(t *testing.T, test func(t *testing.T, b Backend)) {
	for _, b := range All() {
		t.Run(b.Name, func(t *testing.T) { test(t, b) })
	}
}

// ForFuzz are the backends for the inputs of a fuzz target: each driver
// opened once per machine of ms, before f.Fuzz — a stand-in is a library
// loaded for good, so one per input would pile up thousands in a fuzzing
// run. An input finds its driver as the last one left it; one that a
// failed input left holding memory is replaced, for that input, by a
// fresh one.
func ForFuzz(f *testing.F, ms ...Machine) []Backend {
	var out []Backend
	for _, b := range All() {
		shared := map[Machine]Driver{}
		for _, m := range ms {
			shared[m] = b.Open(f, m)
		}
		out = append(out, Backend{Name: b.Name, Open: func(t testing.TB, m Machine) Driver {
			if s, ok := shared[m]; ok && holdsNothing(s, m.Devices) {
				return s
			}
			return b.Open(t, m)
		}, OneDevice: b.OneDevice})
	}
	return out
}

// holdsNothing reports whether no memory is committed on d's devices.
func holdsNothing(d Driver, devices int) bool {
	for dev := range devices {
		if d.Used(driver.DeviceID(dev)) != 0 {
			return false
		}
	}
	return true
}

// HostBuffer is n bytes of pinned host memory (HostAlloc), freed when the
// test ends: an async copy's host buffer on every driver, AscendCL's too,
// which wants it 64-byte aligned.
func HostBuffer(t testing.TB, d Driver, n int) []byte {
	t.Helper()
	b, err := d.HostAlloc(uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.HostFree(b)) })
	return b[:n]
}
