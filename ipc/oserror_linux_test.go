package ipc

import (
	stderrors "errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
)

// requireOSError checks that err keeps the operating system's error
// target — for errors.Is of internal/errors and of the standard
// library alike — and that its message names path.
func requireOSError(t *testing.T, err, target error, path string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.Is(err, target), "want %v inside: %v", target, err)
	require.True(t, stderrors.Is(err, target), "the standard errors.Is finds %v too: %v", target, err)
	require.Contains(t, err.Error(), path, "the message names the socket's path")
}

// TestSocketErrorsKeepTheOSError: what docs/drivers.md's Errors section promises of ipc.Listen,
// Dial, Accept and a send to a peer that has gone — the operating
// system's error stays inside ours and the message names the socket's
// path — and that a peer closing the connection while we wait for a
// message is ErrClosed.
func TestSocketErrorsKeepTheOSError(t *testing.T) {
	dir := t.TempDir()

	t.Run("Listen in a directory that does not exist", func(t *testing.T) {
		path := filepath.Join(dir, "no-such-dir", "s.sock")
		_, err := Listen(path, 0o600)
		requireOSError(t, err, os.ErrNotExist, path)
		requireOSError(t, err, syscall.ENOENT, path)
	})
	t.Run("Listen on a path in use", func(t *testing.T) {
		l := listen(t)
		_, err := Listen(l.Path(), 0o600)
		requireOSError(t, err, syscall.EADDRINUSE, l.Path())
	})
	t.Run("Dial a path that does not exist", func(t *testing.T) {
		path := filepath.Join(dir, "nobody.sock")
		_, err := Dial(path)
		requireOSError(t, err, os.ErrNotExist, path)
		requireOSError(t, err, syscall.ENOENT, path)
	})
	t.Run("Dial a socket nobody listens on", func(t *testing.T) {
		path := filepath.Join(dir, "bound.sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Bind(fd, &unix.SockaddrUnix{Name: path}))
		require.NoError(t, unix.Close(fd)) // the file stays; no one listens
		_, err = Dial(path)
		requireOSError(t, err, syscall.ECONNREFUSED, path)
	})
	t.Run("Accept with no descriptor left", func(t *testing.T) {
		l := listen(t)
		tx, err := Dial(l.Path()) // waits in the backlog
		require.NoError(t, err)
		defer tx.Close()
		// The lowest free descriptor number becomes the limit: accept(2)
		// cannot have one (EMFILE). Restored at once.
		var lim unix.Rlimit
		require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
		free, err := unix.Dup(0)
		require.NoError(t, err)
		require.NoError(t, unix.Close(free))
		low := lim
		low.Cur = uint64(free)
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
		_, err = l.Accept()
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
		requireOSError(t, err, syscall.EMFILE, l.Path())
		rx, err := l.Accept()
		require.NoError(t, err, "the connection still waited")
		require.NoError(t, rx.Close())
	})

	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	c := exported(t, p, os.Getpid())
	defer func() {
		require.NoError(t, p.tab.Unmap(p.res.Base()))
		require.NoError(t, c.Release())
	}()
	pair := func(t *testing.T) (*Listener, *Conn, *Conn) {
		l := listen(t)
		tx, err := Dial(l.Path())
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Close() })
		rx, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { _ = rx.Close() })
		return l, tx, rx
	}
	t.Run("send to a peer that has gone", func(t *testing.T) {
		l, tx, rx := pair(t)
		require.NoError(t, rx.Close())
		err := tx.SendChunk(c)
		requireOSError(t, err, syscall.EPIPE, l.Path())
		require.True(t, errors.Is(err, driver.ErrClosed), "and ErrClosed: %v", err)
	})
	t.Run("the peer closes while we wait", func(t *testing.T) {
		l, tx, rx := pair(t)
		res := make(chan error, 1)
		go func() {
			_, err := tx.RecvChunk(p.mem, 0)
			res <- err
		}()
		time.Sleep(10 * time.Millisecond) // most likely waiting by now; either way the answer is the same
		require.NoError(t, rx.Close())
		err := <-res
		require.True(t, errors.Is(err, driver.ErrClosed), "want ErrClosed: %v", err)
		require.Regexp(t, "the connection ended|the peer closed the connection", err.Error())
		require.Contains(t, err.Error(), l.Path())
	})
}
