// Package ipc moves shareable chunks between processes: a serving engine
// listens on a Unix socket path, another process dials it, and chunks cross
// as file descriptors (SCM_RIGHTS: the host and CUDA drivers) or as 64-bit
// tokens (AscendCL), with a small typed header, so both processes map the
// same memory — no copy.
//
// A token is only a number: AscendCL lets a process import it only if the
// exporter put that process on the token's allow-list
// (aclrtMemSetPidToShareableHandle). The chunk's allow-list reaches the
// driver through physical.Chunk.Export; a pool's, for each pointer sent,
// through pool.ExportPointer, which this package calls with the peer.
//
// Who may connect at all is the socket path's permissions (Listen sets
// them). Who may import a chunk is its allow-list (physical.Chunk.Export):
// the sender reads the peer's process ID from the kernel (SO_PEERCRED) and
// refuses anyone not on it — the peer gets an error message and no
// descriptor. A peer that gets one holds the chunk's memory file itself;
// the driver sealed it, so no holder can shrink or grow it under the
// others' mappings, and an import refuses a descriptor that is not so
// sealed (see driver.Sharing).
//
// Messages are SOCK_SEQPACKET packets, so each arrives whole with its
// descriptors: a 12-byte header (magic "VMA", version, kind, handle type,
// descriptor count, payload length) and a payload of at most MaxPayload
// bytes. A malformed, truncated or oversized message, a wrong handle type
// or descriptor count is an error, and every descriptor that came with it
// is closed: nothing leaks in either process.
//
// This package and the drivers are the only ones that talk to the kernel:
// it moves descriptors; it never maps memory itself. It needs Linux
// (SOCK_SEQPACKET, SO_PEERCRED, pidfds): conn_linux.go holds the system
// calls, and elsewhere Listen and Dial answer driver.ErrUnsupported.
package ipc

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
)

// ErrProtocol marks a message that breaks the wire format (bad magic or
// version, truncated, oversized, wrong descriptor count, unknown kind).
var ErrProtocol = errors.New("malformed message")

// Wire format.
const (
	headerSize = 12
	// MaxPayload is the largest payload a message may carry.
	MaxPayload = 4096
	// version 2: KindPoolChunk carries the chunk's identity; version 3:
	// chunks may travel as tokens (driver.HandleToken) instead of
	// descriptors.
	version = 3
	maxFDs  = 4 // room to notice a sender passing more than allowed
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

// maxPath is the longest path a Unix socket may have: sockaddr_un's 108
// bytes less the terminating NUL.
const maxPath = 107

// checkPath returns ErrInvalid for a path no socket of this package can
// have: empty, too long, holding a NUL byte (the kernel would cut it
// there), or naming an abstract socket (a leading @, which Go turns into
// Linux's abstract namespace: no file, so no permissions, decide who may
// connect there).
func checkPath(op, path string) error {
	switch {
	case path == "":
		return errors.Wrapf(driver.ErrInvalid, "ipc: %s: the socket path is empty", op)
	case len(path) > maxPath:
		return errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "ipc: %s %s: the path has %d bytes, more than the %d a Unix socket's may have", op, path, len(path), maxPath),
			"put the socket in a directory with a shorter path")
	case strings.ContainsRune(path, 0):
		return errors.Wrapf(driver.ErrInvalid, "ipc: %s %q: the path holds a NUL byte", op, path)
	case path[0] == '@':
		return errors.Wrapf(driver.ErrInvalid, "ipc: %s %s: a name starting with @ is an abstract socket, which no file permission protects", op, path)
	}
	return nil
}

// osError wraps err, a failure of the socket, as this package's error. The
// operating system's error stays inside, so that errors.Is finds
// syscall.ECONNREFUSED or os.ErrNotExist; the net package's layer goes,
// as its text repeats the path the message names. A socket this process
// has closed already is ErrClosed as well.
func osError(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	err = errors.Wrapf(err, format, args...)
	if errors.Is(err, net.ErrClosed) {
		err = sentinel.Mark(err, driver.ErrClosed)
	}
	return err
}

// Listener accepts connections on a Unix socket path.
type Listener struct {
	l    *net.UnixListener
	path string
}

// made returns ErrInvalid for a Listener that Listen did not make (nil,
// or a zero Listener).
func (l *Listener) made(op string) error {
	if l == nil || l.l == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: %s: the listener is nil or was not made by Listen", op),
			"make listeners with ipc.Listen")
	}
	return nil
}

// Path is the socket's path ("" for a Listener that Listen did not make).
func (l *Listener) Path() string {
	if l == nil {
		return ""
	}
	return l.path
}

// Close stops listening and removes the socket file. A second Close is
// ErrClosed.
func (l *Listener) Close() error {
	if err := l.made("close the listener"); err != nil {
		return err
	}
	return osError(l.l.Close(), "ipc: close the listener on %s", l.path)
}

// Conn is one connection; its peer's credentials come from the kernel,
// and the peer process is watched from the moment the connection is made
// (peerProc), so that what it holds can be released when it exits.
type Conn struct {
	c        *net.UnixConn
	path     string // the socket's: what Dial dialed, or the Listener's
	pid, uid int    // the peer's, as the kernel saw them when the connection was made
	peer     peerProc
	// holder keeps, in the pools, the imports counted in holds: only this
	// connection releases them (pool.ReleaseImport by hand is refused).
	holder *pool.ImportHolder

	// sendMu is held across a pointer's messages (sendPointer), so that
	// they go out in one piece, and guards sent. It is taken before mu,
	// and mu is never held across a send: Close, which takes mu, does
	// not wait for a send stalled on a peer that reads nothing.
	sendMu lockrank.Mutex[lockrank.IPCSend]
	sent   map[uint64]map[uint64]sentChunk // pool id -> offset -> the chunk sent there on this connection

	// mu guards the fields below. It is taken before an exported pool's
	// own lock (ReleaseImportFor), never after.
	mu lockrank.Mutex[lockrank.IPCConn]
	// holds counts the imports the peer holds: pool pointers sent with
	// SendPointer and not yet released (RecvRelease); each is one import
	// counted by its pool (pool.ExportPointer). Entries are never zero.
	holds map[*ExportedPool]map[driver.Addr]int
	// pools are the pools SendPool sent on this connection: a pointer of
	// another the peer could not take, nor ever release.
	pools  map[uint64]bool
	closed bool // Close was called

	testExitWait *time.Duration // tests shorten PeerExitWait here
}

// made returns ErrInvalid for a Conn that Dial or Accept did not make
// (nil, or a zero Conn).
func (c *Conn) made(op string) error {
	if c == nil || c.c == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: %s: the connection is nil or was not made by Dial or Listener.Accept", op),
			"connect with ipc.Dial, or accept with Listener.Accept")
	}
	return nil
}

// open returns made's error, or ErrClosed once Close was called: what
// every send, receive and SetDeadline asks first, before it changes
// anything.
func (c *Conn) open(op string) error {
	if err := c.made(op); err != nil {
		return err
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return driver.Closed(fmt.Sprintf("ipc: %s: the connection on %s is closed", op, c.path))
	}
	return nil
}

// PeerPID is the process ID of the other end, as the kernel saw it when
// the connection was made; -1 for a Conn that Dial or Accept did not
// make.
func (c *Conn) PeerPID() int {
	if c == nil || c.c == nil {
		return -1
	}
	return c.pid
}

// PeerUID is the user ID of the other end; -1 for a Conn that Dial or
// Accept did not make (not 0, which is root's).
func (c *Conn) PeerUID() int {
	if c == nil || c.c == nil {
		return -1
	}
	return c.uid
}

// SetDeadline bounds the next reads and writes.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.open("set the deadline"); err != nil {
		return err
	}
	return osError(c.c.SetDeadline(t), "ipc: set the deadline of the connection on %s", c.path)
}

// Close closes the connection. First it applies the releases the peer
// sent that no RecvRelease read (a peer that freed its pointers before
// the exporter asked), without waiting for more; a release it refuses is
// in its error. Imports the peer still holds then stay held
// unless its process has exited already (then Close releases them, as
// ReleaseIfGone does); the peer is still watched, so ReleaseIfGone
// releases them after Close too, once it has exited. A second Close is
// ErrClosed and does nothing.
func (c *Conn) Close() error {
	if err := c.made("close"); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return driver.Closed(fmt.Sprintf("ipc: close: the connection on %s is closed", c.path))
	}
	c.closed = true
	c.mu.Unlock()
	var err error
	if c.Holds() > 0 {
		err = errors.Wrapf(c.applyQueuedReleases(), "ipc: close: the releases process %d sent", c.PeerPID())
	}
	err = errors.CombineErrors(err, osError(c.c.Close(), "ipc: close the connection on %s", c.path))
	if c.Holds() > 0 {
		if _, rerr := c.ReleaseIfGone(); rerr != nil && !errors.Is(rerr, driver.ErrBusy) {
			err = errors.CombineErrors(err, rerr)
		}
	}
	c.dropPeerIfDone()
	return err
}

// dropPeerIfDone stops watching the peer once the connection is closed
// and the peer holds nothing.
func (c *Conn) dropPeerIfDone() {
	c.mu.Lock()
	done := c.closed && len(c.holds) == 0
	c.mu.Unlock()
	if done {
		c.peer.close()
	}
}

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

// message is one received message; fds are open until the caller closes
// or adopts them.
type message struct {
	header
	body []byte
	fds  []int
}

// SendChunk sends an exported chunk to the peer, if the peer's process ID
// is on the chunk's allow-list; otherwise the peer is told it was refused,
// gets no descriptor, and SendChunk returns ErrAccessDenied.
func (c *Conn) SendChunk(ch *physical.Chunk) error {
	if err := c.open("send chunk"); err != nil {
		return err
	}
	if ch == nil {
		return errors.Wrap(driver.ErrInvalid, "ipc: send chunk: the chunk is nil")
	}
	sh, ok := ch.Exported()
	if !ok {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: send %s: not exported", ch),
			"export it first, naming the processes that may import it: Chunk.Export(pids...)")
	}
	if sh.Type != driver.HandlePOSIXFD && sh.Type != driver.HandleToken {
		return errors.Wrapf(driver.ErrUnsupported, "ipc: send %s: handle type %d does not travel over a socket", ch, sh.Type)
	}
	if pid := c.PeerPID(); !ch.Allowed(pid) {
		reason := fmt.Sprintf("process %d is not on the allow-list of %s", pid, ch)
		if err := c.send(KindRefused, 0, []byte(reason)); err != nil {
			return errors.CombineErrors(errors.Wrapf(driver.ErrAccessDenied, "ipc: %s", reason), err)
		}
		return errors.WithHint(errors.Wrapf(driver.ErrAccessDenied, "ipc: %s", reason), "add it with Chunk.SetAllowedPIDs")
	}
	payload := make([]byte, 12, chunkTokenPayload)
	binary.LittleEndian.PutUint64(payload, sh.Size)
	binary.LittleEndian.PutUint32(payload[8:], uint32(ch.Device()))
	if sh.Type == driver.HandleToken {
		// The token travels as bytes; the driver's own allow-list (set
		// from the chunk's, see physical.Chunk.Export) lets the peer
		// import it.
		return c.send(KindChunk, driver.HandleToken, binary.LittleEndian.AppendUint64(payload, sh.Token))
	}
	return c.send(KindChunk, driver.HandlePOSIXFD, payload, sh.FD)
}

// The payload of a KindChunk message: the chunk's size (8 bytes) and
// device (4), then, for a token, the token (8). A descriptor travels
// beside the payload.
const (
	chunkFDPayload    = 12
	chunkTokenPayload = 20
)

// RecvChunk receives a chunk and imports it into mem on dev. A refusal by
// the sender is ErrAccessDenied with its reason; a broken message is
// ErrProtocol (or ErrInvalid for a handle the driver rejects), and no
// descriptor is left open. A nil memory, one without a driver that shares
// chunks, or a device it lacks is refused before any message is read.
func (c *Conn) RecvChunk(mem *physical.Memory, dev driver.DeviceID) (*physical.Chunk, error) {
	if err := c.open("receive chunk"); err != nil {
		return nil, err
	}
	if err := importer("receive chunk", mem, dev); err != nil {
		return nil, err
	}
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
		return nil, sentinel.Mark(errors.Newf("ipc: receive chunk: a %s message came", m.kind), ErrProtocol)
	}
	var sh driver.Shareable
	switch m.htype {
	case driver.HandlePOSIXFD:
		if len(m.body) != chunkFDPayload || len(m.fds) != 1 {
			return nil, sentinel.Mark(errors.Newf("ipc: receive chunk: %d payload bytes and %d descriptors, want %d and 1", len(m.body), len(m.fds), chunkFDPayload), ErrProtocol)
		}
		sh = driver.Shareable{Type: driver.HandlePOSIXFD, FD: m.fds[0]}
	case driver.HandleToken:
		if len(m.body) != chunkTokenPayload || len(m.fds) != 0 {
			return nil, sentinel.Mark(errors.Newf("ipc: receive chunk: a token with %d payload bytes and %d descriptors, want %d and 0", len(m.body), len(m.fds), chunkTokenPayload), ErrProtocol)
		}
		sh = driver.Shareable{Type: driver.HandleToken, Token: binary.LittleEndian.Uint64(m.body[chunkFDPayload:])}
	default:
		return nil, errors.Wrapf(driver.ErrInvalid, "ipc: receive chunk: handle type %d, only POSIX descriptors (%d) and tokens (%d) travel here",
			m.htype, driver.HandlePOSIXFD, driver.HandleToken)
	}
	size := binary.LittleEndian.Uint64(m.body)
	sh.Size = size
	ch, err := mem.Import(sh, dev)
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: receive chunk of %s", units.Bytes(size))
	}
	return ch, nil
}

// importer returns nil when mem can import chunks on dev: the checks a
// receive makes before it reads a message, so that a call no message could
// satisfy consumes none.
func importer(op string, mem *physical.Memory, dev driver.DeviceID) error {
	what := func() string { return fmt.Sprintf("ipc: %s on device %d", op, dev) }
	d := mem.Driver()
	if d == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the physical memory is nil or has no driver", what()),
			"make the memory with physical.New(d) of an open driver")
	}
	if _, ok := d.(driver.Sharing); !ok {
		return errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver cannot share chunks between processes", what(), d.Name())
	}
	return driver.CheckDevice(what, dev, len(d.Devices()))
}
