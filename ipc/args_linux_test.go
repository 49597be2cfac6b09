package ipc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// queued is how many bytes wait to be read at c's end of the connection.
func queued(t *testing.T, c *Conn) int {
	t.Helper()
	raw, err := c.c.SyscallConn()
	require.NoError(t, err)
	var n int
	var qerr error
	require.NoError(t, raw.Control(func(fd uintptr) { n, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }))
	require.NoError(t, qerr)
	return n
}

// argCase is one call that must fail with want, naming msg.
type argCase struct {
	name string
	call func() error
	want error
	msg  string
}

// runArgCases runs each case in a subtest: the call must not panic, must
// fail marked with its sentinel, and must leave what now reports as it
// was before.
func runArgCases[S any](t *testing.T, cases []argCase, now func(t *testing.T) S) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := now(t)
			var err error
			require.NotPanics(t, func() { err = c.call() })
			drivertest.RequireIs(t, err, c.want, c.msg)
			require.Equal(t, before, now(t), "a refused call changes nothing")
		})
	}
}

// TestNilArguments: every exported function and method of the package,
// given a nil or zero-value receiver or argument, or a path, mode, device
// or pointer no call could use, returns an error marked with the sentinel
// that says so — never a panic — and changes nothing: no socket file, no
// descriptor, no message read or sent (the bytes waiting at each end stay),
// no import counted, no chunk mapped. The messages that waited are then
// received whole. (SendChunk(nil), ExportPool(nil), RecvChunk with a nil
// memory and every method of a nil Conn once panicked; RecvPool with a
// nil space read the pool's message before it failed.)
func TestNilArguments(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	other, err := newProc() // another driver
	require.NoError(t, err)
	defer other.close()
	simDrv, err := sim.New(sim.Options{}) // no sharing
	require.NoError(t, err)
	defer simDrv.Close()
	dir := t.TempDir()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()

	// rx exports a pool and a chunk; tx imports the pool and one pointer
	// (sent twice, freed once: one release waits at rx), and the chunk
	// waits at tx.
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
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
	ia, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	_, err = tx.RecvPointer(ip)
	require.NoError(t, err)
	require.NoError(t, ip.Free(ia))
	c := exported(t, p, os.Getpid())
	require.NoError(t, rx.SendChunk(c))

	type state struct {
		files              []string
		fds                int
		used               uint64
		holds              int
		chunks             []ImportedChunk
		ptrs               map[driver.Addr]importedPtr
		queuedTx, queuedRx int
	}
	now := func(t *testing.T) state {
		es, err := os.ReadDir(dir)
		require.NoError(t, err)
		var files []string
		for _, e := range es {
			files = append(files, e.Name())
		}
		require.NoError(t, ip.Check())
		require.NoError(t, p.mem.Check())
		ip.mu.Lock()
		ptrs := map[driver.Addr]importedPtr{}
		for k, v := range ip.ptrs {
			ptrs[k] = v
		}
		ip.mu.Unlock()
		return state{files: files, fds: fdCount(), used: p.used(), holds: rx.Holds(), chunks: ip.Chunks(), ptrs: ptrs,
			queuedTx: queued(t, tx), queuedRx: queued(t, rx)}
	}
	start := now(t)
	require.Positive(t, start.queuedTx, "a chunk waits at tx")
	require.Positive(t, start.queuedRx, "a release waits at rx")
	require.Equal(t, 2, start.holds, "sent twice; the release not yet received")

	var (
		nilConn  *Conn
		zeroConn = &Conn{}
		nilL     *Listener
		zeroL    = &Listener{}
		nilEP    *ExportedPool
		zeroEP   = &ExportedPool{}
		nilIP    *ImportedPool
		zeroIP   = &ImportedPool{}
	)
	cases := []argCase{
		{"Listen empty path", func() error { _, err := Listen("", 0o600); return err }, driver.ErrInvalid, "the socket path is empty"},
		{"Listen path too long", func() error { _, err := Listen(filepath.Join(dir, strings.Repeat("x", 120)), 0o600); return err }, driver.ErrInvalid, "more than the 107"},
		{"Listen path with NUL", func() error { _, err := Listen(filepath.Join(dir, "a\x00b"), 0o600); return err }, driver.ErrInvalid, "NUL"},
		{"Listen abstract name", func() error { _, err := Listen("@vmarena", 0o600); return err }, driver.ErrInvalid, "abstract socket"},
		{"Listen mode 0", func() error { _, err := Listen(filepath.Join(dir, "m.sock"), 0); return err }, driver.ErrInvalid, "with write for someone"},
		{"Listen mode read-only", func() error { _, err := Listen(filepath.Join(dir, "m.sock"), 0o444); return err }, driver.ErrInvalid, "with write for someone"},
		{"Listen mode not permissions", func() error { _, err := Listen(filepath.Join(dir, "m.sock"), os.ModeDir|0o600); return err }, driver.ErrInvalid, "permission bits alone"},
		{"Dial empty path", func() error { _, err := Dial(""); return err }, driver.ErrInvalid, "the socket path is empty"},
		{"Dial path too long", func() error { _, err := Dial(filepath.Join(dir, strings.Repeat("x", 120))); return err }, driver.ErrInvalid, "more than the 107"},
		{"Dial abstract name", func() error { _, err := Dial("@vmarena"); return err }, driver.ErrInvalid, "abstract socket"},

		{"nil Listener Accept", func() error { _, err := nilL.Accept(); return err }, driver.ErrInvalid, "not made by Listen"},
		{"zero Listener Accept", func() error { _, err := zeroL.Accept(); return err }, driver.ErrInvalid, "not made by Listen"},
		{"nil Listener Close", nilL.Close, driver.ErrInvalid, "not made by Listen"},
		{"zero Listener Close", zeroL.Close, driver.ErrInvalid, "not made by Listen"},

		{"SendChunk nil", func() error { return tx.SendChunk(nil) }, driver.ErrInvalid, "the chunk is nil"},
		{"SendChunk zero Chunk", func() error { return tx.SendChunk(&physical.Chunk{}) }, driver.ErrInvalid, "not exported"},
		{"RecvChunk nil memory", func() error { _, err := tx.RecvChunk(nil, 0); return err }, driver.ErrInvalid, "the physical memory is nil"},
		{"RecvChunk memory without driver", func() error { _, err := tx.RecvChunk(physical.New(nil), 0); return err }, driver.ErrInvalid, "has no driver"},
		{"RecvChunk memory that cannot share", func() error { _, err := tx.RecvChunk(physical.New(simDrv), 0); return err }, driver.ErrUnsupported, "cannot share chunks"},
		{"RecvChunk device it lacks", func() error { _, err := tx.RecvChunk(p.mem, 1); return err }, driver.ErrNoDevice, "device 1"},
		{"RecvChunk negative device", func() error { _, err := tx.RecvChunk(p.mem, -1); return err }, driver.ErrNoDevice, "device -1"},

		{"ExportPool nil", func() error { _, err := ExportPool(nil); return err }, driver.ErrInvalid, "the pool is nil"},
		{"ExportPool zero Pool", func() error { _, err := ExportPool(&pool.Pool{}); return err }, driver.ErrInvalid, "without pool.Props.Shareable"},
		{"ExportPool PID 0", func() error { _, err := ExportPool(pl, 0); return err }, driver.ErrInvalid, "process ID 0"},
		{"SetAllowedPIDs PID 0", func() error { return ep.SetAllowedPIDs(os.Getpid(), 0) }, driver.ErrInvalid, "process ID 0"},
		{"nil ExportedPool SetAllowedPIDs", func() error { return nilEP.SetAllowedPIDs(1) }, driver.ErrInvalid, "not made by ExportPool"},
		{"zero ExportedPool SetAllowedPIDs", func() error { return zeroEP.SetAllowedPIDs(1) }, driver.ErrInvalid, "not made by ExportPool"},
		{"SendPool nil", func() error { return rx.SendPool(nil) }, driver.ErrInvalid, "not made by ExportPool"},
		{"SendPool zero ExportedPool", func() error { return rx.SendPool(zeroEP) }, driver.ErrInvalid, "not made by ExportPool"},
		{"SendPointer nil pool", func() error { return rx.SendPointer(nil, ptr) }, driver.ErrInvalid, "not made by ExportPool"},
		{"SendPointer zero ExportedPool", func() error { return rx.SendPointer(zeroEP, ptr) }, driver.ErrInvalid, "not made by ExportPool"},
		{"SendPointer zero pointer", func() error { return rx.SendPointer(ep, 0) }, driver.ErrNotAllocated, "export pointer"},
		// tx never sent the pool: its peer could take no pointer of it, nor release one.
		{"SendPointer of a pool not sent", func() error { return tx.SendPointer(ep, ptr) }, driver.ErrInvalid, "the pool was not sent on this connection"},
		{"RecvRelease nil pool", func() error { _, err := rx.RecvRelease(nil); return err }, driver.ErrInvalid, "not made by ExportPool"},
		{"RecvRelease zero ExportedPool", func() error { _, err := rx.RecvRelease(zeroEP); return err }, driver.ErrInvalid, "not made by ExportPool"},
		{"RecvPool nil space", func() error { _, err := tx.RecvPool(nil, p.mem, 0); return err }, driver.ErrInvalid, "the address space is nil"},
		{"RecvPool space without driver", func() error { _, err := tx.RecvPool(vaspace.New(nil), p.mem, 0); return err }, driver.ErrInvalid, "has no driver"},
		{"RecvPool nil memory", func() error { _, err := tx.RecvPool(p.space, nil, 0); return err }, driver.ErrInvalid, "the physical memory is nil"},
		{"RecvPool space and memory of two drivers", func() error { _, err := tx.RecvPool(other.space, p.mem, 0); return err }, driver.ErrInvalid, "different drivers"},
		{"RecvPool device it lacks", func() error { _, err := tx.RecvPool(p.space, p.mem, 3); return err }, driver.ErrNoDevice, "device 3"},
		{"RecvPointer nil pool", func() error { _, err := tx.RecvPointer(nil); return err }, driver.ErrInvalid, "not made by Conn.RecvPool"},
		{"RecvPointer zero ImportedPool", func() error { _, err := tx.RecvPointer(zeroIP); return err }, driver.ErrInvalid, "not made by Conn.RecvPool"},
		{"RecvPointer on another connection", func() error { _, err := rx.RecvPointer(ip); return err }, driver.ErrInvalid, "came on another connection"},
		{"ImportedPool Free zero pointer", func() error { return ip.Free(0) }, driver.ErrNotAllocated, "not a pointer imported"},
	}
	for _, cn := range []struct {
		name string
		c    *Conn
	}{{"nil Conn", nilConn}, {"zero Conn", zeroConn}} {
		conn := cn.c
		for _, m := range []struct {
			name string
			call func() error
		}{
			{"SetDeadline", func() error { return conn.SetDeadline(time.Now()) }},
			{"Close", conn.Close},
			{"SendChunk", func() error { return conn.SendChunk(c) }},
			{"RecvChunk", func() error { _, err := conn.RecvChunk(p.mem, 0); return err }},
			{"SendPool", func() error { return conn.SendPool(ep) }},
			{"SendPointer", func() error { return conn.SendPointer(ep, ptr) }},
			{"RecvRelease", func() error { _, err := conn.RecvRelease(ep); return err }},
			{"RecvPool", func() error { _, err := conn.RecvPool(p.space, p.mem, 0); return err }},
			{"RecvPointer", func() error { _, err := conn.RecvPointer(ip); return err }},
			{"PeerExited", func() error { _, err := conn.PeerExited(); return err }},
			{"ReleaseIfGone", func() error { _, err := conn.ReleaseIfGone(); return err }},
		} {
			cases = append(cases, argCase{cn.name + " " + m.name, m.call, driver.ErrInvalid, "not made by Dial or Listener.Accept"})
		}
	}
	for _, pn := range []struct {
		name string
		ip   *ImportedPool
	}{{"nil ImportedPool", nilIP}, {"zero ImportedPool", zeroIP}} {
		ipool := pn.ip
		for _, m := range []struct {
			name string
			call func() error
		}{
			{"Read", func() error { return ipool.Read(0, ia, make([]byte, 8)) }},
			{"Write", func() error { return ipool.Write(0, ia, make([]byte, 8)) }},
			{"Free", func() error { return ipool.Free(ia) }},
			{"Close", ipool.Close},
			{"Check", ipool.Check},
			{"MallocAsync", func() error { _, err := ipool.MallocAsync(64); return err }},
		} {
			cases = append(cases, argCase{pn.name + " " + m.name, m.call, driver.ErrInvalid, "not made by Conn.RecvPool"})
		}
	}
	runArgCases(t, cases, now)

	// What answers with a value gives one that names no one.
	for _, conn := range []*Conn{nilConn, zeroConn} {
		require.Equal(t, -1, conn.PeerPID())
		require.Equal(t, -1, conn.PeerUID(), "not 0, which is root")
		require.Zero(t, conn.Holds())
	}
	require.Empty(t, nilL.Path())
	require.Empty(t, zeroL.Path())
	require.Nil(t, nilIP.Chunks())
	require.Nil(t, zeroIP.Chunks())
	require.Equal(t, start, now(t))

	// The messages that waited are whole: the chunk, then the release.
	got, err := tx.RecvChunk(p.mem, 0)
	require.NoError(t, err)
	require.Equal(t, c.Size(), got.Size())
	require.NoError(t, got.Release())
	released, err := rx.RecvRelease(ep)
	require.NoError(t, err)
	require.Equal(t, ptr, released)
	require.NoError(t, ip.Free(ia))
	_, err = rx.RecvRelease(ep)
	require.NoError(t, err)
	require.NoError(t, ip.Close())
	require.NoError(t, pl.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
}

// TestClosedObjects: a closed Listener, Conn or ImportedPool answers every
// call with ErrClosed naming what is closed, and changes nothing — no
// message sent, no import counted, no descriptor — while what is meant to
// work after Close (PeerExited, ReleaseIfGone, Holds, Check) still does.
// (A second Conn.Close does not run its release of the peer's imports
// again, and a send on a closed connection is marked with ErrClosed.)
func TestClosedObjects(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l, err := Listen(filepath.Join(t.TempDir(), "closed.sock"), 0o600)
	require.NoError(t, err)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	require.NoError(t, l.Close())
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
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
	require.NoError(t, ip.Close())
	c := exported(t, p, os.Getpid())

	type state struct {
		fds, holdsTx, holdsRx, queuedRx int
		used                            uint64
	}
	now := func(t *testing.T) state {
		require.NoError(t, ip.Check(), "a closed pool has nothing left to break")
		return state{fds: fdCount(), holdsTx: tx.Holds(), holdsRx: rx.Holds(), queuedRx: queued(t, rx), used: p.used()}
	}
	runArgCases(t, []argCase{
		{"Listener Accept", func() error { _, err := l.Accept(); return err }, driver.ErrClosed, "accept on " + l.Path()},
		{"Listener Close", l.Close, driver.ErrClosed, "close the listener on " + l.Path()},
		{"ImportedPool Read", func() error { return ip.Read(0, ip.res.Base(), make([]byte, 8)) }, driver.ErrClosed, "the pool is closed"},
		{"ImportedPool Write", func() error { return ip.Write(0, ip.res.Base(), make([]byte, 8)) }, driver.ErrClosed, "the pool is closed"},
		{"ImportedPool Free", func() error { return ip.Free(ip.res.Base()) }, driver.ErrClosed, "the imported pool is closed"},
		{"ImportedPool Close", ip.Close, driver.ErrClosed, "close of a closed imported pool"},
		{"ImportedPool MallocAsync", func() error { _, err := ip.MallocAsync(64); return err }, driver.ErrClosed, "the imported pool is closed"},
		{"RecvPointer into a closed ImportedPool", func() error { _, err := tx.RecvPointer(ip); return err }, driver.ErrClosed, "closed imported pool"},
	}, now)

	require.NoError(t, tx.Close())
	closed := "the connection on " + l.Path() + " is closed"
	runArgCases(t, []argCase{
		{"Conn SetDeadline", func() error { return tx.SetDeadline(time.Now()) }, driver.ErrClosed, closed},
		{"Conn Close", tx.Close, driver.ErrClosed, closed},
		{"Conn SendChunk", func() error { return tx.SendChunk(c) }, driver.ErrClosed, closed},
		{"Conn RecvChunk", func() error { _, err := tx.RecvChunk(p.mem, 0); return err }, driver.ErrClosed, closed},
		{"Conn SendPool", func() error { return tx.SendPool(ep) }, driver.ErrClosed, closed},
		{"Conn SendPointer", func() error { return tx.SendPointer(ep, ptr) }, driver.ErrClosed, closed},
		{"Conn RecvRelease", func() error { _, err := tx.RecvRelease(ep); return err }, driver.ErrClosed, closed},
		{"Conn RecvPool", func() error { _, err := tx.RecvPool(p.space, p.mem, 0); return err }, driver.ErrClosed, closed},
		{"Conn RecvPointer", func() error { _, err := tx.RecvPointer(ip); return err }, driver.ErrClosed, closed},
	}, now)
	exited, err := tx.PeerExited()
	require.NoError(t, err, "answers after Close")
	require.False(t, exited, "this very process")
	n, err := tx.ReleaseIfGone()
	require.NoError(t, err, "answers after Close")
	require.Zero(t, n)
	require.Equal(t, os.Getpid(), tx.PeerPID())

	require.NoError(t, pl.FreeAsync(ptr, s), "no import was counted")
	require.NoError(t, s.Synchronize())
	require.NoError(t, pl.Destroy())
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
}
