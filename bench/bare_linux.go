package bench

import (
	"io"
	"os"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"
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

// bareSharer is the IPC share's bare baseline: a SOCK_SEQPACKET socket
// pair and a PROT_NONE reservation of the receiver's, as large as the
// largest chunk shared.
type bareSharer struct {
	fds  [2]int
	res  unsafe.Pointer
	size uint64
}

func newBareSharer(size uint64) (*bareSharer, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errors.Wrap(err, "bench: socketpair")
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "bench: reserve"), errors.CombineErrors(unix.Close(fds[0]), unix.Close(fds[1])))
	}
	return &bareSharer{fds: fds, res: p, size: size}, nil
}

func (s *bareSharer) close() error {
	return errors.CombineErrors(unix.MunmapPtr(s.res, uintptr(s.size)),
		errors.CombineErrors(unix.Close(s.fds[0]), unix.Close(s.fds[1])))
}

// share does, untimed, what the library's share does before its clock
// starts — a sealed memfd of sz bytes, mapped and written a byte a page,
// then before() — and then times the system calls the host driver and
// the ipc package make to share it: dup (export), sendmsg of the
// descriptor, recvmsg, fstat and F_GET_SEALS (the import's checks), dup
// (the imported chunk's own descriptor), mmap MAP_FIXED over the
// reservation, mprotect read-write. Everything is closed and the
// reservation restored afterwards.
func (s *bareSharer) share(sz uint64, before func()) (d time.Duration, err error) {
	if sz > s.size {
		return 0, errors.AssertionFailedf("bench: a bare share of %d bytes in a reservation of %d", sz, s.size)
	}
	fd, err := unix.MemfdCreate("vmarena-bench-share", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return 0, errors.Wrap(err, "bench: memfd")
	}
	var closes []int
	defer func() {
		for _, c := range append(closes, fd) {
			err = errors.CombineErrors(err, unix.Close(c))
		}
	}()
	if err := fallocate(fd, 0, sz); err != nil {
		return 0, errors.Wrap(err, "bench: fallocate")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return 0, errors.Wrap(err, "bench: seal")
	}
	src, err := unix.Mmap(fd, 0, int(sz), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, errors.Wrap(err, "bench: map the sender's memfd")
	}
	defer func() { err = errors.CombineErrors(err, unix.Munmap(src)) }()
	touchPages(src)
	before()

	t0 := time.Now()
	exp, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, errors.Wrap(err, "bench: export")
	}
	closes = append(closes, exp)
	if err := unix.Sendmsg(s.fds[0], []byte{1}, unix.UnixRights(exp), nil, 0); err != nil {
		return 0, errors.Wrap(err, "bench: sendmsg")
	}
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(s.fds[1], buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return 0, errors.Wrap(err, "bench: recvmsg")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return 0, errors.Newf("bench: recvmsg: %d control messages (%v)", len(msgs), err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	closes = append(closes, got...)
	if err != nil || len(got) != 1 {
		return 0, errors.Newf("bench: recvmsg: %d descriptors (%v)", len(got), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(got[0], &st); err != nil || uint64(st.Size) != sz {
		return 0, errors.Newf("bench: fstat: %d bytes (%v)", st.Size, err)
	}
	if _, err := unix.FcntlInt(uintptr(got[0]), unix.F_GET_SEALS, 0); err != nil {
		return 0, errors.Wrap(err, "bench: F_GET_SEALS")
	}
	own, err := unix.FcntlInt(uintptr(got[0]), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, errors.Wrap(err, "bench: import's dup")
	}
	closes = append(closes, own)
	if _, err := unix.MmapPtr(own, 0, s.res, uintptr(sz), unix.PROT_NONE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return 0, errors.Wrap(err, "bench: map")
	}
	mem := unsafe.Slice((*byte)(s.res), sz)
	err = unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE)
	d = time.Since(t0)
	if err == nil && (mem[0] != src[0] || mem[sz-1] != src[sz-1]) {
		err = errors.AssertionFailedf("bench: the bare receiver does not see the sender's bytes")
	}
	if _, uerr := unix.MmapPtr(-1, 0, s.res, uintptr(sz), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED); uerr != nil {
		err = errors.CombineErrors(err, errors.Wrap(uerr, "bench: unmap"))
	}
	if err != nil {
		return 0, errors.Wrap(err, "bench: mprotect")
	}
	return d, nil
}
