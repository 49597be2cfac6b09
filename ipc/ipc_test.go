package ipc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The failure tests run real child processes: the test binary re-executed
// with VMARENA_IPC_CHILD naming the role, which TestMain runs instead of
// the tests.

// chunkSize is large so that the kernel's Shmem figure, which tests of other
// packages running at the same time also move, shows this memory plainly.
const chunkSize = 256 * units.MiB

func TestMain(m *testing.M) {
	if role := os.Getenv("VMARENA_IPC_CHILD"); role != "" {
		if err := child(role, os.Getenv("VMARENA_IPC_SOCK")); err != nil {
			fmt.Println("child error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is one process's host-driver stack.
type proc struct {
	drv   *host.Driver
	mem   *physical.Memory
	res   *vaspace.Reservation
	tab   *mapping.Table
	space *vaspace.Space
}

func newProc() (*proc, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 4 * chunkSize})
	if err != nil {
		return nil, err
	}
	p := &proc{drv: drv, mem: physical.New(drv), space: vaspace.New(drv)}
	if p.res, err = p.space.Reserve(4*chunkSize, 0); err != nil {
		return nil, err
	}
	if p.tab, err = mapping.New(p.res, p.mem); err != nil {
		return nil, err
	}
	return p, nil
}

// mapRW maps c at the reservation's base, read-write for device 0.
func (p *proc) mapRW(c *physical.Chunk) error {
	if err := p.tab.Map(p.res.Base(), c); err != nil {
		return err
	}
	return p.tab.SetAccess(p.res.Base(), c.Size(), 0, driver.AccessReadWrite)
}

func (p *proc) close() {
	_ = p.tab.Close()
	_ = p.res.Free()
	_ = p.mem.Close()
	_ = p.drv.Close()
}

func (p *proc) used() uint64 {
	u, _ := p.mem.Usage(0)
	return u.Used
}

func fdCount() int {
	es, _ := os.ReadDir("/proc/self/fd")
	return len(es) - 1
}

// shmemKiB is the machine's shared memory (memfd pages), in KiB.
func shmemKiB() uint64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Shmem:" {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// child runs one role in a child process; it talks to the parent on sock
// and prints "key value" lines on stdout for the parent to check.
func child(role, sock string) error {
	conn, err := Dial(sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	switch role {
	case "import", "crash": // receive, map, read the parent's bytes, write ours
		p, err := newProc()
		if err != nil {
			return err
		}
		c, err := conn.RecvChunk(p.mem, 0)
		if err != nil {
			return err
		}
		if err := p.mapRW(c); err != nil {
			return err
		}
		got := make([]byte, 5)
		if err := p.tab.Read(0, p.res.Base(), got); err != nil {
			return err
		}
		fmt.Println("read", string(got))
		fmt.Println("used", p.used())
		if err := p.tab.Write(0, p.res.Base()+driver.Addr(chunkSize-5), []byte("child")); err != nil {
			return err
		}
		if role == "crash" {
			fmt.Println("crashing")
			_ = unix.Kill(os.Getpid(), unix.SIGKILL) // no cleanup of any kind
		}
		if err := conn.send(KindRelease, 0, []byte("wrote")); err != nil {
			return err
		}
		if _, err := conn.recv(); err != nil { // the parent says: release now
			return err
		}
		if err := p.tab.Unmap(p.res.Base()); err != nil {
			return err
		}
		if err := c.Release(); err != nil {
			return err
		}
		fmt.Println("used", p.used())
		p.close()
		return conn.send(KindRelease, 0, []byte("released"))
	case "export": // the child exports to the parent and exits at once
		p, err := newProc()
		if err != nil {
			return err
		}
		c, err := p.mem.Create(0, chunkSize, driver.ChunkOptions{Shareable: true})
		if err != nil {
			return err
		}
		if err := p.mapRW(c); err != nil {
			return err
		}
		if err := p.tab.Write(0, p.res.Base(), []byte("from the child")); err != nil {
			return err
		}
		if _, err := c.Export(os.Getppid()); err != nil {
			return err
		}
		if err := conn.SendChunk(c); err != nil {
			return err
		}
		_, _ = conn.recv() // the parent has imported it
		p.close()
		return nil
	case "refused": // the parent will refuse us: no descriptor may arrive
		before := fdCount()
		p, err := newProc()
		if err != nil {
			return err
		}
		defer p.close()
		_, err = conn.RecvChunk(p.mem, 0)
		fmt.Println("refused", errors.Is(err, driver.ErrAccessDenied), strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
		p.close()
		fmt.Println("fds", before, fdCount())
		return nil
	case "pool":
		return poolChild(conn)
	case "garbage": // read malformed messages from the parent; leak nothing
		before := fdCount()
		p, err := newProc()
		if err != nil {
			return err
		}
		var kinds []string
		for i := 0; i < 6; i++ {
			_, err := conn.RecvChunk(p.mem, 0)
			kinds = append(kinds, fmt.Sprint(errors.Is(err, ErrProtocol) || errors.Is(err, driver.ErrInvalid)))
		}
		fmt.Println("errors", strings.Join(kinds, ","))
		p.close()
		fmt.Println("fds", before, fdCount())
		return nil
	}
	return errors.Newf("unknown role %q", role)
}

// spawn starts the test binary as a child in role, connected to l, and
// returns the parent's end of the connection and the child.
func spawn(t *testing.T, l *Listener, role string) (*Conn, *exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMARENA_IPC_CHILD="+role, "VMARENA_IPC_SOCK="+l.Path())
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	conn, err := l.Accept()
	require.NoError(t, err)
	require.Equal(t, cmd.Process.Pid, conn.PeerPID(), "SO_PEERCRED names the child")
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	t.Cleanup(func() { _ = conn.Close() })
	return conn, cmd, out
}

// syncBuffer collects a child's output; the copying goroutine writes while
// a failing assertion may read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func listen(t *testing.T) *Listener {
	t.Helper()
	l, err := Listen(filepath.Join(t.TempDir(), "vmarena.sock"), 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// lines parses the child's "key value" output.
func lines(out string) map[string][]string {
	m := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		m[k] = append(m[k], v)
	}
	return m
}

// exported makes a shareable chunk, mapped and filled with "hello", and
// exports it to pids.
func exported(t *testing.T, p *proc, pids ...int) *physical.Chunk {
	t.Helper()
	c, err := p.mem.Create(0, chunkSize, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	require.NoError(t, p.mapRW(c))
	require.NoError(t, p.tab.Write(0, p.res.Base(), []byte("hello")))
	_, err = c.Export(pids...)
	require.NoError(t, err)
	return c
}

// TestShareWithChild: a child imports the chunk, each process sees the
// other's writes, and the memory goes only when both have released it.
func TestShareWithChild(t *testing.T) {
	shmem0 := shmemKiB()
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "import")
	c := exported(t, p, cmd.Process.Pid)
	require.NoError(t, conn.SendChunk(c))
	m, err := conn.recv() // the child wrote its bytes
	require.NoError(t, err, out.String())
	require.Equal(t, KindRelease, m.kind)
	got := make([]byte, 5)
	require.NoError(t, p.tab.Read(0, p.res.Base()+driver.Addr(chunkSize-5), got))
	require.Equal(t, "child", string(got), "the parent sees the child's write")

	// The parent releases first: its usage drops, the memory stays.
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
	require.Zero(t, p.used())
	require.Greater(t, shmemKiB(), shmem0+chunkSize/units.KiB*3/4, "the child still holds the memory")
	require.NoError(t, conn.send(KindRelease, 0, nil))
	m, err = conn.recv()
	require.NoError(t, err, out.String())
	require.Equal(t, "released", string(m.body))
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"hello"}, kv["read"], "the child read the parent's bytes")
	require.Equal(t, []string{fmt.Sprint(chunkSize), "0"}, kv["used"], "the child's usage counts the import until it releases")
	require.Less(t, shmemKiB(), shmem0+chunkSize/units.KiB/4, "released in both processes: the memory went back")
}

// TestImporterCrashes: the importer is killed while the memory is mapped;
// the exporter's data is intact and the memory goes when it releases.
func TestImporterCrashes(t *testing.T) {
	shmem0 := shmemKiB()
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "crash")
	c := exported(t, p, cmd.Process.Pid)
	require.NoError(t, conn.SendChunk(c))
	require.Error(t, cmd.Wait(), "the child was killed")
	require.Contains(t, out.String(), "crashing")
	got := make([]byte, 5)
	require.NoError(t, p.tab.Read(0, p.res.Base(), got))
	require.Equal(t, "hello", string(got), "the exporter's data is intact")
	require.NoError(t, p.tab.Read(0, p.res.Base()+driver.Addr(chunkSize-5), got))
	require.Equal(t, "child", string(got), "and it sees what the child wrote before dying")
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
	require.Less(t, shmemKiB(), shmem0+chunkSize/units.KiB/4, "the memory went when the exporter released it")
}

// TestExporterExits: the child exports and exits; the parent keeps reading.
func TestExporterExits(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "export")
	c, err := conn.RecvChunk(p.mem, 0)
	require.NoError(t, err, out.String())
	require.True(t, c.Imported())
	require.NoError(t, conn.send(KindRelease, 0, nil))
	require.NoError(t, cmd.Wait(), out.String())
	require.NoError(t, p.mapRW(c))
	got := make([]byte, 14)
	require.NoError(t, p.tab.Read(0, p.res.Base(), got))
	require.Equal(t, "from the child", string(got), "the exporter is gone; its memory is not")
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
}

// TestNotAllowed: a process not on the allow-list is refused, told why,
// and gets no descriptor.
func TestNotAllowed(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "refused")
	c := exported(t, p, os.Getpid()) // not the child
	drivertest.RequireIs(t, conn.SendChunk(c), driver.ErrAccessDenied, fmt.Sprintf("process %d is not on the allow-list", cmd.Process.Pid))
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Len(t, kv["refused"], 1)
	require.True(t, strings.HasPrefix(kv["refused"][0], "true "), kv["refused"][0])
	require.Contains(t, kv["refused"][0], "not on the allow-list")
	f := strings.Fields(kv["fds"][0])
	require.Equal(t, f[0], f[1], "no descriptor reached the refused process")
	require.NoError(t, c.SetAllowedPIDs(cmd.Process.Pid))
	require.True(t, c.Allowed(cmd.Process.Pid))
}

// TestMalformedMessages: bad magic, truncated, oversized, wrong descriptor
// counts, wrong handle type, a non-memory descriptor — each an error in
// the child, with every descriptor that came along closed.
func TestMalformedMessages(t *testing.T) {
	l := listen(t)
	conn, cmd, out := spawn(t, l, "garbage")
	devnull, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer devnull.Close()
	fd := int(devnull.Fd())
	raw := func(b []byte, fds ...int) {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		_, _, err := conn.c.WriteMsgUnix(b, oob, nil)
		require.NoError(t, err)
	}
	good := header{kind: KindChunk, htype: driver.HandlePOSIXFD, nfds: 1, payload: 12}.encode()
	bad := append([]byte("XXXX"), good[4:]...)
	raw(append(bad, make([]byte, 12)...), fd)                             // bad magic, with a descriptor
	raw(good[:7], fd)                                                     // truncated header, with a descriptor
	raw(append(good, make([]byte, MaxPayload+50)...), fd)                 // oversized
	raw(append(clone(good), make([]byte, 12)...), fd, fd, fd, fd, fd, fd) // too many descriptors
	wrongType := header{kind: KindChunk, htype: driver.HandleToken, nfds: 1, payload: 12}.encode()
	raw(append(wrongType, make([]byte, 12)...), fd) // wrong handle type
	payload := make([]byte, 12)
	payload[0] = 1 // a 1-byte "chunk": /dev/null is no memory file
	raw(append(clone(good), payload...), fd)
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"true,true,true,true,true,true"}, kv["errors"], out.String())
	f := strings.Fields(kv["fds"][0])
	require.Equal(t, f[0], f[1], "the child closed every descriptor that came with a bad message")
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// TestParentLeaksNothing: the same malformed traffic in this process, and
// the descriptor count afterwards.
func TestParentLeaksNothing(t *testing.T) {
	l := listen(t)
	a, err := Dial(l.Path())
	require.NoError(t, err)
	defer a.Close()
	b, err := l.Accept()
	require.NoError(t, err)
	defer b.Close()
	before := fdCount()
	devnull, err := os.Open(os.DevNull)
	require.NoError(t, err)
	good := header{kind: KindChunk, htype: driver.HandlePOSIXFD, nfds: 1, payload: 12}.encode()
	_, _, err = a.c.WriteMsgUnix(append([]byte("nope"), good[4:]...), unix.UnixRights(int(devnull.Fd())), nil)
	require.NoError(t, err)
	devnull.Close()
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	_, err = b.RecvChunk(p.mem, 0)
	drivertest.RequireIs(t, err, ErrProtocol, "bad magic")
	p.close()
	require.Equal(t, before, fdCount(), "the descriptor that came with the bad message was closed")

	// Export rules in one process: only shareable chunks, once.
	q, err := newProc()
	require.NoError(t, err)
	defer q.close()
	plain, err := q.mem.Create(0, chunkSize, driver.ChunkOptions{})
	require.NoError(t, err)
	_, err = plain.Export()
	drivertest.RequireIs(t, err, driver.ErrInvalid, "without ChunkOptions.Shareable")
	sh, err := q.mem.Create(0, chunkSize, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	_, err = sh.Export(1)
	require.NoError(t, err)
	_, err = sh.Export(1)
	drivertest.RequireIs(t, err, driver.ErrBusy, "one shareable handle per chunk")
	drivertest.RequireIs(t, a.SendChunk(plain), driver.ErrInvalid, "not exported")
}

// TestListenSetsPermissions: who may connect at all is the socket path's
// permissions. (The tests run as root, whom permissions do not stop, so
// this checks the mode Listen sets; a non-root peer is refused by the
// kernel's own check on connect.)
func TestListenSetsPermissions(t *testing.T) {
	for _, perm := range []os.FileMode{0o600, 0o660} {
		path := filepath.Join(t.TempDir(), "p.sock")
		l, err := Listen(path, perm)
		require.NoError(t, err)
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, perm, st.Mode().Perm())
		require.NotZero(t, st.Mode()&os.ModeSocket)
		_, err = Listen(path, perm)
		require.Error(t, err, "a path in use is refused")
		require.NoError(t, l.Close())
		_, err = os.Stat(path)
		require.True(t, os.IsNotExist(err), "Close removes the socket file")
	}
}
