// Package ipc moves shareable chunks between processes: a serving engine
// listens on a Unix socket path, another process dials it, and chunks cross
// as file descriptors (SCM_RIGHTS) with a small typed header, so both
// processes map the same memory — no copy.
//
// Who may connect at all is the socket path's permissions (Listen sets
// them). Who may import a chunk is its allow-list (physical.Chunk.Export):
// the sender reads the peer's process ID from the kernel (SO_PEERCRED) and
// refuses anyone not on it — the peer gets an error message and no
// descriptor.
//
// Messages are SOCK_SEQPACKET packets, so each arrives whole with its
// descriptors: a 12-byte header (magic "VMA", version, kind, handle type,
// descriptor count, payload length) and a payload of at most MaxPayload
// bytes. A malformed, truncated or oversized message, a wrong handle type
// or descriptor count is an error, and every descriptor that came with it
// is closed: nothing leaks in either process.
//
// This package and the drivers are the only ones that talk to the kernel:
// it moves descriptors; it never maps memory itself.
package ipc

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
)

// ErrProtocol marks a message that breaks the wire format (bad magic or
// version, truncated, oversized, wrong descriptor count, unknown kind).
var ErrProtocol = errors.New("malformed message")

// Wire format.
const (
	headerSize = 12
	// MaxPayload is the largest payload a message may carry.
	MaxPayload = 4096
	version    = 1
	maxFDs     = 4 // room to notice a sender passing more than allowed
)

var magic = [3]byte{'V', 'M', 'A'}

// Kind is what a message carries.
type Kind uint8

const (
	KindChunk   Kind = 1 // a shareable chunk: payload size u64, device i32; one descriptor
	KindRefused Kind = 2 // the sender refused: payload is the reason
	KindPointer Kind = 3 // a pool allocation (see pool.go)
	KindRelease Kind = 4 // an importer released a pool allocation (see pool.go)
)

func (k Kind) String() string {
	switch k {
	case KindChunk:
		return "chunk"
	case KindRefused:
		return "refused"
	case KindPointer:
		return "pointer"
	case KindRelease:
		return "release"
	case KindPool:
		return "pool"
	case KindPoolChunk:
		return "pool chunk"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Listener accepts connections on a Unix socket path.
type Listener struct {
	l    *net.UnixListener
	path string
}

// Listen creates a socket at path (which must not exist) that only users
// the permissions perm admit can connect to (0o600: this user alone).
func Listen(path string, perm os.FileMode) (*Listener, error) {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: listen on %s", path)
	}
	if err := os.Chmod(path, perm); err != nil {
		_ = l.Close()
		return nil, errors.Wrapf(err, "ipc: set permissions of %s", path)
	}
	return &Listener{l: l, path: path}, nil
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Accept waits for a connection.
func (l *Listener) Accept() (*Conn, error) {
	c, err := l.l.AcceptUnix()
	if err != nil {
		return nil, errors.Wrap(err, "ipc: accept")
	}
	return newConn(c)
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return errors.Wrap(l.l.Close(), "ipc: close listener") }

// Dial connects to a listener's path.
func Dial(path string) (*Conn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: dial %s", path)
	}
	return newConn(c)
}

// Conn is one connection; its peer's credentials come from the kernel.
type Conn struct {
	c    *net.UnixConn
	peer unix.Ucred

	mu   sync.Mutex
	sent map[uint64]map[uint64]bool // pool id -> chunk offsets sent on this connection
}

func newConn(c *net.UnixConn) (*Conn, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		_ = c.Close()
		return nil, errors.Wrap(err, "ipc: connection")
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		_ = c.Close()
		return nil, errors.Wrap(errors.CombineErrors(err, cerr), "ipc: reading the peer's credentials (SO_PEERCRED)")
	}
	return &Conn{c: c, peer: *cred}, nil
}

// PeerPID is the process ID of the other end, as the kernel saw it when
// the connection was made.
func (c *Conn) PeerPID() int { return int(c.peer.Pid) }

// PeerUID is the user ID of the other end.
func (c *Conn) PeerUID() int { return int(c.peer.Uid) }

// SetDeadline bounds the next reads and writes.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Close closes the connection.
func (c *Conn) Close() error { return errors.Wrap(c.c.Close(), "ipc: close") }

// header is a message's fixed part.
type header struct {
	kind    Kind
	htype   driver.HandleType
	nfds    uint8
	payload uint32
}

func (h header) encode() []byte {
	b := make([]byte, headerSize)
	copy(b, magic[:])
	b[3] = version
	b[4] = byte(h.kind)
	b[5] = byte(h.htype)
	b[6] = h.nfds
	binary.LittleEndian.PutUint32(b[8:], h.payload)
	return b
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
		return errors.Wrapf(err, "ipc: send %s", kind)
	}
	if n != len(msg) || oobn != len(oob) {
		return errors.Newf("ipc: send %s: wrote %d of %d bytes, %d of %d control bytes", kind, n, len(msg), oobn, len(oob))
	}
	return nil
}

// message is one received message; fds are open until the caller closes
// or adopts them.
type message struct {
	header
	body []byte
	fds  []int
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
		return nil, errors.Mark(errors.Newf("ipc: receive: "+format, args...), ErrProtocol)
	}
	if err != nil {
		closeAll(fds)
		return nil, errors.Wrap(err, "ipc: receive")
	}
	switch {
	case n == 0:
		closeAll(fds)
		return nil, errors.Wrap(driver.ErrClosed, "ipc: receive: the peer closed the connection")
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

// SendChunk sends an exported chunk to the peer, if the peer's process ID
// is on the chunk's allow-list; otherwise the peer is told it was refused,
// gets no descriptor, and SendChunk returns ErrAccessDenied.
func (c *Conn) SendChunk(ch *physical.Chunk) error {
	sh, ok := ch.Exported()
	if !ok {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: send %s: not exported", ch),
			"export it first, naming the processes that may import it: Chunk.Export(pids...)")
	}
	if sh.Type != driver.HandlePOSIXFD {
		return errors.Wrapf(driver.ErrUnsupported, "ipc: send %s: handle type %d does not travel over a socket", ch, sh.Type)
	}
	if pid := c.PeerPID(); !ch.Allowed(pid) {
		reason := fmt.Sprintf("process %d is not on the allow-list of %s", pid, ch)
		if err := c.send(KindRefused, 0, []byte(reason)); err != nil {
			return errors.CombineErrors(errors.Wrapf(driver.ErrAccessDenied, "ipc: %s", reason), err)
		}
		return errors.WithHint(errors.Wrapf(driver.ErrAccessDenied, "ipc: %s", reason), "add it with Chunk.SetAllowedPIDs")
	}
	payload := make([]byte, 12)
	binary.LittleEndian.PutUint64(payload, sh.Size)
	binary.LittleEndian.PutUint32(payload[8:], uint32(ch.Device()))
	return c.send(KindChunk, driver.HandlePOSIXFD, payload, sh.FD)
}

// RecvChunk receives a chunk and imports it into mem on dev. A refusal by
// the sender is ErrAccessDenied with its reason; a broken message is
// ErrProtocol (or ErrInvalid for a handle the driver rejects), and no
// descriptor is left open.
func (c *Conn) RecvChunk(mem *physical.Memory, dev driver.DeviceID) (*physical.Chunk, error) {
	m, err := c.recv()
	if err != nil {
		return nil, err
	}
	defer closeAll(m.fds) // the imported chunk holds its own duplicate
	switch m.kind {
	case KindRefused:
		return nil, errors.Wrapf(driver.ErrAccessDenied, "ipc: the sender refused: %s", m.body)
	case KindChunk:
	default:
		return nil, errors.Mark(errors.Newf("ipc: receive chunk: a %s message came", m.kind), ErrProtocol)
	}
	if len(m.body) != 12 || len(m.fds) != 1 {
		return nil, errors.Mark(errors.Newf("ipc: receive chunk: %d payload bytes and %d descriptors, want 12 and 1", len(m.body), len(m.fds)), ErrProtocol)
	}
	if m.htype != driver.HandlePOSIXFD {
		return nil, errors.Wrapf(driver.ErrInvalid, "ipc: receive chunk: handle type %d, only POSIX descriptors (%d) travel here", m.htype, driver.HandlePOSIXFD)
	}
	size := binary.LittleEndian.Uint64(m.body)
	ch, err := mem.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: m.fds[0], Size: size}, dev)
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: receive chunk of %s", units.Bytes(size))
	}
	return ch, nil
}
