//go:build !linux

package ipc

import (
	"os"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Off Linux there is no connection: the wire format needs SOCK_SEQPACKET
// Unix sockets and the peer's process ID from SO_PEERCRED, and the only
// driver whose chunks travel as descriptors (the host driver) needs Linux
// too. Every call answers ErrUnsupported.

func unsupported(what string) error {
	return errors.Wrapf(driver.ErrUnsupported, "ipc: %s: sharing between processes needs Linux", what)
}

// Listen reports that sharing needs Linux.
func Listen(path string, perm os.FileMode) (*Listener, error) {
	return nil, unsupported("listen on " + path)
}

// Accept reports that sharing needs Linux.
func (l *Listener) Accept() (*Conn, error) { return nil, unsupported("accept") }

// Dial reports that sharing needs Linux.
func Dial(path string) (*Conn, error) { return nil, unsupported("dial " + path) }

func (c *Conn) send(kind Kind, _ driver.HandleType, _ []byte, _ ...int) error {
	return unsupported("send " + kind.String())
}

func (c *Conn) recv() (*message, error) { return nil, unsupported("receive") }

func (c *Conn) recvQueued() (*message, bool, error) { return nil, false, unsupported("receive") }

// closeAll has nothing to close: no descriptor arrives here.
func closeAll([]int) {}

// peerProc would watch the peer process; there is none here.
type peerProc struct{ pid int }

func (p *peerProc) exited(time.Duration) (bool, error) { return false, unsupported("watch the peer") }

func (p *peerProc) close() {}
