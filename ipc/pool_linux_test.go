package ipc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
)

// poolChild is the importing side of TestSharePoolWithChild.
func poolChild(conn *Conn) error {
	p, err := newProc()
	if err != nil {
		return err
	}
	defer p.close()
	ip, err := conn.RecvPool(p.space, p.mem, 0)
	if err != nil {
		return err
	}
	var ptrs []driver.Addr
	for i := 0; i < 2; i++ {
		ptr, err := conn.RecvPointer(ip)
		if err != nil {
			return err
		}
		got := make([]byte, 6)
		if err := ip.Read(0, ptr, got); err != nil {
			return err
		}
		fmt.Println("read", string(got))
		ptrs = append(ptrs, ptr)
	}
	_, err = ip.MallocAsync(64)
	fmt.Println("malloc", strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
	fmt.Println("close-early", drivertestIs(ip.Close(), driver.ErrBusy))
	if err := ip.Write(0, ptrs[1], []byte("child!")); err != nil {
		return err
	}
	for _, ptr := range ptrs {
		if err := ip.Free(ptr); err != nil {
			return err
		}
	}
	fmt.Println("double-free", drivertestIs(ip.Free(ptrs[0]), driver.ErrNotAllocated))
	return ip.Close()
}

// poolHoldChild imports one pointer, reads it, and never frees it; with
// disconnect it closes its connection (the memory stays mapped). It then
// waits, alive, until the parent kills it (or 20 s pass).
func poolHoldChild(conn *Conn, disconnect bool) error {
	p, err := newProc()
	if err != nil {
		return err
	}
	ip, err := conn.RecvPool(p.space, p.mem, 0)
	if err != nil {
		return err
	}
	ptr, err := conn.RecvPointer(ip)
	if err != nil {
		return err
	}
	got := make([]byte, 4)
	if err := ip.Read(0, ptr, got); err != nil {
		return err
	}
	fmt.Println("imported", string(got))
	if disconnect {
		if err := conn.Close(); err != nil {
			return err
		}
		fmt.Println("disconnected")
	}
	time.Sleep(20 * time.Second)
	return errors.New("not killed within 20 s")
}

// waitFor waits until out has a line "key ...", for at most 20 s.
func waitFor(t *testing.T, out *syncBuffer, key string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, ok := lines(out.String())[key]; ok {
			return
		}
	}
	t.Fatalf("no %q line from the child within 20 s:\n%s", key, out.String())
}

// kill ends the child with SIGKILL and waits for it, for at most 20 s.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Kill())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	<-done
}

// holdingPool is a shareable pool with one allocation holding "held",
// sent to a child in role, which imported it.
func holdingPool(t *testing.T, role string) (p *proc, pl *pool.Pool, s *stream.Stream, ptr driver.Addr, ep *ExportedPool, conn *Conn, cmd *exec.Cmd, out *syncBuffer) {
	t.Helper()
	p, err := newProc()
	require.NoError(t, err)
	t.Cleanup(p.close)
	pl, err = pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	s, err = stream.New(p.drv, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Destroy() })
	ptr, err = pl.MallocAsync(4096, s)
	require.NoError(t, err)
	require.NoError(t, s.CopyHtoD(ptr, []byte("held")))
	require.NoError(t, s.Synchronize())
	l := listen(t)
	conn, cmd, out = spawn(t, l, role)
	ep, err = ExportPool(pl, cmd.Process.Pid)
	require.NoError(t, err)
	require.NoError(t, conn.SendPool(ep))
	require.NoError(t, conn.SendPointer(ep, ptr))
	waitFor(t, out, "imported")
	require.Equal(t, []string{"held"}, lines(out.String())["imported"])
	return p, pl, s, ptr, ep, conn, cmd, out
}

// TestImporterKilledReleasesItsHolds: a child imports a pointer and is
// SIGKILLed before it frees it. While it lives the exporter cannot free
// the pointer, and ReleaseIfGone refuses; once it is dead, what it held is
// released — by RecvRelease, which sees the connection end and the peer
// gone, or by ReleaseIfGone — and the exporter frees the pointer and
// destroys the pool. (Before, the pool refused both forever: nothing
// undid the import of a peer that never sent its release.)
func TestImporterKilledReleasesItsHolds(t *testing.T) {
	for _, how := range []string{"RecvRelease", "ReleaseIfGone"} {
		t.Run(how, func(t *testing.T) {
			_, pl, s, ptr, ep, conn, cmd, _ := holdingPool(t, "pool-hold")
			require.Equal(t, 1, conn.Holds())
			exited, err := conn.PeerExited()
			require.NoError(t, err)
			require.False(t, exited)
			drivertest.RequireIs(t, pl.FreeAsync(ptr, s), driver.ErrBusy, "have not released it")
			n, err := conn.ReleaseIfGone()
			drivertest.RequireIs(t, err, driver.ErrBusy, fmt.Sprintf("process %d", cmd.Process.Pid), "lives", "1 import(s) stay held")
			require.Zero(t, n)
			require.Equal(t, 1, conn.Holds(), "a refused release changed nothing")

			switch how {
			case "RecvRelease": // waiting already when the child dies
				res := make(chan error, 1)
				go func() { _, err := conn.RecvRelease(ep); res <- err }()
				kill(t, cmd)
				err := <-res
				drivertest.RequireIs(t, err, driver.ErrClosed, fmt.Sprintf("process %d exited", cmd.Process.Pid), "released the 1 import(s) it held")
			case "ReleaseIfGone":
				kill(t, cmd)
				exited, err := conn.PeerExited()
				require.NoError(t, err)
				require.True(t, exited)
				n, err := conn.ReleaseIfGone()
				require.NoError(t, err)
				require.Equal(t, 1, n)
				_, err = conn.RecvRelease(ep)
				drivertest.RequireIs(t, err, driver.ErrClosed, "the connection ended")
			}
			require.Zero(t, conn.Holds())
			back := make([]byte, 4)
			require.NoError(t, s.CopyDtoH(back, ptr))
			require.NoError(t, s.Synchronize())
			require.Equal(t, "held", string(back), "the exporter's data is intact")
			require.NoError(t, pl.FreeAsync(ptr, s), "the importer is dead: nothing maps the pointer any more")
			require.NoError(t, s.Synchronize())
			require.NoError(t, pl.Destroy())
			n, err = conn.ReleaseIfGone()
			require.NoError(t, err, "nothing left to release")
			require.Zero(t, n)
		})
	}
}

// TestImporterDisconnectedStaysRefused: a child imports a pointer, closes
// its connection without freeing it, and lives on with the memory
// mapped. RecvRelease sees the connection end and the peer alive, and
// releases nothing; the exporter can neither free the pointer nor destroy
// the pool, and ReleaseIfGone refuses — after the exporter closed its end
// too. Once the child is killed, ReleaseIfGone releases its import, and
// the connection stops watching it.
func TestImporterDisconnectedStaysRefused(t *testing.T) {
	_, pl, s, ptr, ep, conn, cmd, out := holdingPool(t, "pool-disconnect")
	waitFor(t, out, "disconnected")
	pid := fmt.Sprintf("process %d", cmd.Process.Pid)
	_, err := conn.RecvRelease(ep)
	drivertest.RequireIs(t, err, driver.ErrClosed, pid, "ended the connection but lives", "1 import(s) stay held")
	refused := func() {
		t.Helper()
		require.Equal(t, 1, conn.Holds())
		drivertest.RequireIs(t, pl.FreeAsync(ptr, s), driver.ErrBusy, "have not released it")
		drivertest.RequireIs(t, pl.Destroy(), driver.ErrBusy, "live allocation")
		n, err := conn.ReleaseIfGone()
		drivertest.RequireIs(t, err, driver.ErrBusy, pid, "lives")
		require.Zero(t, n)
	}
	refused()
	require.NoError(t, conn.Close())
	refused()
	require.GreaterOrEqual(t, conn.peer.pidfd, 0, "still watched after Close: it holds an import")

	kill(t, cmd)
	n, err := conn.ReleaseIfGone()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, -1, conn.peer.pidfd, "closed and holding nothing: no longer watched")
	require.NoError(t, pl.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
}

// TestPeerProc: a process watched through a pidfd has exited once it is a
// zombie; watched by its PID alone (kernels without pidfds), only once it
// is reaped and its PID is free — later, never earlier.
func TestPeerProc(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMARENA_IPC_CHILD=commit", "VMARENA_IPC_COMMIT=4096")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	pidfd, err := unix.PidfdOpen(pid, 0)
	require.NoError(t, err)
	byFD := &peerProc{pid: pid, pidfd: pidfd}
	defer byFD.close()
	byPID := &peerProc{pid: pid, pidfd: -1}
	for _, p := range []*peerProc{byFD, byPID} {
		exited, err := p.exited(0)
		require.NoError(t, err)
		require.False(t, exited, "alive")
	}
	require.NoError(t, unix.Kill(pid, unix.SIGKILL)) // a zombie until reaped
	exited, err := byFD.exited(20 * time.Second)
	require.NoError(t, err)
	require.True(t, exited, "the pidfd is readable once the process has exited")
	exited, err = byPID.exited(0)
	require.NoError(t, err)
	require.False(t, exited, "a zombie keeps its PID")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	<-done
	exited, err = byPID.exited(time.Second)
	require.NoError(t, err)
	require.True(t, exited, "reaped: no process has the PID")
}

// TestConnWatchesPeer: both ends of a connection hold a pidfd of the
// other from the start (SO_PEERPIDFD, or pidfd_open), and close it with
// the connection when the peer holds nothing.
func TestConnWatchesPeer(t *testing.T) {
	l := listen(t)
	before := fdCount()
	a, err := Dial(l.Path())
	require.NoError(t, err)
	b, err := l.Accept()
	require.NoError(t, err)
	for _, c := range []*Conn{a, b} {
		require.GreaterOrEqual(t, c.peer.pidfd, 0)
		exited, err := c.PeerExited()
		require.NoError(t, err)
		require.False(t, exited, "this very process")
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Equal(t, before, fdCount(), "sockets and pidfds closed")
}

func drivertestIs(err, target error) bool { return errors.Is(err, target) }

// TestSharePoolWithChild: a pool and two of its allocations go to a child;
// the child reads them, cannot allocate from the imported pool, writes,
// and frees first; the exporter cannot free before the child released.
func TestSharePoolWithChild(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 16 * chunkSize})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	a, err := pl.MallocAsync(3*chunkSize/2, s) // spans chunks
	require.NoError(t, err)
	b, err := pl.MallocAsync(100, s)
	require.NoError(t, err)
	require.NoError(t, s.CopyHtoD(a, []byte("first!")))
	require.NoError(t, s.CopyHtoD(b, []byte("second")))
	require.NoError(t, s.Synchronize())

	l := listen(t)
	conn, cmd, out := spawn(t, l, "pool")
	ep, err := ExportPool(pl, cmd.Process.Pid)
	require.NoError(t, err)
	require.NoError(t, conn.SendPool(ep))
	require.NoError(t, conn.SendPointer(ep, a))
	require.NoError(t, conn.SendPointer(ep, b))
	drivertest.RequireIs(t, pl.FreeAsync(a, s), driver.ErrBusy, "have not released it")
	got, err := conn.RecvRelease(ep)
	require.NoError(t, err, out.String())
	require.Equal(t, a, got)
	require.NoError(t, pl.FreeAsync(a, s), "released by the importer: the exporter may free")
	got, err = conn.RecvRelease(ep)
	require.NoError(t, err, out.String())
	require.Equal(t, b, got)
	back := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(back, b))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "child!", string(back), "the exporter sees the importer's write")
	require.NoError(t, pl.FreeAsync(b, s))
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"first!", "second"}, kv["read"])
	require.Contains(t, kv["malloc"][0], "an imported pool cannot allocate")
	require.Equal(t, []string{"true"}, kv["close-early"])
	require.Equal(t, []string{"true"}, kv["double-free"])
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
}

// TestPoolProtocolErrors: in one process, unknown pools and pointers, a
// pool that is not shareable, and a peer not on the pool's allow-list.
func TestPoolProtocolErrors(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	before := fdCount()

	plain, err := pool.New(p.space, p.mem, pool.Props{MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	defer plain.Destroy()
	_, err = ExportPool(plain)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "without pool.Props.Shareable")

	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	ptr, err := pl.MallocAsync(64, s)
	require.NoError(t, err)

	other, err := ExportPool(pl, 1) // not this process
	require.NoError(t, err)
	drivertest.RequireIs(t, rx.SendPool(other), driver.ErrAccessDenied, "not on the allow-list")
	_, err = tx.RecvPool(p.space, p.mem, 0)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "refused")

	ep, err := ExportPool(pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	drivertest.RequireIs(t, rx.SendPointer(ep, ptr+64), driver.ErrNotAllocated, "not a live allocation")

	// A pointer of another pool, and one whose chunks never came.
	require.NoError(t, rx.send(KindPointer, 0, u64s(ep.id+1, 0, 64)))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "unknown here")
	require.NoError(t, rx.send(KindPointer, 0, u64s(ep.id, 0, 64)))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrNotMapped, "its chunks never came")
	// A release of something never imported.
	require.NoError(t, tx.send(KindRelease, 0, u64s(ep.id, 4096)))
	_, err = rx.RecvRelease(ep)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated, "holds no import of it on this connection")
	require.NoError(t, tx.send(KindRelease, 0, u64s(ep.id+7, 0)))
	_, err = rx.RecvRelease(ep)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "unknown here")

	// The real thing, in one process.
	require.NoError(t, rx.SendPointer(ep, ptr))
	got, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	require.NoError(t, ip.Write(0, got, bytes.Repeat([]byte{9}, 8)))
	require.NoError(t, ip.Free(got))
	_, err = rx.RecvRelease(ep)
	require.NoError(t, err)
	require.NoError(t, ip.Close())
	require.NoError(t, pl.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
	require.Equal(t, before, fdCount(), "no descriptor left behind")
}

// TestImportedPoolReplacesChunks, in one process with messages made by
// hand: a chunk with another identity at an offset replaces the chunk
// mapped there, unless an imported pointer not yet freed lies on it
// (ErrBusy, and nothing changes); the chunk already mapped, sent again,
// changes nothing; a chunk outside the pool is refused.
func TestImportedPoolReplacesChunks(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	before := fdCount()

	// Two chunks of the "exporter", filled with 'A' and 'B'.
	cs := p.drv.Devices()[0].RecommendedGranularity
	mk := func(at uint64, fill byte) (*physical.Chunk, driver.Shareable) {
		c, err := p.mem.Create(0, cs, driver.ChunkOptions{Shareable: true})
		require.NoError(t, err)
		require.NoError(t, p.tab.Map(p.res.Base()+driver.Addr(at), c))
		require.NoError(t, p.tab.SetAccess(p.res.Base()+driver.Addr(at), cs, 0, driver.AccessReadWrite))
		require.NoError(t, p.tab.Write(0, p.res.Base()+driver.Addr(at), bytes.Repeat([]byte{fill}, 8)))
		sh, err := c.Export()
		require.NoError(t, err)
		return c, sh
	}
	a, sha := mk(0, 'A')
	b, shb := mk(cs, 'B')

	const id = 77
	require.NoError(t, rx.send(KindPool, 0, u64s(id, 4*cs)))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	chunk := func(off uint64, c *physical.Chunk, sh driver.Shareable) {
		require.NoError(t, rx.send(KindPoolChunk, driver.HandlePOSIXFD, u64s(id, off, cs, uint64(c.Handle())), sh.FD))
	}
	pointer := func(off uint64) (driver.Addr, error) {
		require.NoError(t, rx.send(KindPointer, 0, u64s(id, off, 64)))
		return tx.RecvPointer(ip)
	}
	read := func(ptr driver.Addr) string {
		got := make([]byte, 8)
		require.NoError(t, ip.Read(0, ptr, got))
		return string(got)
	}
	release := func() {
		m, err := rx.recv()
		require.NoError(t, err)
		require.Equal(t, KindRelease, m.kind)
	}

	chunk(0, a, sha)
	ptr, err := pointer(0)
	require.NoError(t, err)
	require.Equal(t, "AAAAAAAA", read(ptr))
	require.Equal(t, []ImportedChunk{{Offset: 0, Size: cs, ID: uint64(a.Handle())}}, ip.Chunks())

	// B for offset 0 while the pointer there lives: refused, unchanged.
	type state struct {
		chunks []ImportedChunk
		fds    int
		maps   int
	}
	now := func() state {
		n := 0
		for range ip.tab.Mappings() {
			n++
		}
		return state{ip.Chunks(), fdCount(), n}
	}
	s0 := now()
	chunk(0, b, shb)
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrBusy, "under the imported pointer", "not yet freed")
	require.Equal(t, s0, now())
	require.Equal(t, "AAAAAAAA", read(ptr), "still the old chunk")
	require.NoError(t, ip.Check())

	// Freed, the same message replaces the chunk.
	require.NoError(t, ip.Free(ptr))
	release()
	chunk(0, b, shb)
	ptr, err = pointer(0)
	require.NoError(t, err)
	require.Equal(t, "BBBBBBBB", read(ptr), "the new chunk is mapped")
	require.Equal(t, []ImportedChunk{{Offset: 0, Size: cs, ID: uint64(b.Handle())}}, ip.Chunks())
	require.NoError(t, ip.Check())

	// The chunk mapped already, sent again: nothing changes.
	s1 := now()
	chunk(0, b, shb)
	ptr2, err := pointer(128)
	require.NoError(t, err)
	require.Equal(t, s1, now())
	require.Equal(t, ptr+128, ptr2)

	// A at another offset sits beside B; one outside the pool is refused.
	chunk(cs, a, sha)
	ptr3, err := pointer(cs)
	require.NoError(t, err)
	require.Equal(t, "AAAAAAAA", read(ptr3))
	require.NoError(t, rx.send(KindPoolChunk, driver.HandlePOSIXFD, u64s(id, 4*cs, cs, 9), sha.FD))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "outside the pool")
	require.Len(t, ip.Chunks(), 2)
	require.NoError(t, ip.Check())

	// A memory file its holders could resize is refused over a free range
	// too: ErrInvalid, the descriptor closed, nothing changed.
	s2 := now()
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(unsealed, int64(cs)))
	require.NoError(t, rx.send(KindPoolChunk, driver.HandlePOSIXFD, u64s(id, 2*cs, cs, 10), unsealed))
	require.NoError(t, unix.Close(unsealed))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "any holder could resize")
	require.Equal(t, s2, now())
	require.NoError(t, ip.Check())

	for _, q := range []driver.Addr{ptr, ptr2, ptr3} {
		require.NoError(t, ip.Free(q))
		release()
	}
	require.NoError(t, ip.Close())
	for i, c := range []*physical.Chunk{a, b} {
		require.NoError(t, p.tab.Unmap(p.res.Base()+driver.Addr(uint64(i)*cs)))
		require.NoError(t, c.Release())
	}
	require.Equal(t, before, fdCount(), "no descriptor left behind")
}

// TestSendPointerResendsRecommittedChunk: in one process, a pointer is
// sent, released and freed; its pool gives the chunk back and later
// commits a new one at the same offset for the next allocation. Sending
// that one sends the new chunk, and the importer maps it in place of the
// old: it reads what the exporter wrote the second time. (Chunks sent were
// once remembered by offset only: the new chunk never went, and the
// importer read the old chunk's bytes.)
func TestSendPointerResendsRecommittedChunk(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()

	cs := p.drv.Devices()[0].RecommendedGranularity
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 16 * cs})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	ep, err := ExportPool(pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)

	roundTrip := func(text string) (driver.Addr, string, []ImportedChunk) {
		x, err := pl.MallocAsync(64, s)
		require.NoError(t, err)
		require.NoError(t, s.CopyHtoD(x, []byte(text)))
		require.NoError(t, s.Synchronize())
		require.NoError(t, rx.SendPointer(ep, x))
		got, err := tx.RecvPointer(ip)
		require.NoError(t, err)
		b := make([]byte, len(text))
		require.NoError(t, ip.Read(0, got, b))
		chunks := ip.Chunks()
		require.NoError(t, ip.Check())
		require.NoError(t, ip.Free(got))
		_, err = rx.RecvRelease(ep)
		require.NoError(t, err)
		require.NoError(t, pl.FreeAsync(x, s))
		// Above the release threshold (0), the synchronize gives the
		// memory back to the device: the chunk is gone from the pool.
		require.NoError(t, s.Synchronize())
		reserved, err := pl.Attribute(pool.ReservedMemCurrent)
		require.NoError(t, err)
		require.Zero(t, reserved)
		return x, string(b), chunks
	}
	x1, read1, chunks1 := roundTrip("first!")
	x2, read2, chunks2 := roundTrip("second")
	require.Equal(t, "first!", read1)
	require.Equal(t, x1, x2, "the second allocation is where the first was")
	require.Equal(t, "second", read2, "the importer maps the new chunk, not the old one")
	require.Equal(t, chunks1[0].Offset, chunks2[0].Offset)
	require.NotEqual(t, chunks1[0].ID, chunks2[0].ID, "a new chunk at the same offset")
	require.NoError(t, ip.Close())
	require.NoError(t, pl.Destroy())
}

// TestPointerSentTwice: in one process, the exporter sends one pointer
// twice, which its pool counts as two imports; the importer maps it once
// and frees it twice, each Free one release, and only after both may the
// exporter free it. (The importer once kept one entry per pointer: its
// second Free was refused, and the exporter's second import was never
// released while the importer lived.)
func TestPointerSentTwice(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	cs := p.drv.Devices()[0].RecommendedGranularity
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * cs})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	ptr, err := pl.MallocAsync(64, s)
	require.NoError(t, err)
	ep, err := ExportPool(pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	require.NoError(t, rx.SendPointer(ep, ptr))
	require.NoError(t, rx.SendPointer(ep, ptr))
	require.Equal(t, 2, rx.Holds())
	a, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	b, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.Len(t, ip.Chunks(), 1)
	for i := range 2 {
		require.NoError(t, ip.Free(a), "free %d of 2", i+1)
		got, err := rx.RecvRelease(ep)
		require.NoError(t, err)
		require.Equal(t, ptr, got)
		if i == 0 {
			drivertest.RequireIs(t, pl.FreeAsync(ptr, s), driver.ErrBusy, "have not released it")
			drivertest.RequireIs(t, ip.Close(), driver.ErrBusy, "not freed")
		}
	}
	drivertest.RequireIs(t, ip.Free(a), driver.ErrNotAllocated, "freed twice?")
	require.Zero(t, rx.Holds())
	require.NoError(t, ip.Close())
	require.NoError(t, pl.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
}

// TestImportedPoolReadWrite: an importer reads and writes through its
// ImportedPool only inside a pointer it imported and has not freed — not
// another allocation of the exporter lying on the same chunk, not across a
// pointer's end, not outside the pool, not after Free or Close — and every
// refusal changes no byte and nothing of the pool. (The pool once handed
// out its page table, which a caller could unmap or close under it.)
func TestImportedPoolReadWrite(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	a, err := pl.MallocAsync(64, s)
	require.NoError(t, err)
	b, err := pl.MallocAsync(64, s) // on the same chunk, never sent
	require.NoError(t, err)
	require.NoError(t, s.CopyHtoD(a, bytes.Repeat([]byte{'a'}, 64)))
	require.NoError(t, s.CopyHtoD(b, bytes.Repeat([]byte{'b'}, 64)))
	require.NoError(t, s.Synchronize())
	exporter := func(at driver.Addr, n int) string {
		got := make([]byte, n)
		require.NoError(t, s.CopyDtoH(got, at))
		require.NoError(t, s.Synchronize())
		return string(got)
	}

	ep, err := ExportPool(pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	require.NoError(t, rx.SendPointer(ep, a))
	ia, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	ib := ia + (b - a) // where b lies in the importer's mapping
	require.Len(t, ip.Chunks(), 1, "a and b lie on one chunk, mapped here")

	got := make([]byte, 64)
	require.NoError(t, ip.Read(0, ia, got))
	require.Equal(t, strings.Repeat("a", 64), string(got))
	require.NoError(t, ip.Write(0, ia+8, []byte("xyz")))
	require.Equal(t, "aaaaaaaaxyzaa", exporter(a, 13), "the exporter sees the importer's write")
	require.NoError(t, ip.Read(0, ia+60, make([]byte, 4)), "the pointer's last bytes")
	require.NoError(t, ip.Read(0, ia, nil), "nothing, inside a pointer")

	chunks := ip.Chunks()
	base, end := ip.res.Base(), ip.res.Range().End()
	for _, c := range []struct {
		name string
		at   driver.Addr
		n    int
		dev  driver.DeviceID
		want error
		msg  string
	}{
		{"across the pointer's end", ia + 60, 8, 0, driver.ErrAccessDenied, "not inside one pointer imported"},
		{"another allocation on the chunk", ib, 8, 0, driver.ErrAccessDenied, "not inside one pointer imported"},
		{"before the pool", base - 1, 1, 0, driver.ErrNotReserved, "outside the pool's range"},
		{"past the pool", end, 1, 0, driver.ErrNotReserved, "outside the pool's range"},
		{"running past the pool", end - 4, 8, 0, driver.ErrNotReserved, "outside the pool's range"},
		{"the top of the address space", ^driver.Addr(0), 8, 0, driver.ErrNotReserved, "outside the pool's range"},
		{"a device the driver lacks", ia, 8, 1, driver.ErrNoDevice, "device 1"},
	} {
		before := exporter(a, 64) + exporter(b, 64)
		drivertest.RequireIs(t, ip.Read(c.dev, c.at, make([]byte, c.n)), c.want, c.msg)
		drivertest.RequireIs(t, ip.Write(c.dev, c.at, bytes.Repeat([]byte{'!'}, c.n)), c.want, c.msg)
		require.Equal(t, before, exporter(a, 64)+exporter(b, 64), "%s: a refused write changes no byte", c.name)
		require.Equal(t, chunks, ip.Chunks(), c.name)
		require.NoError(t, ip.Check(), c.name)
	}

	require.NoError(t, ip.Free(ia))
	_, err = rx.RecvRelease(ep)
	require.NoError(t, err)
	drivertest.RequireIs(t, ip.Read(0, ia, got), driver.ErrAccessDenied, "not yet freed")
	drivertest.RequireIs(t, ip.Write(0, ia, []byte("late")), driver.ErrAccessDenied, "not yet freed")
	require.Equal(t, "aaaaaaaaxyzaa", exporter(a, 13), "a write after Free changes nothing")
	require.NoError(t, ip.Close())
	drivertest.RequireIs(t, ip.Read(0, ia, got), driver.ErrClosed, "the pool is closed")
	drivertest.RequireIs(t, ip.Write(0, ia, []byte("late")), driver.ErrClosed, "the pool is closed")
	require.NoError(t, pl.FreeAsync(a, s))
	require.NoError(t, pl.FreeAsync(b, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
}
