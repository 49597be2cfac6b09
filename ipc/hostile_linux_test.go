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

// TestHostilePoolPeerHandled: what an exporting peer can send that the
// fuzz seeds do not name, each refused as it is: a pool of no bytes
// (ErrInvalid) or of bytes no granule divides (ErrMisaligned), a chunk at
// an offset no granule divides or of a size none does (ErrMisaligned),
// and a directory or a pipe's write end as the chunk (ErrInvalid, "not a
// memory file"). After each the imported pool passes its Check, maps
// nothing, nothing is imported, and no descriptor is left open.
func TestHostilePoolPeerHandled(t *testing.T) {
	p, err := fuzzProc()
	require.NoError(t, err)
	const id = 7
	g := uint64(fuzzGran)
	dir := func(t *testing.T) int {
		fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		return fd
	}
	pipeW := func(t *testing.T) int {
		var fds [2]int
		require.NoError(t, unix.Pipe2(fds[:], unix.O_CLOEXEC))
		require.NoError(t, unix.Close(fds[0]))
		return fds[1]
	}
	memfd := func(size uint64) func(t *testing.T) int {
		return func(t *testing.T) int { return fuzzMemfd(t, size, true) }
	}
	for _, c := range []struct {
		name    string
		max     uint64
		off     uint64
		size    uint64
		fd      func(t *testing.T) int
		poolErr error
		err     error
	}{
		{name: "a pool of no bytes", max: 0, poolErr: driver.ErrInvalid},
		{name: "a pool of a granule and a half", max: g + g/2, poolErr: driver.ErrMisaligned},
		{name: "a chunk at half a granule", max: 4 * g, off: g / 2, size: g, fd: memfd(g), err: driver.ErrMisaligned},
		{name: "a chunk of half a granule", max: 4 * g, off: 0, size: g / 2, fd: memfd(g / 2), err: driver.ErrMisaligned},
		{name: "a directory", max: 4 * g, off: 0, size: g, fd: dir, err: driver.ErrInvalid},
		{name: "a pipe's write end", max: 4 * g, off: 0, size: g, fd: pipeW, err: driver.ErrInvalid},
	} {
		before, used := openFDs(t), p.used()
		peer, rx := socketPair(t)
		rawSend(t, peer, packet(KindPool, 0, 0, u64s(id, c.max)), nil)
		ip, err := rx.RecvPool(p.space, p.mem, 0)
		if c.poolErr != nil {
			if err == nil {
				require.NoError(t, ip.Close())
			}
			require.ErrorIs(t, err, c.poolErr, c.name)
		} else {
			require.NoError(t, err, c.name)
			rawSend(t, peer, packet(KindPoolChunk, driver.HandlePOSIXFD, 1, u64s(id, c.off, c.size, 1)), []int{c.fd(t)})
			_, err = rx.RecvPointer(ip)
			require.ErrorIs(t, err, c.err, "%s: %v", c.name, err)
			require.NoError(t, ip.Check(), c.name)
			require.Empty(t, ip.Chunks(), c.name)
			require.NoError(t, ip.Close(), c.name)
		}
		require.Equal(t, used, p.used(), "%s: nothing imported", c.name)
		require.NoError(t, p.mem.Check(), c.name)
		closeConns(t, peer, rx)
		requireNoNewFDs(t, before, c.name)
	}
}
