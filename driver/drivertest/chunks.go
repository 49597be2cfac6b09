package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// create checks Create: its argument checks, and that it commits memory
// against each device's capacity separately.
func (s suite) create(t *testing.T) {
	s.run(t, "NoDevice", func(f *fixture) {
		for _, dev := range []driver.DeviceID{-1, driver.DeviceID(len(f.devs)), driver.MaxDevices} {
			_, err := f.d.Create(dev, f.gran, driver.ChunkOptions{})
			f.requireIs(err, driver.ErrNoDevice)
		}
		f.create(0, f.gran)
	})
	s.run(t, "ZeroSize", func(f *fixture) {
		_, err := f.d.Create(0, 0, driver.ChunkOptions{})
		f.requireIs(err, driver.ErrInvalid)
		f.create(0, f.gran)
	})
	s.run(t, "SizeNotMultipleOfGranularity", func(f *fixture) {
		for i := range f.devs {
			dev := driver.DeviceID(i)
			g := f.g(dev)
			for _, size := range []uint64{g / 2, g + g/2} {
				_, err := f.d.Create(dev, size, driver.ChunkOptions{})
				f.requireIs(err, driver.ErrMisaligned, units.Bytes(g))
			}
			f.create(dev, g)
		}
	})
	s.run(t, "LargerThanCapacity", func(f *fixture) {
		for i := range f.devs {
			dev := driver.DeviceID(i)
			d := f.devs[dev]
			_, err := f.d.Create(dev, roundUp(d.Capacity+1, d.MinGranularity), driver.ChunkOptions{})
			f.requireIs(err, driver.ErrOutOfMemory)
			// Nothing was committed: the whole capacity is still there (one
			// granule where the capacity is too large to commit in a test).
			size := d.MinGranularity
			if d.Capacity <= 64*d.MinGranularity {
				size = d.Capacity / d.MinGranularity * d.MinGranularity
			}
			f.create(dev, size)
		}
	})
	s.run(t, "FillToCapacity", func(f *fixture) {
		hs := f.fill(0)
		// A refused Create changed nothing: the device is exactly as full.
		f.requireFull(0)
		require.NoError(f.t, f.d.Release(hs[len(hs)-1]))
		f.create(0, f.g(0))
		f.requireFull(0)
	})
	s.run(t, "FullDeviceLeavesOthers", func(f *fixture) {
		f.fill(0)
		for i := 1; i < len(f.devs); i++ {
			f.fill(driver.DeviceID(i))
		}
		f.requireFull(0)
	})
	s.run(t, "Shareable", func(f *fixture) {
		opts := driver.ChunkOptions{Shareable: true}
		if !f.d.Supports(driver.FeatureShareable) {
			_, err := f.d.Create(0, f.gran, opts)
			f.requireIs(err, driver.ErrUnsupported)
			f.create(0, f.gran)
			return
		}
		f.has(1)
		base := f.reserve(2 * f.gran)
		for i := range 2 {
			dev := driver.DeviceID(i)
			a := at(base, uint64(i)*f.gran)
			h, err := f.d.Create(dev, f.gran, opts)
			require.NoError(f.t, err, "create a shareable chunk on device %d", dev)
			f.mapAt(a, h)
			f.requireNone(a)
			f.setAccess(a, f.gran, dev, driver.AccessReadWrite)
			f.requireOnly(a, dev, driver.AccessReadWrite)
			if f.hostAccess() {
				data := pattern(probe, byte(i+1))
				f.write(a, data)
				f.requireBytes(a, data)
			}
			f.unmap(a, f.gran)
			require.NoError(f.t, f.d.Release(h))
		}
	})
}

// release checks Release of handles that are not live.
func (s suite) release(t *testing.T) {
	s.run(t, "Twice", func(f *fixture) {
		h := f.create(0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		f.requireIs(f.d.Release(h), driver.ErrBadHandle)
	})
	s.run(t, "TwiceAfterNewChunks", func(f *fixture) {
		// A released handle stays refused once new chunks are created:
		// a driver that reuses its records must not give the old handle
		// back to a new chunk.
		h := f.create(0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		h2 := f.create(0, f.gran)
		require.NotEqual(f.t, h, h2, "a released handle issued again")
		f.requireIs(f.d.Release(h), driver.ErrBadHandle)
		base := f.reserve(f.gran)
		f.requireIs(f.d.Map(base, h), driver.ErrBadHandle)
		f.requireNotMapped(base)
		f.mapAt(base, h2)
		f.unmap(base, f.gran)
		require.NoError(f.t, f.d.Release(h2))
	})
	s.run(t, "ZeroHandle", func(f *fixture) {
		h := f.create(0, f.gran)
		f.requireIs(f.d.Release(0), driver.ErrBadHandle)
		// The live chunk is untouched.
		base := f.reserve(f.gran)
		f.mapAt(base, h)
		f.requireNone(base)
	})
	s.run(t, "NeverIssued", func(f *fixture) {
		h := f.create(0, f.gran)
		for _, bad := range []driver.Handle{h + 1, h + 1000, ^driver.Handle(0)} {
			f.requireIs(f.d.Release(bad), driver.ErrBadHandle)
		}
		base := f.reserve(f.gran)
		f.mapAt(base, h)
		f.unmap(base, f.gran)
		require.NoError(f.t, f.d.Release(h))
	})
}
