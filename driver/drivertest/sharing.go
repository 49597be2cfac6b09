package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// sharing checks driver.Sharing: which chunks may be exported and how
// often, and what an import refuses. The rules on descriptors themselves
// (an exported one cannot be resized; an import refuses one that could be,
// or of the wrong size, or no memory at all) are in sharing_linux.go.
// Drivers without Sharing (sim) skip.
func (s suite) sharing(t *testing.T) {
	s.run(t, "ExportNotShareable", func(f *fixture) {
		sh := f.sharer()
		h := f.create(0, f.gran)
		room := f.room(0)
		_, err := sh.Export(h)
		f.requireIs(err, driver.ErrInvalid, "Shareable")
		require.Equal(f.t, room, f.room(0), "a refused export changed nothing")
		f.exported(sh, f.createShareable(0, f.gran)) // a shareable one exports
	})
	s.run(t, "ExportTwice", func(f *fixture) {
		sh := f.sharer()
		h := f.createShareable(0, f.gran)
		f.exported(sh, h)
		_, err := sh.Export(h)
		f.requireIs(err, driver.ErrBusy, "exported already")
	})
	s.run(t, "ExportReleased", func(f *fixture) {
		sh := f.sharer()
		h := f.createShareable(0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		_, err := sh.Export(h)
		f.requireIs(err, driver.ErrBadHandle)
	})
	s.run(t, "ImportWrongType", func(f *fixture) {
		sh := f.sharer()
		x := f.exported(sh, f.createShareable(0, f.gran))
		x.Type = driver.HandleToken + driver.HandlePOSIXFD - x.Type // the other one
		room := f.room(1)
		_, err := sh.Import(x, 1)
		f.requireIs(err, driver.ErrInvalid, "handle type")
		require.Equal(f.t, room, f.room(1), "a refused import changed nothing")
	})
	s.run(t, "ImportWrongSize", func(f *fixture) {
		sh := f.sharer()
		x := f.exported(sh, f.createShareable(0, 2*f.g(0)))
		for _, size := range []uint64{f.g(0), 4 * f.g(0)} {
			room := f.room(1)
			bad := x
			bad.Size = size
			_, err := sh.Import(bad, 1)
			f.requireIs(err, driver.ErrInvalid)
			require.Equal(f.t, room, f.room(1), "a refused import changed nothing")
		}
	})
	s.run(t, "ImportUnknownHandle", func(f *fixture) {
		sh := f.sharer()
		x := f.exported(sh, f.createShareable(0, f.gran))
		if x.Type != driver.HandleToken {
			f.t.Skipf("%s shares descriptors: ImportRefusals covers them", f.d.Name())
		}
		room := f.room(1)
		bad := x
		bad.Token ^= 0x5a5a5a5a5a5a5a5a
		_, err := sh.Import(bad, 1)
		f.requireIs(err, driver.ErrInvalid)
		require.Equal(f.t, room, f.room(1), "a refused import changed nothing")
	})
	s.run(t, "ImportOwnExport", func(f *fixture) {
		sh := f.sharer()
		size := f.g(0)
		h := f.createShareable(0, size)
		x := f.exported(sh, h)
		f.has(1)
		if f.devs[1].MinGranularity > size {
			f.t.Skip("device 1's granularity is larger than device 0's")
		}
		imp, err := sh.Import(x, 1)
		require.NoError(f.t, err)
		base := f.reserve(2 * f.gran)
		f.mapAt(base, h)
		impAt := at(base, f.gran)
		if f.oneDevice {
			// An imported chunk of another device beside local memory: a
			// driver whose reservations bind one device refuses it.
			f.requireIs(f.d.Map(impAt, imp), driver.ErrUnsupported, "imported")
			f.requireNotMapped(impAt)
			impAt = f.reserve(f.gran)
		}
		f.mapAt(impAt, imp)
		f.setAccess(base, size, 0, driver.AccessReadWrite)
		f.setAccess(impAt, size, 1, driver.AccessReadWrite)
		if f.hostAccess() {
			// A token this process exported (AscendCL) cannot be imported
			// by it: the driver makes the import a chunk over the same
			// memory, and it is one memory all the same.
			data := pattern(probe, 9)
			f.write(base, data)
			f.requireBytes(impAt, data) // one memory, two chunks
		}
		f.unmap(base, size)
		f.unmap(impAt, size)
		require.NoError(f.t, f.d.Release(h))
		require.NoError(f.t, f.d.Release(imp))
	})
	s.sharingDescriptors(t)
}

// sharer returns the driver's Sharing, skipping drivers without it.
func (f *fixture) sharer() driver.Sharing {
	f.t.Helper()
	sh, ok := f.d.(driver.Sharing)
	if !ok || !f.d.Supports(driver.FeatureShareable) {
		f.t.Skipf("%s does not share chunks between processes", f.d.Name())
	}
	return sh
}

// createShareable creates a shareable chunk of size bytes on dev.
func (f *fixture) createShareable(dev driver.DeviceID, size uint64) driver.Handle {
	f.t.Helper()
	h, err := f.d.Create(dev, size, driver.ChunkOptions{Shareable: true})
	require.NoError(f.t, err, "create a shareable chunk on device %d", dev)
	return h
}

// exported exports h; its descriptor, if any, is closed when the test
// ends.
func (f *fixture) exported(sh driver.Sharing, h driver.Handle) driver.Shareable {
	f.t.Helper()
	x, err := sh.Export(h)
	require.NoError(f.t, err, "export chunk %d", h)
	f.closeLater(x)
	return x
}

// room counts how many chunks of dev's minimum granularity still fit on
// dev (creating and releasing them), or returns -1 when the device holds
// more than 64 of them and counting would be slow: what a refused call
// must leave as it was.
func (f *fixture) room(dev driver.DeviceID) int {
	f.t.Helper()
	f.has(dev)
	d := f.devs[dev]
	if d.Capacity > 64*d.MinGranularity {
		return -1
	}
	var hs []driver.Handle
	for {
		h, err := f.d.Create(dev, d.MinGranularity, driver.ChunkOptions{})
		if err != nil {
			f.requireIs(err, driver.ErrOutOfMemory)
			break
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		require.NoError(f.t, f.d.Release(h))
	}
	return len(hs)
}
