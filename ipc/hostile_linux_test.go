package ipc

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// fillSendBuffer writes junk packets on c's socket, without waiting,
// until the kernel takes no more: the peer reads none of them.
func fillSendBuffer(t *testing.T, c *Conn) int {
	t.Helper()
	rc, err := c.c.SyscallConn()
	require.NoError(t, err)
	junk := packet(KindRefused, 0, 0, []byte("unread"))
	n := 0
	var serr error
	require.NoError(t, rc.Write(func(fd uintptr) bool {
		for {
			if serr = unix.Sendmsg(int(fd), junk, nil, nil, unix.MSG_DONTWAIT); serr != nil {
				return true
			}
			n++
		}
	}))
	require.ErrorIs(t, serr, unix.EAGAIN)
	require.Positive(t, n)
	return n
}

// waitForBlockedWrite waits until some goroutine of the process waits to
// write on a socket (internal/poll's waitWrite), which only the call under
// test does here.
func waitForBlockedWrite(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for range 100000 {
		if strings.Contains(string(buf[:runtime.Stack(buf, true)]), "waitWrite") {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no goroutine came to wait on the full socket")
}

// TestCloseDuringStalledSend: a peer that never reads fills the socket,
// and a SendPointer to it waits to write. Close of the connection still
// returns — it does not wait for the stalled send's lock — and the send
// ends with ErrClosed, counting no import; the release the peer sent
// before is applied. Descriptors and mappings are back where they
// started.
func TestCloseDuringStalledSend(t *testing.T) {
	before, err := leakcheck.Take()
	require.NoError(t, err)
	func() {
		sp := sendPointer(t)
		defer sp.p.close()
		defer sp.l.Close()
		defer sp.s.Destroy()
		require.NoError(t, sp.ip.Free(sp.got)) // queued at the exporter's end
		fillSendBuffer(t, sp.rx)
		sent := make(chan error, 1)
		go func() { sent <- sp.rx.SendPointer(sp.ep, sp.ptr) }()
		waitForBlockedWrite(t)
		closed := make(chan error, 1)
		go func() { closed <- sp.rx.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			// Unstick the send (the importer reads at last) so that the
			// goroutines end, then fail.
			drain(sp.tx)
			<-closed
			<-sent
			t.Fatal("Close waited for a send stalled on a peer that never reads")
		}
		drivertest.RequireIs(t, <-sent, driver.ErrClosed)
		require.Zero(t, sp.rx.Holds(), "the stalled send counts no import, the release came")
		require.NoError(t, sp.ip.Close())
		require.NoError(t, sp.tx.Close())
		require.NoError(t, sp.pl.FreeAsync(sp.ptr, sp.s))
		require.NoError(t, sp.s.Synchronize())
		require.NoError(t, sp.pl.Destroy())
	}()
	after, err := leakcheck.Take()
	require.NoError(t, err)
	require.Equal(t, before.FDs, after.FDs, "descriptors: %s, then %s", before, after)
	require.Equal(t, before.VmarenaMaps, after.VmarenaMaps, "memfd mappings: %s, then %s", before, after)
}

// drain reads, without waiting, every message queued at c's end.
func drain(c *Conn) {
	for {
		m, ok, _ := c.recvQueued()
		if m != nil {
			closeAll(m.fds)
		}
		if !ok {
			return
		}
	}
}
