package kvevents

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/internal/errors"
)

// zmq4's connection (v0.17.0) trusts its peer: it allocates a frame of
// whatever length the peer announces and appends frames to a message
// without end. Each connection the publisher accepts is read through a
// guardConn, which follows the ZMTP framing of what the peer sends
// before zmq4 sees it and refuses what no subscriber or replay client
// sends: no ZMTP 3 greeting, a frame longer than maxFrame, a message of
// more than maxFrames frames (commands counted with the rest), a command
// frame with the MORE flag (ZMTP's commands are single frames; zmq4
// would append every frame after it to the command), a message before
// the handshake's READY, a handshake not done within handshakeTimeout,
// a first command whose body is not a READY of whole properties (zmq4's
// metadata parser slices past a short property and panics: the guard
// holds the command's body, at most maxFrame, and checks it before zmq4
// reads its last byte); and it gives each write writeTimeout. A refused
// connection is closed; the others go on.
const (
	// maxFrame bounds a frame a peer sends: a subscription is the topic
	// and a byte, a replay request three short frames, the handshake's
	// READY command the socket type and identity.
	maxFrame = 64 << 10
	// maxFrames bounds the frames of one message (a replay request has
	// three; one more lets a refusal say why).
	maxFrames = 8
	// handshakeTimeout is how long a new connection may take to greet
	// and send its READY command.
	handshakeTimeout = 10 * time.Second
	// writeTimeout is how long one write to a peer may block: a
	// subscriber that takes in none of a message's bytes for this long
	// is cut off (it reconnects and asks the replay socket for the gap).
	writeTimeout = 30 * time.Second
	// greetingLen is a ZMTP 3 greeting's length.
	greetingLen = 64
)

// errRefused says a peer sent what the guard refuses.
var errRefused = errors.New("kvevents: a peer sent a frame or message past the bounds, or no handshake in time: connection closed")

// guardConn is a connection whose reads are checked frame by frame.
// zmq4 reads a connection from one goroutine, so its state needs no lock.
type guardConn struct {
	net.Conn
	// timer closes the connection if its handshake is not done in time
	// (zmq4 leaves a connection whose handshake failed open).
	timer     *time.Timer
	done      atomic.Bool // the handshake is done
	refused   atomic.Bool // the guard closed the connection
	sig       [11]byte    // the greeting's signature and major version
	greet     int         // greeting bytes still to come
	hdr       [9]byte     // the frame header read so far
	hdrN      int
	body      uint64 // body bytes of the current frame still to come
	command   bool   // the current frame is a command
	frames    int    // frames of the current message so far
	handshook bool   // the peer's first command (READY) is in
	ready     []byte // the first command's body so far, checked whole

	// wmu is held while a message is written (Write, writeMsg); wheld
	// and out are Write's.
	wmu   sync.Mutex
	wheld bool
	out   outFrames
}

func newGuardConn(c net.Conn) *guardConn {
	g := &guardConn{Conn: c, greet: greetingLen}
	g.timer = time.AfterFunc(handshakeTimeout, func() {
		if !g.done.Load() {
			g.refused.Store(true)
			_ = c.Close()
		}
	})
	return g
}

func (g *guardConn) Close() error {
	g.timer.Stop()
	return g.Conn.Close()
}

func (g *guardConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if serr := g.scan(p[:n]); serr != nil {
		g.refused.Store(true)
		_ = g.Close()
		return 0, serr
	}
	if err != nil && !g.handshook {
		_ = g.Close() // zmq4 does not close a connection whose handshake failed
	}
	return n, err
}

// Write writes what zmq4 sends on the goroutine that reads the
// connection (the greeting, the handshake's READY, the PONG it answers
// a PING with, a replay's messages), holding wmu from the first byte of
// a message (or of the greeting) to its last: a subscriber's writer,
// which sends through writeMsg under wmu too, never puts a message
// inside one, and a PONG never lands inside a message it sends (zmq4
// writes each frame's header and body apart). Only that goroutine calls
// Write, so out needs no lock.
func (g *guardConn) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if !g.wheld {
			g.wmu.Lock()
			g.wheld = true
		}
		k, end := g.out.advance(p)
		_ = g.Conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		n, err := g.Conn.Write(p[:k])
		written += n
		if err != nil || end {
			g.wheld = false
			g.wmu.Unlock()
		}
		if err != nil {
			_ = g.Close() // the stream is cut inside a frame: nothing more can go
			return written, err
		}
		p = p[k:]
	}
	return written, nil
}

// endWrites lets wmu go if a message Write began is cut short (the
// reading goroutine ends inside it): called by that goroutine as it
// ends, after which the connection is closed, so that the writer fails
// rather than waits.
func (g *guardConn) endWrites() {
	if g.wheld {
		g.wheld = false
		g.wmu.Unlock()
	}
}

// writeMsg sends frames as one message, under wmu (see Write), in one
// write where the connection can.
func (g *guardConn) writeMsg(frames ...[]byte) error {
	bufs := make(net.Buffers, 0, 2*len(frames))
	for i, f := range frames {
		h := make([]byte, 0, 9)
		var flags byte
		if i < len(frames)-1 {
			flags |= 0x01
		}
		if len(f) > 255 {
			h = binary.BigEndian.AppendUint64(append(h, flags|0x02), uint64(len(f)))
		} else {
			h = append(h, flags, byte(len(f)))
		}
		bufs = append(bufs, h, f)
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	_ = g.Conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := bufs.WriteTo(g.Conn)
	return err
}

// outFrames follows the framing of what zmq4 writes: the greeting, then
// frames.
type outFrames struct {
	greeted bool
	hdr     [9]byte // the frame header written so far
	hdrN    int
	body    uint64 // body bytes of the current frame still to go
	more    bool   // the current frame has MORE (a command never has)
}

// advance takes what comes first of p: bytes up to the end of the
// greeting or of a message, or all of p; end says a message (or the
// greeting) ends there.
func (o *outFrames) advance(p []byte) (k int, end bool) {
	if !o.greeted {
		// zmq4 writes the greeting whole, in one write.
		o.greeted = true
		return min(len(p), greetingLen), true
	}
	for k < len(p) {
		if o.body > 0 {
			d := min(o.body, uint64(len(p)-k))
			o.body -= d
			k += int(d)
		} else {
			o.hdr[o.hdrN] = p[k]
			o.hdrN++
			k++
			want := 2
			if o.hdr[0]&0x02 != 0 {
				want = 9
			}
			if o.hdrN < want {
				continue
			}
			o.body = uint64(o.hdr[1])
			if want == 9 {
				o.body = binary.BigEndian.Uint64(o.hdr[1:9])
			}
			o.more = o.hdr[0]&0x01 != 0
			o.hdrN = 0
		}
		if o.body == 0 && o.hdrN == 0 && !o.more {
			return k, true
		}
	}
	return k, false
}

// scan follows the framing through p.
func (g *guardConn) scan(p []byte) error {
	for len(p) > 0 {
		switch {
		case g.greet > 0:
			// The signature (0xff, 8 bytes, 0x7f) and a major version of
			// 3 or more, else it is no ZMTP 3 peer.
			at := greetingLen - g.greet
			if at < len(g.sig) {
				g.sig[at] = p[0]
				if at == len(g.sig)-1 && (g.sig[0] != 0xff || g.sig[9] != 0x7f || g.sig[10] < 3) {
					return errRefused
				}
				g.greet--
				p = p[1:]
				continue
			}
			k := min(g.greet, len(p))
			g.greet -= k
			p = p[k:]
		case g.body > 0:
			k := min(g.body, uint64(len(p)))
			if g.command && !g.handshook {
				g.ready = append(g.ready, p[:k]...)
			}
			g.body -= k
			p = p[k:]
			if g.body == 0 {
				if err := g.frameDone(); err != nil {
					return err
				}
			}
		default:
			g.hdr[g.hdrN] = p[0]
			g.hdrN++
			p = p[1:]
			want := 2
			if g.hdr[0]&0x02 != 0 {
				want = 9
			}
			if g.hdrN < want {
				continue
			}
			size := uint64(g.hdr[1])
			if want == 9 {
				size = binary.BigEndian.Uint64(g.hdr[1:9])
			}
			flags := g.hdr[0]
			g.hdrN = 0
			if flags&^0x07 != 0 || size > maxFrame {
				return errRefused
			}
			g.command = flags&0x04 != 0
			switch {
			case g.command && flags&0x01 != 0:
				return errRefused // a command is one frame: no MORE
			case !g.command && !g.handshook:
				return errRefused // a message before READY
			}
			g.frames++
			if g.frames > maxFrames {
				return errRefused
			}
			if flags&0x01 == 0 {
				g.frames = 0
			}
			g.body = size
			if size == 0 {
				if err := g.frameDone(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// frameDone notes a whole frame read: the first command ends the
// handshake, and with it the read deadline, once its body is a READY
// of whole properties.
func (g *guardConn) frameDone() error {
	if !g.command || g.handshook {
		return nil
	}
	if !wellFormedReady(g.ready) {
		return errRefused
	}
	g.ready = nil
	g.handshook = true
	g.done.Store(true)
	g.timer.Stop()
	return nil
}

// wellFormedReady reports whether body is a ZMTP READY command's: the
// name READY, then properties each of a name (a length byte, at least
// one byte) and a value (a 4-byte big-endian length, that many bytes),
// the last ending where body does.
func wellFormedReady(body []byte) bool {
	const name = "READY"
	if len(body) < 1+len(name) || int(body[0]) != len(name) || string(body[1:1+len(name)]) != name {
		return false
	}
	for p := body[1+len(name):]; len(p) > 0; {
		k := int(p[0])
		if k == 0 || len(p) < 1+k+4 {
			return false
		}
		p = p[1+k:]
		v := binary.BigEndian.Uint32(p)
		p = p[4:]
		if uint64(v) > uint64(len(p)) {
			return false
		}
		p = p[v:]
	}
	return true
}
