package bench

import (
	"io"
	"os"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"
)

// The bare baselines' system calls, Linux's (memfd, fallocate,
// MADV_POPULATE): bare_other.go answers ErrUnsupported elsewhere.

// bareRegion is the baseline's own memfd and PROT_NONE reservation.
type bareRegion struct {
	fd   int
	base unsafe.Pointer
	size uint64
}

func newBareRegion(size uint64) (*bareRegion, error) {
	fd, err := unix.MemfdCreate("vmarena-bench-bare", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return &bareRegion{fd: fd, base: p, size: size}, nil
}

func (r *bareRegion) close() error {
	return errors.CombineErrors(unix.MunmapPtr(r.base, uintptr(r.size)), unix.Close(r.fd))
}

// mapAccessUnmap is MapAccessUnmap's bare operation: mmap MAP_FIXED of
// the memfd, mprotect, madvise populate when populate is on, and mmap
// MAP_FIXED of anonymous PROT_NONE to re-reserve.
func (r *bareRegion) mapAccessUnmap(populate bool) error {
	if _, err := unix.MmapPtr(r.fd, 0, r.base, uintptr(ChunkSize), unix.PROT_NONE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return err
	}
	mem := unsafe.Slice((*byte)(r.base), ChunkSize)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		return err
	}
	if populate {
		if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
			return err
		}
	}
	_, err := unix.MmapPtr(-1, 0, r.base, uintptr(ChunkSize), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED)
	return err
}

// growStep is GrowStep's bare operation, the calls one chunk of arena
// growth makes on the host driver: fallocate of the chunk (create), mmap
// MAP_FIXED of it over the reservation (map), mprotect read-write and
// madvise(MADV_POPULATE_WRITE) (grant, with the host driver's populate).
func (r *bareRegion) growStep() error {
	if err := fallocate(r.fd, 0, ChunkSize); err != nil {
		return err
	}
	if _, err := unix.MmapPtr(r.fd, 0, r.base, uintptr(ChunkSize), unix.PROT_NONE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return err
	}
	mem := unsafe.Slice((*byte)(r.base), ChunkSize)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		return err
	}
	return unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
}

// undoStep gives growStep's chunk back: the reservation is restored over
// it and its memory punched out of the memfd.
func (r *bareRegion) undoStep() error {
	if _, err := unix.MmapPtr(-1, 0, r.base, uintptr(ChunkSize), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED); err != nil {
		return err
	}
	return fallocate(r.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, ChunkSize)
}

// commit commits the region's first ChunkSize bytes.
func (r *bareRegion) commit() error { return fallocate(r.fd, 0, ChunkSize) }

// commitPunch is CreateRelease's bare operation: fallocate, then
// fallocate(PUNCH_HOLE).
func (r *bareRegion) commitPunch() error {
	if err := fallocate(r.fd, 0, ChunkSize); err != nil {
		return err
	}
	return fallocate(r.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, ChunkSize)
}

// bareReserveFree is ReserveFree's bare operation: mmap(PROT_NONE,
// MAP_NORESERVE) and munmap.
func bareReserveFree(size uint64) error {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return err
	}
	return unix.MunmapPtr(p, uintptr(size))
}

func fallocate(fd int, mode uint32, size uint64) error {
	for {
		if err := unix.Fallocate(fd, mode, 0, int64(size)); err != unix.EINTR {
			return err
		}
	}
}

// streamCopier is the copy baseline: a SOCK_STREAM socket pair, a source
// buffer, and a goroutine that reads whatever is asked of it into dst.
type streamCopier struct {
	fds      [2]int
	src, dst []byte
	ask      chan []byte
	done     chan error
}

func newStreamCopier(size uint64) (*streamCopier, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errors.Wrap(err, "bench: socketpair")
	}
	cp := &streamCopier{fds: fds, src: make([]byte, size), dst: make([]byte, size), ask: make(chan []byte), done: make(chan error)}
	page := os.Getpagesize()
	for i := range min(len(cp.src), page) {
		cp.src[i] = byte(i * 7)
	}
	for n := page; n < len(cp.src); n *= 2 {
		copy(cp.src[n:], cp.src[:n])
	}
	for i := 0; i < len(cp.dst); i += page {
		cp.dst[i] = 1 // touched: the baseline takes no page faults
	}
	go cp.read()
	return cp, nil
}

// read fills each buffer asked for from the socket.
func (cp *streamCopier) read() {
	for into := range cp.ask {
		var err error
		for n := 0; n < len(into) && err == nil; {
			k, rerr := unix.Read(cp.fds[1], into[n:min(n+int(ipcCopyPiece), len(into))])
			switch {
			case rerr == unix.EINTR:
			case rerr != nil:
				err = errors.Wrap(rerr, "bench: read the copy")
			case k == 0:
				err = errors.Wrap(io.ErrUnexpectedEOF, "bench: read the copy")
			default:
				n += k
			}
		}
		cp.done <- err
	}
}

// copy times writing src and the reader's having read it all into dst.
func (cp *streamCopier) copy() (time.Duration, error) {
	t0 := time.Now()
	cp.ask <- cp.dst
	var werr error
	for n := 0; n < len(cp.src); {
		k, err := unix.Write(cp.fds[0], cp.src[n:min(n+int(ipcCopyPiece), len(cp.src))])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// Unblock the reader before waiting for it.
			werr = errors.CombineErrors(errors.Wrap(err, "bench: write the copy"), unix.Shutdown(cp.fds[0], unix.SHUT_WR))
			break
		}
		n += k
	}
	rerr := <-cp.done
	return time.Since(t0), errors.CombineErrors(werr, rerr)
}

func (cp *streamCopier) close() error {
	close(cp.ask)
	return errors.CombineErrors(unix.Close(cp.fds[0]), unix.Close(cp.fds[1]))
}
