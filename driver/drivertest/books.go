package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// books checks the answers of a driver that keeps a record of its own
// (driver.Books), which the layers' Checks compare their books with:
// each follows Create, Map, Unmap, Release and Unreserve exactly. A driver
// without Books skips it.
func (s suite) books(t *testing.T) {
	s.run(t, "Answers", func(f *fixture) {
		b, ok := f.d.(driver.Books)
		if !ok {
			f.t.Skipf("the %s driver keeps no record it answers from (driver.Books)", f.d.Name())
		}
		g := f.gran // a multiple of every device's granularity
		base := f.reserve(4 * g)
		size, err := b.ReservationAt(base)
		require.NoError(f.t, err)
		require.Equal(f.t, 4*g, size)
		_, err = b.ReservationAt(base + driver.Addr(g))
		f.requireIs(err, driver.ErrNotReserved)

		h := f.create(0, g)
		dev, n, err := b.ChunkInfo(h)
		require.NoError(f.t, err)
		require.Equal(f.t, driver.DeviceID(0), dev)
		require.Equal(f.t, g, n)
		_, _, err = b.ChunkInfo(h + 1000)
		f.requireIs(err, driver.ErrBadHandle)

		count, bytes, err := b.Mapped(base, 4*g)
		require.NoError(f.t, err)
		require.Zero(f.t, count)
		require.Zero(f.t, bytes)
		_, _, err = b.MappingAt(base)
		f.requireIs(err, driver.ErrNotMapped)
		at := base + driver.Addr(2*g)
		f.mapAt(at, h)
		got, n, err := b.MappingAt(at)
		require.NoError(f.t, err)
		require.Equal(f.t, h, got)
		require.Equal(f.t, g, n)
		count, bytes, err = b.Mapped(base, 4*g)
		require.NoError(f.t, err)
		require.Equal(f.t, 1, count)
		require.Equal(f.t, g, bytes)
		count, _, err = b.Mapped(base, 2*g)
		require.NoError(f.t, err)
		require.Zero(f.t, count, "a range that ends where the mapping starts holds none")

		// Released while mapped: the handle is gone, the mapping stays.
		require.NoError(f.t, f.d.Release(h))
		_, _, err = b.ChunkInfo(h)
		f.requireIs(err, driver.ErrBadHandle)
		got, _, err = b.MappingAt(at)
		require.NoError(f.t, err)
		require.Equal(f.t, h, got)
		f.unmap(at, g)
		count, _, err = b.Mapped(base, 4*g)
		require.NoError(f.t, err)
		require.Zero(f.t, count)
		require.NoError(f.t, f.d.Unreserve(base, 4*g))
		_, err = b.ReservationAt(base)
		f.requireIs(err, driver.ErrNotReserved)
	})
}
