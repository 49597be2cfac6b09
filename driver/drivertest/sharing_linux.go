package drivertest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
)

// The rules of shared descriptors (driver.HandlePOSIXFD), which other
// processes hold with every file operation they allow:
//
//   - an exported descriptor cannot be resized, shrunk or grown: a smaller
//     file would take the memory from under every process's mappings;
//   - Import refuses, with ErrInvalid, a descriptor that could be resized
//     (a memory file without seals), one of another size than the handle
//     says, and one that is no memory at all; it keeps nothing of it, and
//     the caller's descriptor stays open (the caller closes it).

// closeLater closes x's descriptor when the test ends.
func (f *fixture) closeLater(x driver.Shareable) {
	if x.Type == driver.HandlePOSIXFD {
		f.t.Cleanup(func() { _ = unix.Close(x.FD) })
	}
}

// posixFD skips drivers whose chunks do not travel as descriptors.
func (f *fixture) posixFD(sh driver.Sharing) {
	f.t.Helper()
	x, err := sh.Export(f.createShareable(0, f.gran))
	require.NoError(f.t, err)
	f.closeLater(x)
	if x.Type != driver.HandlePOSIXFD {
		f.t.Skipf("%s shares chunks as handle type %d, not descriptors", f.d.Name(), x.Type)
	}
}

// openFDs counts this process's open descriptors.
func (f *fixture) openFDs() int {
	f.t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(f.t, err)
	return len(es) - 1 // the directory read itself holds one
}

func (s suite) sharingDescriptors(t *testing.T) {
	s.run(t, "ExportedCannotResize", func(f *fixture) {
		sh := f.sharer()
		f.posixFD(sh)
		size := 2 * f.g(0)
		h := f.createShareable(0, size)
		base := f.reserve(roundUp(size, f.gran))
		f.mapAt(base, h)
		f.setAccess(base, size, 0, driver.AccessReadWrite)
		data := pattern(probe, 7)
		if f.hostAccess() {
			f.write(base, data)
			f.write(at(base, size-probe), data)
		}
		x := f.exported(sh, h)
		// The descriptor's own size is the driver's to choose (a memfd's
		// is the chunk's; CUDA's is 0 on an H100): the check is that no
		// resize takes.
		var before unix.Stat_t
		require.NoError(f.t, unix.Fstat(x.FD, &before))
		require.Error(f.t, unix.Ftruncate(x.FD, 0), "shrinking an exported descriptor")
		require.Error(f.t, unix.Ftruncate(x.FD, int64(size)-int64(f.g(0))), "shrinking it by a granule")
		require.Error(f.t, unix.Ftruncate(x.FD, 2*int64(size)), "growing it")
		var st unix.Stat_t
		require.NoError(f.t, unix.Fstat(x.FD, &st))
		require.Equal(f.t, before.Size, st.Size, "the exported file keeps its size")
		if f.hostAccess() {
			f.requireBytes(base, data)
			f.requireBytes(at(base, size-probe), data)
		}
		f.unmap(base, size)
		require.NoError(f.t, f.d.Release(h))
	})
	s.run(t, "ImportRefusals", func(f *fixture) {
		sh := f.sharer()
		f.posixFD(sh)
		g := f.g(1)
		memfd := func(size uint64, flags int, seals int) int {
			fd, err := unix.MemfdCreate("drivertest", unix.MFD_CLOEXEC|flags)
			require.NoError(f.t, err)
			f.t.Cleanup(func() { _ = unix.Close(fd) })
			require.NoError(f.t, unix.Ftruncate(fd, int64(size)))
			if seals != 0 {
				_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
				require.NoError(f.t, err)
			}
			return fd
		}
		resizable := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		file := func() int {
			fh, err := os.Create(filepath.Join(f.t.TempDir(), "chunk"))
			require.NoError(f.t, err)
			require.NoError(f.t, fh.Truncate(int64(g)))
			fd, err := unix.Dup(int(fh.Fd()))
			require.NoError(f.t, err)
			require.NoError(f.t, fh.Close())
			f.t.Cleanup(func() { _ = unix.Close(fd) })
			return fd
		}
		devnull := func() int {
			fd, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
			require.NoError(f.t, err)
			f.t.Cleanup(func() { _ = unix.Close(fd) })
			return fd
		}
		pipe := func() int {
			var p [2]int
			require.NoError(f.t, unix.Pipe2(p[:], unix.O_CLOEXEC))
			f.t.Cleanup(func() { _ = unix.Close(p[0]); _ = unix.Close(p[1]) })
			return p[0]
		}
		for _, c := range []struct {
			name string
			fd   int
			size uint64
		}{
			{"an unsealed memory file", memfd(g, unix.MFD_ALLOW_SEALING, 0), g},
			{"a memory file that cannot be sealed", memfd(g, 0, 0), g},
			{"a memory file sealed against shrinking only", memfd(g, unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), g},
			{"a memory file sealed against writes", memfd(g, unix.MFD_ALLOW_SEALING, resizable|unix.F_SEAL_WRITE), g},
			{"a sealed memory file of another size", memfd(g, unix.MFD_ALLOW_SEALING, resizable), 2 * g},
			{"a regular file on disk", file(), g},
			{"a character device", devnull(), g},
			{"a pipe", pipe(), g},
		} {
			fds, room := f.openFDs(), f.room(1)
			_, err := sh.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: c.fd, Size: c.size}, 1)
			f.requireIs(err, driver.ErrInvalid)
			require.Equal(f.t, fds, f.openFDs(), "%s: the driver keeps no descriptor of a refused import", c.name)
			require.Equal(f.t, room, f.room(1), "%s: a refused import changed nothing", c.name)
			_, err = unix.FcntlInt(uintptr(c.fd), unix.F_GETFD, 0)
			require.NoError(f.t, err, "%s: the caller's descriptor stays open", c.name)
		}
		// What a descriptor the driver did export looks like is the
		// driver's own business (the host driver's are sealed memfds, and
		// its tests import one made by hand); any other is refused above.
	})
}
