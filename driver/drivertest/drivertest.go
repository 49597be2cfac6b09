// Package drivertest is the conformance suite of the driver contract: every
// rule in the driver package doc, each checked as its own subtest against any
// driver.Driver. Every backend (driver/sim, driver/host, and later
// driver/cuda and driver/acl) calls Run from its own tests, so that all of
// them answer the same calls with the same states and the same sentinel
// errors.
//
// The suite owns the executable form of the contract. It talks to a driver
// only through the driver.Driver interface, never through a backend's
// internals; for every call it refuses it checks both the sentinel error
// (with errors.Is, and that no second sentinel is
// marked) and that the refused call changed nothing. It never relaxes a rule
// for one backend: a backend that lacks an optional part says so through
// Supports, and the suite then checks the ErrUnsupported answer instead.
package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Run runs every conformance test as a subtest of t. newDriver returns a
// fresh driver for each subtest (and registers its own cleanup); it must have
// a device (the tests that need a second one skip, saying so, where there is
// only one: a machine with one GPU), each able to hold at least 8 ×
// Granularity(), and each
// device's capacity should be at most 64 × its MinGranularity so
// fill-to-capacity tests stay small (larger capacities skip those tests with
// a t.Skip naming why).
//
// Subtests may end with memory mapped, which Close refuses (ErrBusy), and
// some close the driver themselves: the cleanup newDriver registers must
// tear the driver down whatever is left (drivers on the shared ledger use
// ledger.TearDown) and accept a driver already closed. When the
// driver has a method Check() error (drivers built on the shared ledger do),
// the suite calls it at the end of every subtest to verify the record's
// invariants.
func Run(t *testing.T, newDriver func(t *testing.T) driver.Driver) {
	s := suite(newDriver)
	t.Run("Devices", s.devices)
	t.Run("Reserve", s.reserve)
	t.Run("Unreserve", s.unreserve)
	t.Run("Create", s.create)
	t.Run("Release", s.release)
	t.Run("Map", s.mapping)
	t.Run("NewMappingInaccessible", s.newMappingInaccessible)
	t.Run("SetAccess", s.setAccess)
	t.Run("Access", s.access)
	t.Run("Unmap", s.unmap)
	t.Run("ReleaseWhileMapped", s.releaseWhileMapped)
	t.Run("Aliasing", s.aliasing)
	t.Run("HostAccess", s.hostAccess)
	t.Run("Close", s.close)
	t.Run("Concurrency", s.concurrency)
	t.Run("Streams", s.streams)
	t.Run("Sharing", s.sharing)
	t.Run("Books", s.books)
}

// minChunks is how many chunks of the driver granularity the tests may hold
// on one device at once.
const minChunks = 8

// suite makes the fresh driver each leaf subtest runs against.
type suite func(t *testing.T) driver.Driver

// run runs fn as the subtest name of t, against a fresh driver.
func (s suite) run(t *testing.T, name string, fn func(f *fixture)) {
	t.Helper()
	t.Run(name, func(t *testing.T) { fn(s.start(t)) })
}

// start makes a fresh driver for t and checks it is one the suite can use.
func (s suite) start(t *testing.T) *fixture {
	t.Helper()
	d := s(t)
	require.NotNil(t, d, "newDriver returned no driver")
	// Registered after newDriver's own cleanup, so it runs before the driver
	// is closed.
	if c, ok := d.(interface{ Check() error }); ok {
		t.Cleanup(func() {
			if err := c.Check(); err != nil {
				t.Errorf("%s: record invariants broken at the end of the test: %v", d.Name(), err)
			}
		})
	}
	devs := d.Devices()
	require.NotEmpty(t, devs, "drivertest.Run needs a driver with a device; %s has none", d.Name())
	gran := d.Granularity()
	for _, dev := range devs {
		require.GreaterOrEqualf(t, dev.Capacity, minChunks*gran,
			"drivertest.Run needs devices that hold at least %d × the granularity %s; %s device %d holds %s",
			minChunks, units.Bytes(gran), d.Name(), dev.ID, units.Bytes(dev.Capacity))
	}
	f := &fixture{t: t, d: d, devs: devs, gran: gran}
	if b, ok := d.(OneDeviceBinder); ok {
		f.oneDevice = b.ReservationsBindOneDevice()
	}
	return f
}
