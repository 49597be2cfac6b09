package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// mapping checks Map: a chunk goes whole inside one reservation, at an
// aligned address, over nothing already mapped.
func (s suite) mapping(t *testing.T) {
	s.run(t, "OutsideReservation", func(f *fixture) {
		gone := f.unreserved(f.gran)
		h := f.create(0, f.gran)
		f.requireIs(f.d.Map(gone, h), driver.ErrNotReserved)
		// The chunk is untouched and maps elsewhere.
		base := f.reserve(f.gran)
		f.mapAt(base, h)
		f.requireNone(base)
	})
	s.run(t, "RunsPastReservationEnd", func(f *fixture) {
		// Two reservations, which a driver may well place side by side: a
		// mapping must not run from one into the next.
		first := f.reserve(2 * f.gran)
		f.reserve(2 * f.gran)
		h := f.create(0, 2*f.gran)
		f.requireIs(f.d.Map(at(first, f.gran), h), driver.ErrNotReserved)
		f.requireNotMapped(at(first, f.gran))
		f.mapAt(first, h)
		f.requireNone(at(first, f.gran))
	})
	s.run(t, "Misaligned", func(f *fixture) {
		base := f.reserve(roundUp(2*f.g(0), f.gran))
		h := f.create(0, f.g(0))
		for _, a := range []driver.Addr{at(base, f.g(0)/2), at(base, 1)} {
			f.requireIs(f.d.Map(a, h), driver.ErrMisaligned, units.Bytes(f.g(0)))
		}
		f.requireNotMapped(base)
		f.mapAt(base, h)
		f.requireNone(base)
	})
	s.run(t, "OverlapSameStart", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		for _, size := range []uint64{f.gran, 2 * f.gran} {
			h := f.create(1, size)
			f.requireIs(f.d.Map(base, h), driver.ErrOverlap)
			f.requireOnly(base, 0, driver.AccessReadWrite)
			require.NoError(f.t, f.d.Release(h))
		}
		f.requireNotMapped(at(base, f.gran))
	})
	s.run(t, "OverlapPartial", func(f *fixture) {
		base := f.reserve(4 * f.gran)
		// The mapping under attack covers granules 1 and 2; granule 1 is
		// read-write for device 0 and granule 2 read for device 1.
		mid := at(base, f.gran)
		f.mapNew(mid, 0, 2*f.gran)
		f.setAccess(mid, f.gran, 0, driver.AccessReadWrite)
		f.setAccess(at(mid, f.gran), f.gran, 1, driver.AccessRead)
		check := func() {
			f.t.Helper()
			f.requireNotMapped(base)
			f.requireOnly(mid, 0, driver.AccessReadWrite)
			f.requireOnly(at(mid, f.gran), 1, driver.AccessRead)
			f.requireNotMapped(at(base, 3*f.gran))
		}
		for _, c := range []struct {
			off, size uint64
		}{
			{0, 2 * f.gran},          // its head
			{2 * f.gran, 2 * f.gran}, // its tail
			{0, 4 * f.gran},          // all of it and more
			{f.gran, f.gran},         // its first granule
			{2 * f.gran, f.gran},     // its last granule
		} {
			h := f.create(0, c.size)
			f.requireIs(f.d.Map(at(base, c.off), h), driver.ErrOverlap)
			check()
			require.NoError(f.t, f.d.Release(h))
		}
		// The free granules on either side still take mappings.
		f.mapNew(base, f.beside(1), f.gran)
		f.mapNew(at(base, 3*f.gran), f.beside(1), f.gran)
		f.requireOnly(mid, 0, driver.AccessReadWrite)
	})
	s.run(t, "ReleasedHandle", func(f *fixture) {
		base := f.reserve(f.gran)
		h := f.create(0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		f.requireIs(f.d.Map(base, h), driver.ErrBadHandle)
		f.requireNotMapped(base)
		f.mapNew(base, 0, f.gran)
	})
	s.run(t, "UnknownHandle", func(f *fixture) {
		base := f.reserve(f.gran)
		h := f.create(0, f.gran)
		for _, bad := range []driver.Handle{0, h + 1000, ^driver.Handle(0)} {
			f.requireIs(f.d.Map(base, bad), driver.ErrBadHandle)
			f.requireNotMapped(base)
		}
		f.mapAt(base, h)
	})
	s.run(t, "OtherDeviceBeside", func(f *fixture) {
		// A chunk of device 1 beside device 0's memory in one
		// reservation: mapped, or, where the driver's reservations bind
		// one device (OneDeviceBinder), refused with nothing changed.
		base := f.reserve(2 * f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		h := f.create(1, f.gran)
		err := f.d.Map(at(base, f.gran), h)
		if !f.oneDevice {
			require.NoError(f.t, err, "chunks of two devices side by side")
			f.requireNone(at(base, f.gran))
			return
		}
		f.requireIs(err, driver.ErrUnsupported, "device 0", "device 1")
		f.requireNotMapped(at(base, f.gran))
		f.requireOnly(base, 0, driver.AccessReadWrite)
		f.mapAt(f.reserve(f.gran), h) // a reservation of its own takes it
		f.unmap(base, f.gran)
		h2 := f.create(1, f.gran)
		f.mapAt(base, h2) // once device 0's memory is gone, device 1's maps there
		f.mapNew(at(base, f.gran), 1, f.gran)
	})
	s.run(t, "WholeChunk", func(f *fixture) {
		base := f.reserve(4 * f.gran)
		f.mapNew(base, 0, 3*f.gran)
		for i := range uint64(3) {
			f.requireNone(at(base, i*f.gran))
		}
		f.requireNotMapped(at(base, 3*f.gran))
	})
}

// newMappingInaccessible checks that Map grants nothing: every granule of a
// new mapping is inaccessible to every device.
func (s suite) newMappingInaccessible(t *testing.T) {
	s.run(t, "EveryGranuleEveryDevice", func(f *fixture) {
		base := f.reserve(2 * f.gran * uint64(len(f.devs)))
		for i := range f.devs {
			dev := driver.DeviceID(i)
			a := at(base, 2*f.gran*uint64(i))
			if f.oneDevice && i > 0 {
				a = f.reserve(2 * f.gran) // a reservation per device
			}
			f.mapNew(a, dev, 2*f.gran)
			for off := uint64(0); off < 2*f.gran; off += f.g(dev) {
				f.requireNone(at(a, off))
			}
		}
	})
	s.run(t, "NextToAccessibleMapping", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		f.mapNew(base, 0, f.gran)
		for i := range f.devs {
			f.setAccess(base, f.gran, driver.DeviceID(i), driver.AccessReadWrite)
		}
		f.mapNew(at(base, f.gran), 0, f.gran)
		f.requireNone(at(base, f.gran))
	})
}

// unmap checks Unmap: the mapping is the unit, and the chunk outlives it.
func (s suite) unmap(t *testing.T) {
	// mapped returns a reservation of 4 granules with a 2-granule chunk at
	// its granule 1, read-write for device 0.
	mapped := func(f *fixture) (base, m driver.Addr, h driver.Handle) {
		base = f.reserve(4 * f.gran)
		m = at(base, f.gran)
		h = f.mapNew(m, 0, 2*f.gran)
		f.setAccess(m, 2*f.gran, 0, driver.AccessReadWrite)
		return base, m, h
	}
	intact := func(f *fixture, m driver.Addr) {
		f.t.Helper()
		f.requireOnly(m, 0, driver.AccessReadWrite)
		f.requireOnly(at(m, f.gran), 0, driver.AccessReadWrite)
	}
	s.run(t, "NotMapped", func(f *fixture) {
		base, m, _ := mapped(f)
		for _, c := range []struct {
			a    driver.Addr
			size uint64
		}{{base, f.gran}, {base, 2 * f.gran}, {at(base, 3*f.gran), f.gran}} {
			f.requireIs(f.d.Unmap(c.a, c.size), driver.ErrNotMapped)
			intact(f, m)
		}
		f.unmap(m, 2*f.gran)
	})
	s.run(t, "InteriorAddress", func(f *fixture) {
		_, m, _ := mapped(f)
		for _, size := range []uint64{f.gran, 2 * f.gran} {
			f.requireIs(f.d.Unmap(at(m, f.gran), size), driver.ErrPartial)
			intact(f, m)
		}
		if f.g(0) < f.gran {
			f.requireIs(f.d.Unmap(at(m, f.g(0)), 2*f.gran-f.g(0)), driver.ErrPartial)
			intact(f, m)
		}
		f.unmap(m, 2*f.gran)
	})
	s.run(t, "WrongSize", func(f *fixture) {
		_, m, _ := mapped(f)
		for _, size := range []uint64{f.gran, 3 * f.gran} {
			f.requireIs(f.d.Unmap(m, size), driver.ErrPartial)
			intact(f, m)
		}
		f.unmap(m, 2*f.gran)
	})
	s.run(t, "OutsideReservation", func(f *fixture) {
		_, m, _ := mapped(f)
		gone := f.unreserved(f.gran)
		f.requireIs(f.d.Unmap(gone, f.gran), driver.ErrNotReserved)
		intact(f, m)
	})
	s.run(t, "Twice", func(f *fixture) {
		_, m, _ := mapped(f)
		f.unmap(m, 2*f.gran)
		f.requireIs(f.d.Unmap(m, 2*f.gran), driver.ErrNotMapped)
	})
	s.run(t, "LeavesReserved", func(f *fixture) {
		_, m, _ := mapped(f)
		f.unmap(m, 2*f.gran)
		f.requireNotMapped(m)
		f.requireNotMapped(at(m, f.gran))
		f.requireIs(f.d.SetAccess(m, f.gran, 0, driver.AccessRead), driver.ErrNotMapped)
	})
	s.run(t, "RemapSamePlace", func(f *fixture) {
		_, m, h := mapped(f)
		f.unmap(m, 2*f.gran)
		f.mapAt(m, h)
		// Access does not survive the mapping it was granted on.
		f.requireNone(m)
		f.requireNone(at(m, f.gran))
	})
	s.run(t, "RemapElsewhere", func(f *fixture) {
		base, m, h := mapped(f)
		f.unmap(m, 2*f.gran)
		f.mapAt(base, h) // overlapping where it was
		f.requireNone(base)
		f.unmap(base, 2*f.gran)
		other := f.reserve(2 * f.gran)
		f.mapAt(other, h) // in another reservation
		f.requireNone(at(other, f.gran))
	})
}

// releaseWhileMapped checks that a released chunk lives on in its mappings:
// they keep working and its memory counts until the last is gone.
func (s suite) releaseWhileMapped(t *testing.T) {
	s.run(t, "MappingKeepsWorking", func(f *fixture) {
		base := f.reserve(f.gran)
		h := f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		data := pattern(probe, 2)
		if f.hostAccess() {
			f.write(base, data)
		}
		require.NoError(f.t, f.d.Release(h))
		f.requireOnly(base, 0, driver.AccessReadWrite)
		if f.hostAccess() {
			f.requireBytes(base, data)
			more := pattern(probe, 3)
			f.write(at(base, probe), more)
			f.requireBytes(at(base, probe), more)
		}
		f.setAccess(base, f.gran, 0, driver.AccessRead)
		f.requireOnly(base, 0, driver.AccessRead)
		f.unmap(base, f.gran)
		f.requireNotMapped(base)
	})
	s.run(t, "MemoryStillCounts", func(f *fixture) {
		g := f.g(0)
		hs := f.fill(0)
		base := f.reserve(roundUp(2*g, f.gran))
		// The chunk is mapped twice; its memory returns with the last.
		f.mapAt(base, hs[0])
		f.mapAt(at(base, g), hs[0])
		require.NoError(f.t, f.d.Release(hs[0]))
		f.requireFull(0)
		f.unmap(base, g)
		f.requireFull(0)
		f.unmap(at(base, g), g)
		f.create(0, g)
		f.requireFull(0)
	})
	s.run(t, "HandleIsDead", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		h := f.mapNew(base, 0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		f.requireIs(f.d.Map(at(base, f.gran), h), driver.ErrBadHandle)
		f.requireNotMapped(at(base, f.gran))
		f.requireIs(f.d.Release(h), driver.ErrBadHandle)
		f.requireNone(base)
	})
}

// aliasing checks that one chunk mapped at two addresses is one memory, with
// access kept per mapping (CUDA virtual aliasing).
func (s suite) aliasing(t *testing.T) {
	// aliased maps one chunk at granule 0 of one reservation and granule 1
	// of another.
	aliased := func(f *fixture) (a, b driver.Addr, h driver.Handle) {
		a = f.reserve(f.gran)
		b = at(f.reserve(2*f.gran), f.gran)
		h = f.create(0, f.gran)
		f.mapAt(a, h)
		f.mapAt(b, h)
		return a, b, h
	}
	s.run(t, "AccessPerMapping", func(f *fixture) {
		a, b, _ := aliased(f)
		f.requireNone(a)
		f.requireNone(b)
		f.setAccess(a, f.gran, 0, driver.AccessReadWrite)
		f.requireOnly(a, 0, driver.AccessReadWrite)
		f.requireNone(b)
		f.setAccess(b, f.gran, 1, driver.AccessRead)
		f.requireOnly(a, 0, driver.AccessReadWrite)
		f.requireOnly(b, 1, driver.AccessRead)
	})
	s.run(t, "SameBytes", func(f *fixture) {
		if !f.hostAccess() {
			f.t.Skip("the driver has no host access: aliasing is checked through Access only")
		}
		a, b, _ := aliased(f)
		f.setAccess(a, f.gran, 0, driver.AccessReadWrite)
		f.setAccess(b, f.gran, 0, driver.AccessReadWrite)
		one, two := pattern(probe, 4), pattern(probe, 5)
		f.write(a, one)
		f.requireBytes(b, one)
		f.write(at(b, f.gran-probe), two)
		f.requireBytes(at(a, f.gran-probe), two)
	})
	s.run(t, "UnmapOneKeepsOther", func(f *fixture) {
		a, b, h := aliased(f)
		f.setAccess(b, f.gran, 0, driver.AccessReadWrite)
		data := pattern(probe, 6)
		if f.hostAccess() {
			f.setAccess(a, f.gran, 0, driver.AccessReadWrite)
			f.write(a, data)
		}
		f.unmap(a, f.gran)
		require.NoError(f.t, f.d.Release(h))
		f.requireNotMapped(a)
		f.requireOnly(b, 0, driver.AccessReadWrite)
		if f.hostAccess() {
			f.requireBytes(b, data)
		}
	})
}
