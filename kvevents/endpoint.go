package kvevents

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// maxIPCPath bounds an ipc:// path, in bytes: a Unix socket address
// holds 108 on Linux, the last a NUL (macOS: 104, where the kernel
// refuses a longer one itself).
const maxIPCPath = 107

// endpoint is a parsed ZMQ endpoint: network "tcp" or "unix", and the
// address net.Listen takes.
type endpoint struct {
	network, address string
}

// url is e as ZMQ writes it.
func (e endpoint) url() string {
	if e.network == "unix" {
		return "ipc://" + e.address
	}
	if strings.HasPrefix(e.address, ":") {
		return "tcp://*" + e.address
	}
	return "tcp://" + e.address
}

// urlOf is a listener's address as a subscriber dials it.
func urlOf(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// OffsetEndpoint is ep as vLLM's ZmqEventPublisher offsets it for
// data-parallel rank rank (its offset_endpoint_port): unchanged at rank 0;
// tcp://HOST:PORT becomes tcp://HOST:PORT+rank; ipc://PATH becomes
// ipc://PATH_dpRANK. Where vLLM would add the rank to port 0, the port
// stays 0 (a free port, which has no base to offset). A bad endpoint, a
// negative rank or a port past 65535 is an error marked driver.ErrInvalid.
func OffsetEndpoint(ep string, rank int) (string, error) {
	e, err := parseEndpoint("endpoint", ep, rank)
	if err != nil {
		return "", err
	}
	return e.url(), nil
}

// parseEndpoint parses ep, offset by rank as OffsetEndpoint says.
func parseEndpoint(what, ep string, rank int) (endpoint, error) {
	bad := func(why string) error {
		return errors.Wrapf(driver.ErrInvalid, "kvevents: %s %q: %s (want tcp://HOST:PORT, HOST * for every interface, PORT 0 for a free one, or ipc://PATH)", what, ep, why)
	}
	if rank < 0 {
		return endpoint{}, bad("data-parallel rank " + strconv.Itoa(rank) + ": want 0 or more")
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if rank > 0 {
			path += "_dp" + strconv.Itoa(rank)
		}
		switch {
		case path == "" || path == "@":
			return endpoint{}, bad("no path")
		case len(path) > maxIPCPath:
			return endpoint{}, bad("a path of " + strconv.Itoa(len(path)) + " bytes: a Unix socket's holds at most " + strconv.Itoa(maxIPCPath))
		case strings.IndexByte(path, 0) >= 0:
			return endpoint{}, bad("a NUL in the path")
		}
		return endpoint{"unix", path}, nil
	}
	if strings.HasPrefix(ep, "inproc://") {
		return endpoint{}, bad("inproc:// reaches only sockets of the same process")
	}
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return endpoint{}, bad("neither a tcp:// nor an ipc:// endpoint")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return endpoint{}, bad(err.Error())
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || strconv.FormatUint(n, 10) != port {
		return endpoint{}, bad("the port is not a number from 0 to 65535")
	}
	if n != 0 && rank > 0 {
		if n += uint64(rank); n > 65535 {
			return endpoint{}, bad("the port offset by data-parallel rank " + strconv.Itoa(rank) + " is past 65535")
		}
	}
	switch {
	case host == "*":
		host = ""
	case host == "":
		return endpoint{}, bad("no host")
	case net.ParseIP(host) == nil && strings.ContainsAny(host, "/?#@ []"):
		return endpoint{}, bad("the host is neither an address nor a name")
	}
	return endpoint{"tcp", net.JoinHostPort(host, strconv.FormatUint(n, 10))}, nil
}

// listen listens on e. An ipc:// path where a socket file is left by a
// listener gone is taken over, as ZMQ's ipc transport does; a path a
// live socket listens on is an error marked driver.ErrBusy, and one that
// is not a socket is left alone (an error marked driver.ErrInvalid),
// where ZMQ would unlink whatever is there. Close removes the socket file.
func (e endpoint) listen() (net.Listener, error) {
	ln, err := net.Listen(e.network, e.address)
	if err == nil || e.network != "unix" || !errors.Is(err, syscall.EADDRINUSE) {
		return ln, err
	}
	if strings.HasPrefix(e.address, "@") {
		return nil, errors.Wrapf(driver.ErrBusy, "kvevents: %s: another socket listens there", e.url())
	}
	fi, serr := os.Lstat(e.address)
	if serr != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: %s: the path exists and is not a socket", e.url())
	}
	if c, derr := net.Dial("unix", e.address); derr == nil {
		_ = c.Close()
		return nil, errors.Wrapf(driver.ErrBusy, "kvevents: %s: another socket listens there", e.url())
	}
	if rerr := os.Remove(e.address); rerr != nil {
		return nil, errors.Wrapf(rerr, "kvevents: %s: remove the stale socket", e.url())
	}
	return net.Listen(e.network, e.address)
}
