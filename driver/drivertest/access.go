package drivertest

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// setAccess checks SetAccess: mapped ranges only, per device, per granule.
func (s suite) setAccess(t *testing.T) {
	s.run(t, "Unmapped", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		for _, size := range []uint64{f.gran, 2 * f.gran} {
			f.requireIs(f.d.SetAccess(base, size, 0, driver.AccessReadWrite), driver.ErrNotMapped)
		}
		f.requireNotMapped(base)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		f.requireOnly(base, 0, driver.AccessReadWrite)
	})
	s.run(t, "PartlyMapped", func(f *fixture) {
		// Granules 1 and 3 of 5 are mapped, each read for device 1.
		base := f.reserve(5 * f.gran)
		one, three := at(base, f.gran), at(base, 3*f.gran)
		for _, a := range []driver.Addr{one, three} {
			f.mapNew(a, 0, f.gran)
			f.setAccess(a, f.gran, 1, driver.AccessRead)
		}
		for _, c := range []struct {
			name      string
			off, size uint64
		}{
			{"unmapped head", 0, 2 * f.gran},
			{"unmapped tail", f.gran, 2 * f.gran},
			{"unmapped middle", f.gran, 3 * f.gran},
			{"unmapped both ends", 0, 5 * f.gran},
		} {
			err := f.d.SetAccess(at(base, c.off), c.size, 1, driver.AccessReadWrite)
			f.requireIs(err, driver.ErrNotMapped)
			f.requireOnly(one, 1, driver.AccessRead)
			f.requireOnly(three, 1, driver.AccessRead)
			f.requireNotMapped(at(base, 2*f.gran))
		}
	})
	s.run(t, "OutsideReservation", func(f *fixture) {
		gone := f.unreserved(f.gran)
		f.requireIs(f.d.SetAccess(gone, f.gran, 0, driver.AccessRead), driver.ErrNotReserved)
		// A range running past the end of its reservation.
		base := f.reserve(f.gran)
		f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.requireIs(f.d.SetAccess(base, 2*f.gran, 0, driver.AccessRead), driver.ErrNotReserved)
		f.requireNone(base)
	})
	s.run(t, "UnknownDevice", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessRead)
		for _, dev := range []driver.DeviceID{-1, driver.DeviceID(len(f.devs)), driver.MaxDevices} {
			f.requireIs(f.d.SetAccess(base, f.gran, dev, driver.AccessReadWrite), driver.ErrNoDevice)
			f.requireOnly(base, 0, driver.AccessRead)
		}
	})
	s.run(t, "InvalidAccess", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessRead)
		for _, a := range []driver.Access{2, 4, 7, 255} {
			f.requireIs(f.d.SetAccess(base, f.gran, 0, a), driver.ErrInvalid)
			f.requireOnly(base, 0, driver.AccessRead)
		}
	})
	s.run(t, "ZeroSize", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.requireIs(f.d.SetAccess(base, 0, 0, driver.AccessRead), driver.ErrInvalid)
		f.requireNone(base)
	})
	s.run(t, "Misaligned", func(f *fixture) {
		g := f.g(0)
		base := f.reserve(roundUp(2*g, f.gran))
		f.mapNew(base, 0, 2*g)
		for _, c := range []struct {
			off, size uint64
		}{
			{g / 2, g},     // start
			{0, g / 2},     // end
			{0, g + g/2},   // end, in the next granule
			{g / 2, g / 2}, // both
		} {
			err := f.d.SetAccess(at(base, c.off), c.size, 0, driver.AccessReadWrite)
			f.requireIs(err, driver.ErrMisaligned, units.Bytes(g))
			f.requireNone(base)
			f.requireNone(at(base, g))
		}
	})
	s.run(t, "OnlyNamedDevice", func(f *fixture) {
		base := f.reserve(f.gran * uint64(len(f.devs)))
		for i := range f.devs {
			dev := driver.DeviceID(i)
			a := at(base, f.gran*uint64(i))
			f.mapNew(a, f.beside(dev), f.gran)
			f.setAccess(a, f.gran, dev, driver.AccessReadWrite)
			f.requireOnly(a, dev, driver.AccessReadWrite)
			// A second device's grant leaves the first's alone.
			f.has(1)
			other := driver.DeviceID((i + 1) % len(f.devs))
			f.setAccess(a, f.gran, other, driver.AccessRead)
			f.requireAccess(a, dev, driver.AccessReadWrite)
			f.requireAccess(a, other, driver.AccessRead)
			// Taking the first's away leaves the second's.
			f.setAccess(a, f.gran, dev, driver.AccessNone)
			f.requireOnly(a, other, driver.AccessRead)
			f.setAccess(a, f.gran, other, driver.AccessNone)
			f.requireNone(a)
		}
	})
	s.run(t, "EveryValue", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		for _, a := range []driver.Access{driver.AccessRead, driver.AccessReadWrite, driver.AccessRead, driver.AccessNone, driver.AccessReadWrite} {
			f.setAccess(base, f.gran, 1, a)
			f.requireOnly(base, 1, a)
		}
	})
	s.run(t, "SpansAdjacentMappings", func(f *fixture) {
		// Three mappings side by side, of chunks on different devices
		// where the driver allows it.
		base := f.reserve(4 * f.gran)
		for i := range uint64(3) {
			f.mapNew(at(base, i*f.gran), f.beside(driver.DeviceID(i%2)), f.gran)
		}
		f.setAccess(base, 3*f.gran, 0, driver.AccessReadWrite)
		f.setAccess(at(base, f.gran), 2*f.gran, 1, driver.AccessRead)
		f.requireOnly(base, 0, driver.AccessReadWrite)
		for i := uint64(1); i < 3; i++ {
			f.requireAccess(at(base, i*f.gran), 0, driver.AccessReadWrite)
			f.requireAccess(at(base, i*f.gran), 1, driver.AccessRead)
		}
		f.requireNotMapped(at(base, 3*f.gran))
	})
	s.run(t, "PerGranule", func(f *fixture) {
		g := f.g(0)
		base := f.reserve(roundUp(3*g, f.gran))
		f.mapNew(base, 0, 3*g)
		f.setAccess(at(base, g), g, 0, driver.AccessReadWrite)
		f.requireNone(base)
		f.requireOnly(at(base, g), 0, driver.AccessReadWrite)
		f.requireNone(at(base, 2*g))
		if f.hostAccess() {
			data := pattern(probe, 7)
			f.write(at(base, g), data)
			f.requireBytes(at(base, g), data)
			f.requireIs(f.d.Read(base, make([]byte, probe)), driver.ErrAccessDenied)
			f.requireIs(f.d.Read(at(base, g-probe), make([]byte, 2*probe)), driver.ErrAccessDenied)
			f.requireIs(f.d.Write(at(base, 2*g), data), driver.ErrAccessDenied)
		}
		// Narrowing one granule of a wider grant.
		f.setAccess(base, 3*g, 1, driver.AccessRead)
		f.setAccess(at(base, 2*g), g, 1, driver.AccessNone)
		f.requireOnly(base, 1, driver.AccessRead)
		f.requireAccess(at(base, g), 1, driver.AccessRead)
		f.requireAccess(at(base, g), 0, driver.AccessReadWrite)
		f.requireNone(at(base, 2*g))
	})
}

// access checks the refusals of Access itself.
func (s suite) access(t *testing.T) {
	s.run(t, "UnknownDevice", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		for _, dev := range []driver.DeviceID{-1, driver.DeviceID(len(f.devs))} {
			_, err := f.d.Access(base, dev)
			f.requireIs(err, driver.ErrNoDevice)
		}
	})
	s.run(t, "ReservedOnly", func(f *fixture) {
		f.requireNotMapped(f.reserve(f.gran))
	})
	s.run(t, "OutsideReservation", func(f *fixture) {
		_, err := f.d.Access(f.unreserved(f.gran), 0)
		f.requireIs(err, driver.ErrNotReserved)
	})
	s.run(t, "InteriorAddress", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 1, driver.AccessRead)
		f.requireOnly(at(base, f.gran-1), 1, driver.AccessRead)
	})
}
