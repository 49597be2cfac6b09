package drivertest

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
)

// hostAccess checks Read and Write: they move bytes only where access was
// granted, or answer ErrUnsupported on drivers without FeatureHostAccess.
func (s suite) hostAccess(t *testing.T) {
	// host runs fn as a subtest only on drivers with host access.
	host := func(name string, fn func(f *fixture)) {
		t.Helper()
		s.run(t, name, func(f *fixture) {
			if !f.hostAccess() {
				f.t.Skipf("%s lacks %s (checked by Unsupported)", f.d.Name(), driver.FeatureHostAccess)
			}
			fn(f)
		})
	}
	s.run(t, "Unsupported", func(f *fixture) {
		if f.hostAccess() {
			f.t.Skipf("%s supports %s", f.d.Name(), driver.FeatureHostAccess)
		}
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		f.requireIs(f.d.Read(base, make([]byte, probe)), driver.ErrUnsupported)
		f.requireIs(f.d.Write(base, pattern(probe, 1)), driver.ErrUnsupported)
		f.requireOnly(base, 0, driver.AccessReadWrite)
	})
	host("ReservedOnlyDenied", func(f *fixture) {
		base := f.reserve(f.gran)
		f.requireIs(f.d.Read(base, make([]byte, probe)), driver.ErrAccessDenied)
		f.requireIs(f.d.Write(base, pattern(probe, 1)), driver.ErrAccessDenied)
		f.requireNotMapped(base)
	})
	host("NoAccessDenied", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.requireIs(f.d.Read(base, make([]byte, probe)), driver.ErrAccessDenied)
		f.requireIs(f.d.Write(base, pattern(probe, 1)), driver.ErrAccessDenied)
		f.requireNone(base)
		// Access taken away again denies as well, and a refused write
		// leaves the bytes as they were.
		before := pattern(probe, 2)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		f.write(base, before)
		f.setAccess(base, f.gran, 0, driver.AccessNone)
		f.requireIs(f.d.Read(base, make([]byte, probe)), driver.ErrAccessDenied)
		f.requireIs(f.d.Write(base, pattern(probe, 3)), driver.ErrAccessDenied)
		f.setAccess(base, f.gran, 0, driver.AccessRead)
		f.requireBytes(base, before)
	})
	host("WriteToReadOnlyDenied", func(f *fixture) {
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		before := pattern(probe, 2)
		f.write(base, before)
		f.setAccess(base, f.gran, 0, driver.AccessRead)
		f.requireIs(f.d.Write(base, pattern(probe, 3)), driver.ErrAccessDenied)
		f.requireBytes(base, before)
		f.requireOnly(base, 0, driver.AccessRead)
	})
	host("RoundTrip", func(f *fixture) {
		// Two adjacent mappings of chunks on different devices (where the
		// driver allows it); the last write crosses from one into the
		// other.
		base := f.reserve(2 * f.gran)
		f.mapNew(base, 0, f.gran)
		f.mapNew(at(base, f.gran), f.beside(1), f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		f.setAccess(at(base, f.gran), f.gran, 1, driver.AccessReadWrite)
		for i, off := range []uint64{0, 1, f.g(0) - probe, f.gran - probe, f.gran, 2*f.gran - probe, f.gran - probe/2} {
			data := pattern(probe, byte(10+i))
			f.write(at(base, off), data)
			f.requireBytes(at(base, off), data)
		}
	})
	host("PartlyAccessibleDenied", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		f.mapNew(base, 0, f.gran)
		f.mapNew(at(base, f.gran), 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		edge := at(base, f.gran-probe/2)
		before := pattern(probe/2, 4)
		f.write(edge, before)
		f.requireIs(f.d.Read(edge, make([]byte, probe)), driver.ErrAccessDenied)
		f.requireIs(f.d.Write(edge, pattern(probe, 5)), driver.ErrAccessDenied)
		f.requireBytes(edge, before)
	})
	host("OutsideReservation", func(f *fixture) {
		gone := f.unreserved(f.gran)
		f.requireIs(f.d.Read(gone, make([]byte, probe)), driver.ErrNotReserved)
		f.requireIs(f.d.Write(gone, pattern(probe, 5)), driver.ErrNotReserved)
		// A range running past the end of its reservation.
		base := f.reserve(f.gran)
		f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		tail := at(base, f.gran-probe/2)
		f.requireIs(f.d.Read(tail, make([]byte, probe)), driver.ErrNotReserved)
		f.requireIs(f.d.Write(tail, pattern(probe, 6)), driver.ErrNotReserved)
	})
	host("SurvivesRemap", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		h := f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		data := pattern(probe, 8)
		f.write(at(base, f.gran-probe), data)
		f.unmap(base, f.gran)
		for _, a := range []driver.Addr{base, at(base, f.gran)} {
			f.mapAt(a, h)
			f.setAccess(a, f.gran, 0, driver.AccessRead)
			f.requireBytes(at(a, f.gran-probe), data)
			f.unmap(a, f.gran)
		}
	})
}
