package ipc

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/pool"
)

// The Linux side of a connection: SOCK_SEQPACKET Unix sockets, the peer's
// credentials from SO_PEERCRED, descriptors passed with SCM_RIGHTS.

// Listen creates a socket at path (which must not exist) that only users
// the permissions perm admit can connect to (0o600: this user alone).
// Connecting needs write permission, so a perm that grants it to no one
// is ErrInvalid, as is a path no Unix socket can have (empty, over 107
// bytes, holding a NUL, or an abstract name starting with @). A failure of
// the socket keeps the operating system's error (a path in use:
// syscall.EADDRINUSE; a directory that does not exist: os.ErrNotExist).
func Listen(path string, perm os.FileMode) (*Listener, error) {
	if err := checkPath("listen on", path); err != nil {
		return nil, err
	}
	if perm&^os.ModePerm != 0 || perm&0o222 == 0 {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "ipc: listen on %s: mode %v: permission bits alone, with write for someone, as connecting needs it", path, perm),
			"0o600 lets this user alone connect")
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, osError(err, "ipc: listen on %s", path)
	}
	if err := os.Chmod(path, perm); err != nil {
		_ = l.Close()
		return nil, errors.Wrapf(err, "ipc: set permissions of %s", path)
	}
	return &Listener{l: l, path: path}, nil
}

// Accept waits for a connection. After Close it is ErrClosed.
func (l *Listener) Accept() (*Conn, error) {
	if err := l.made("accept"); err != nil {
		return nil, err
	}
	c, err := l.l.AcceptUnix()
	if err != nil {
		return nil, osError(err, "ipc: accept on %s", l.path)
	}
	return newConn(c, l.path)
}

// Dial connects to a listener's path. A path no Unix socket can have is
// ErrInvalid (see Listen); a failure to connect keeps the operating
// system's error: no such path is os.ErrNotExist (syscall.ENOENT), a
// socket nobody listens on syscall.ECONNREFUSED.
func Dial(path string) (*Conn, error) {
	if err := checkPath("dial", path); err != nil {
		return nil, err
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, osError(err, "ipc: dial %s", path)
	}
	return newConn(c, path)
}

// newConn reads the peer's credentials and takes a pidfd of the peer
// process, at once: see peerProc. path is the socket's.
func newConn(c *net.UnixConn, path string) (*Conn, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		_ = c.Close()
		return nil, errors.Wrapf(err, "ipc: connection on %s", path)
	}
	var cred *unix.Ucred
	var cerr error
	pidfd := -1
	if err := raw.Control(func(fd uintptr) {
		if cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr == nil {
			pidfd = openPidfd(int(fd), int(cred.Pid))
		}
	}); err != nil || cerr != nil {
		_ = c.Close()
		return nil, errors.Wrapf(errors.CombineErrors(err, cerr), "ipc: connection on %s: reading the peer's credentials (SO_PEERCRED)", path)
	}
	conn := &Conn{c: c, path: path, pid: int(cred.Pid), uid: int(cred.Uid),
		holder: pool.NewImportHolder(fmt.Sprintf("the ipc connection to process %d on %s", cred.Pid, path))}
	conn.peer.pid, conn.peer.pidfd = int(cred.Pid), pidfd
	return conn, nil
}

// ended reports whether a read or write error means the connection is
// over: the peer closed it, or died, or this end was closed.
func ended(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)
}

// peerProc is the process at the other end, watched through a pidfd
// taken when the connection was made: it becomes readable when that
// process exits, and it names that process alone, so a PID the kernel
// reuses later cannot be mistaken for it. The pidfd comes from
// SO_PEERPIDFD (Linux 6.5), which the kernel takes at connect time: no
// race at all. Before 6.5, from pidfd_open(PID) right after accept or
// connect: a peer that died and whose PID was reused in that instant would
// be mistaken for the new process — which errs on the side of holding its
// imports, never of releasing them early. Without pidfds (before Linux
// 5.3) the PID's absence (kill(pid, 0) says ESRCH) tells that the peer
// exited; a reused PID again only holds longer.
type peerProc struct {
	pid int
	// mu guards pidfd: polls read it, closing writes it.
	mu    lockrank.RWMutex[lockrank.IPCPeerProc]
	pidfd int // -1: none, or closed
}

// openPidfd returns a pidfd of the process pid at the other end of the
// socket sock, or -1 when the kernel offers none.
func openPidfd(sock, pid int) int {
	if fd, err := unix.GetsockoptInt(sock, unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
		return fd
	}
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		return fd
	}
	return -1
}

// exited reports whether the peer process has exited, waiting for it at
// most wait. (A zombie has exited: its memory and mappings are gone.)
func (p *peerProc) exited(wait time.Duration) (bool, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	deadline := time.Now().Add(wait)
	if p.pidfd < 0 {
		for {
			if err := unix.Kill(p.pid, 0); err == unix.ESRCH {
				return true, nil
			}
			if !time.Now().Before(deadline) {
				return false, nil
			}
			time.Sleep(min(5*time.Millisecond, time.Until(deadline)))
		}
	}
	for {
		fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(max(0, time.Until(deadline).Milliseconds())))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return false, errors.Wrapf(err, "ipc: poll of the pidfd of process %d", p.pid)
		}
		return n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0, nil
	}
}

// close closes the pidfd; exited then answers from the PID alone.
func (p *peerProc) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// send writes one message, passing fds with it.
func (c *Conn) send(kind Kind, htype driver.HandleType, payload []byte, fds ...int) error {
	if len(payload) > MaxPayload {
		return errors.Wrapf(driver.ErrInvalid, "ipc: a %s message of %d bytes is over the %d-byte limit", kind, len(payload), MaxPayload)
	}
	msg := append(header{kind: kind, htype: htype, nfds: uint8(len(fds)), payload: uint32(len(payload))}.encode(), payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		if ended(err) { // the peer has gone, or this end was closed
			return sentinel.Mark(osError(err, "ipc: send %s to process %d on %s: the connection ended", kind, c.pid, c.path), driver.ErrClosed)
		}
		return osError(err, "ipc: send %s to process %d on %s", kind, c.pid, c.path)
	}
	if n != len(msg) || oobn != len(oob) {
		return errors.Newf("ipc: send %s: wrote %d of %d bytes, %d of %d control bytes", kind, n, len(msg), oobn, len(oob))
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// recv reads one message and checks its framing; on any error every
// descriptor that came with it is closed.
func (c *Conn) recv() (*message, error) {
	buf := make([]byte, headerSize+MaxPayload+1)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	return c.parse(buf, oob, n, oobn, flags, err)
}

// recvQueued reads one message the peer has sent already, without
// waiting: ok is false when none is queued (or the connection ended). It
// checks the framing as recv does.
func (c *Conn) recvQueued() (m *message, ok bool, err error) {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return nil, false, osError(err, "ipc: receive from process %d on %s", c.pid, c.path)
	}
	buf := make([]byte, headerSize+MaxPayload+1)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	var n, oobn, flags int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		return true // never wait for more
	}); err != nil {
		return nil, false, osError(err, "ipc: receive from process %d on %s", c.pid, c.path)
	}
	if errors.Is(rerr, unix.EAGAIN) {
		return nil, false, nil
	}
	m, err = c.parse(buf, oob, n, oobn, flags, rerr)
	if errors.Is(err, driver.ErrClosed) {
		return nil, false, nil
	}
	return m, err == nil, err
}

// parse checks the framing of a message read into buf (n bytes) and oob
// (oobn bytes) with flags, or the read's error rerr; on any error every
// descriptor that came with it is closed.
func (c *Conn) parse(buf, oob []byte, n, oobn, flags int, err error) (*message, error) {
	var fds []int
	if oobn > 0 {
		if cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, cm := range cmsgs {
				if got, rerr := unix.ParseUnixRights(&cm); rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	fail := func(format string, args ...any) (*message, error) {
		closeAll(fds)
		return nil, sentinel.Mark(errors.Newf("ipc: receive: "+format, args...), ErrProtocol)
	}
	if err != nil {
		closeAll(fds)
		if ended(err) {
			return nil, sentinel.Mark(osError(err, "ipc: receive from process %d on %s: the connection ended", c.pid, c.path), driver.ErrClosed)
		}
		return nil, osError(err, "ipc: receive from process %d on %s", c.pid, c.path)
	}
	switch {
	case n == 0:
		closeAll(fds)
		return nil, errors.Wrapf(driver.ErrClosed, "ipc: receive from process %d on %s: the peer closed the connection", c.pid, c.path)
	case flags&unix.MSG_CTRUNC != 0:
		return fail("more descriptors than any message carries (control data truncated)")
	case flags&unix.MSG_TRUNC != 0 || n > headerSize+MaxPayload:
		return fail("a message over %d bytes (oversized)", headerSize+MaxPayload)
	case n < headerSize:
		return fail("%d bytes, shorter than the %d-byte header (truncated)", n, headerSize)
	case [3]byte(buf[:3]) != magic || buf[3] != version:
		return fail("bad magic or version %q", buf[:4])
	}
	h := header{kind: Kind(buf[4]), htype: driver.HandleType(buf[5]), nfds: buf[6], payload: binary.LittleEndian.Uint32(buf[8:])}
	if int(h.payload) != n-headerSize {
		return fail("the header announces %d payload bytes, %d came (truncated or padded)", h.payload, n-headerSize)
	}
	if int(h.nfds) != len(fds) {
		return fail("the header announces %d descriptors, %d came", h.nfds, len(fds))
	}
	return &message{header: h, body: buf[headerSize:n], fds: fds}, nil
}
