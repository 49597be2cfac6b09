package ipc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
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

// chunkSize is the size of the chunks the tests share. What a test checks
// of their memory is its own (the chunk's memory file and the mappings of
// the processes that share it), never a figure of the whole machine that
// other processes move, so it can be small.
const chunkSize = 16 * units.MiB

func TestMain(m *testing.M) {
	if os.Getenv("VMARENA_IPC_CHILD") == "commit" {
		if err := commitAndHold(); err != nil {
			fmt.Println("commit error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
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

// memFile is a chunk's memory file as a test sees it: its identity
// (device and inode) and a descriptor of the test's own, the probe, through
// which it reads the blocks the kernel holds for the file. The probe keeps
// the file alive; the test checks who else refers to it.
type memFile struct {
	dev, ino uint64
	probe    int
}

// openMemFile identifies the memory file behind descriptor fd.
func openMemFile(t *testing.T, fd int) *memFile {
	t.Helper()
	probe, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(probe) })
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(probe, &st))
	return &memFile{dev: st.Dev, ino: st.Ino, probe: probe}
}

// committed is the memory the kernel holds for the file (its allocated
// blocks), in bytes.
func (f *memFile) committed(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(f.probe, &st))
	return uint64(st.Blocks) * 512
}

// holds is what one process holds of the file: descriptors (the probe
// aside) and mappings. A process that is gone holds nothing.
type holds struct{ FDs, Maps int }

// heldBy reads process pid's descriptors (/proc/<pid>/fd) and mappings
// (/proc/<pid>/maps) that refer to the file.
func (f *memFile) heldBy(t *testing.T, pid int) holds {
	t.Helper()
	var h holds
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return h
	}
	require.NoError(t, err)
	for _, e := range fds {
		n, _ := strconv.Atoi(e.Name())
		var st unix.Stat_t
		if pid == os.Getpid() && n == f.probe || unix.Stat(filepath.Join(dir, e.Name()), &st) != nil {
			continue // the probe, or a descriptor closed meanwhile
		}
		if st.Dev == f.dev && st.Ino == f.ino {
			h.FDs++
		}
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if os.IsNotExist(err) {
		return h
	}
	require.NoError(t, err)
	dev := fmt.Sprintf("%02x:%02x", unix.Major(f.dev), unix.Minor(f.dev))
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode [path]
		if fs := strings.Fields(line); len(fs) >= 5 && fs[3] == dev && fs[4] == strconv.FormatUint(f.ino, 10) {
			h.Maps++
		}
	}
	return h
}

// child runs one role in a child process; it talks to the parent on sock
// and prints "key value" lines on stdout for the parent to check.
func child(role, sock string) error {
	conn, err := Dial(sock)
	if err != nil {
		return err
	}
	defer conn.Close() // no deadline: a parent that goes away ends the connection
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
	case "truncate": // an importer on the allow-list resizes what it received
		m, err := conn.recv()
		if err != nil {
			return err
		}
		defer closeAll(m.fds)
		if m.kind != KindChunk || len(m.fds) != 1 {
			return errors.Newf("a %s message with %d descriptors", m.kind, len(m.fds))
		}
		var st unix.Stat_t
		if err := unix.Fstat(m.fds[0], &st); err != nil {
			return err
		}
		seals, err := unix.FcntlInt(uintptr(m.fds[0]), unix.F_GET_SEALS, 0)
		fmt.Println("seals", seals, err)
		fmt.Println("shrink", errnoName(unix.Ftruncate(m.fds[0], 0)))
		fmt.Println("grow", errnoName(unix.Ftruncate(m.fds[0], 2*st.Size)))
		if err := unix.Fstat(m.fds[0], &st); err != nil {
			return err
		}
		fmt.Println("size", st.Size)
		return conn.send(KindRelease, 0, []byte("tried"))
	case "pool":
		return poolChild(conn)
	case "acl-import", "acl-pool":
		return aclChild(role, conn)
	case "pool-hold", "pool-disconnect":
		return poolHoldChild(conn, role == "pool-disconnect")
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

// errnoName is "ok" for no error, else the errno's name (EPERM).
func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return fmt.Sprint(err)
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
	t.Cleanup(func() { _ = conn.Close() }) // no deadline: a child that hangs is go test -timeout's
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
func TestShareWithChild(t *testing.T) { shareWithChild(t, func() {}) }

// TestShareWithChildBesideOtherProcesses is TestShareWithChild while
// another process commits memory of its own once the test has begun, as
// other test binaries running at the same time do: the test's figures
// must be its own, not the machine's.
func TestShareWithChildBesideOtherProcesses(t *testing.T) {
	shareWithChild(t, func() { otherProcessCommits(t, 4*chunkSize) })
}

// otherProcessCommits starts a process, unrelated to the test, that
// commits size bytes of memfd memory and holds them until the test ends.
func otherProcessCommits(t *testing.T, size uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMARENA_IPC_CHILD=commit", fmt.Sprintf("VMARENA_IPC_COMMIT=%d", size))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close() // the process exits when its stdin closes
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		<-done
	})
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
	}()
	l := <-line
	require.Equal(t, "committed\n", l)
}

// commitAndHold is the other process of otherProcessCommits.
func commitAndHold() error {
	size, err := strconv.ParseUint(os.Getenv("VMARENA_IPC_COMMIT"), 10, 64)
	if err != nil {
		return err
	}
	fd, err := unix.MemfdCreate("other-process", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return err
	}
	fmt.Println("committed")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test ends
	return unix.Close(fd)
}

// shareWithChild is TestShareWithChild; meanwhile runs once the child has
// imported the chunk.
func shareWithChild(t *testing.T, meanwhile func()) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "import")
	child := cmd.Process.Pid
	c := exported(t, p, child)
	sh, ok := c.Exported()
	require.True(t, ok)
	file := openMemFile(t, sh.FD)
	require.NoError(t, conn.SendChunk(c))
	m, err := conn.recv() // the child wrote its bytes
	require.NoError(t, err, out.String())
	require.Equal(t, KindRelease, m.kind)
	meanwhile()
	got := make([]byte, 5)
	require.NoError(t, p.tab.Read(0, p.res.Base()+driver.Addr(chunkSize-5), got))
	require.Equal(t, "child", string(got), "the parent sees the child's write")
	require.Equal(t, holds{FDs: 2, Maps: 1}, file.heldBy(t, os.Getpid()), "the parent: its chunk's memfd, the export, the mapping")
	require.Equal(t, holds{FDs: 1, Maps: 1}, file.heldBy(t, child), "the child: its import, its mapping")
	require.Equal(t, uint64(chunkSize), file.committed(t))

	// The parent releases first: its usage drops, the memory stays.
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
	require.Zero(t, p.used())
	require.Equal(t, holds{}, file.heldBy(t, os.Getpid()), "the parent holds nothing of the chunk")
	require.Equal(t, holds{FDs: 1, Maps: 1}, file.heldBy(t, child), "the child still holds the memory")
	require.Equal(t, uint64(chunkSize), file.committed(t), "and it is all there")
	require.NoError(t, conn.send(KindRelease, 0, nil))
	m, err = conn.recv()
	require.NoError(t, err, out.String())
	require.Equal(t, "released", string(m.body))
	require.Equal(t, holds{}, file.heldBy(t, child), "the child released it")
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"hello"}, kv["read"], "the child read the parent's bytes")
	require.Equal(t, []string{fmt.Sprint(chunkSize), "0"}, kv["used"], "the child's usage counts the import until it releases")
	require.Equal(t, holds{}, file.heldBy(t, os.Getpid()),
		"released in both processes: only the test's probe refers to the file, and closing it returns the memory")
}

// TestImporterCrashes: the importer is killed while the memory is mapped;
// the exporter's data is intact and the memory goes when it releases.
func TestImporterCrashes(t *testing.T) { importerCrashes(t, func() {}) }

// TestImporterCrashesBesideOtherProcesses is TestImporterCrashes while
// another process commits memory of its own.
func TestImporterCrashesBesideOtherProcesses(t *testing.T) {
	importerCrashes(t, func() { otherProcessCommits(t, 4*chunkSize) })
}

func importerCrashes(t *testing.T, meanwhile func()) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "crash")
	c := exported(t, p, cmd.Process.Pid)
	sh, ok := c.Exported()
	require.True(t, ok)
	file := openMemFile(t, sh.FD)
	require.NoError(t, conn.SendChunk(c))
	require.Error(t, cmd.Wait(), "the child was killed")
	require.Contains(t, out.String(), "crashing")
	meanwhile()
	require.Equal(t, holds{}, file.heldBy(t, cmd.Process.Pid), "the child is gone, and all it held")
	got := make([]byte, 5)
	require.NoError(t, p.tab.Read(0, p.res.Base(), got))
	require.Equal(t, "hello", string(got), "the exporter's data is intact")
	require.NoError(t, p.tab.Read(0, p.res.Base()+driver.Addr(chunkSize-5), got))
	require.Equal(t, "child", string(got), "and it sees what the child wrote before dying")
	require.Equal(t, uint64(chunkSize), file.committed(t))
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
	require.Equal(t, holds{}, file.heldBy(t, os.Getpid()),
		"the exporter released it: only the test's probe refers to the file, and closing it returns the memory")
}

// TestImporterCannotResize: a child on the allow-list receives the chunk's
// descriptor and tries to shrink it to nothing and to grow it to twice its
// size. The memory file is sealed against both (EPERM); the exporter's
// bytes are all there, read through the library and through the slice
// over the mapping that HostBytes gives (which a shrunk file would turn
// into SIGBUS), and the file's size and committed memory are unchanged.
func TestImporterCannotResize(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	conn, cmd, out := spawn(t, l, "truncate")
	c := exported(t, p, cmd.Process.Pid)
	require.NoError(t, p.tab.Write(0, p.res.Base()+driver.Addr(chunkSize-4), []byte("tail")))
	sh, ok := c.Exported()
	require.True(t, ok)
	file := openMemFile(t, sh.FD)
	require.NoError(t, conn.SendChunk(c))
	m, err := conn.recv()
	require.NoError(t, err, out.String())
	require.Equal(t, "tried", string(m.body))
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"EPERM"}, kv["shrink"], "the importer cannot shrink the memory file")
	require.Equal(t, []string{"EPERM"}, kv["grow"], "nor grow it")
	require.Equal(t, []string{fmt.Sprint(chunkSize)}, kv["size"])

	got := make([]byte, 5)
	require.NoError(t, p.tab.Read(0, p.res.Base(), got), "the exporter reads through the library")
	require.Equal(t, "hello", string(got))
	b, err := p.drv.HostBytes(p.res.Base(), chunkSize)
	require.NoError(t, err)
	require.Equal(t, "hello", string(b[:5]), "and directly")
	require.Equal(t, "tail", string(b[chunkSize-4:]), "to the last byte")
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(file.probe, &st))
	require.Equal(t, int64(chunkSize), st.Size)
	require.Equal(t, uint64(chunkSize), file.committed(t))
	require.NoError(t, p.tab.Unmap(p.res.Base()))
	require.NoError(t, c.Release())
}

// TestRecvChunkRefusals: in one process, descriptors the host driver must
// not import arrive as chunks: a memory file without seals (its holders
// could resize it), a sealed one of another size than the message says,
// and descriptors of no memory file. Each is ErrInvalid naming what is
// wrong; the descriptor that came is closed, and nothing else changed.
func TestRecvChunkRefusals(t *testing.T) {
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

	memfd := func(size uint64, flags, seals int) int {
		fd, err := unix.MemfdCreate("not-a-chunk", unix.MFD_CLOEXEC|flags)
		require.NoError(t, err)
		require.NoError(t, unix.Ftruncate(fd, int64(size)))
		if seals != 0 {
			_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
			require.NoError(t, err)
		}
		return fd
	}
	sealed := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	devnull, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		fd   int
		size uint64
		want []string
	}{
		{"unsealed", memfd(chunkSize, unix.MFD_ALLOW_SEALING, 0), chunkSize, []string{"any holder could resize", "missing seal|shrink|grow"}},
		{"not sealable", memfd(chunkSize, 0, 0), chunkSize, []string{"any holder could resize", "missing shrink|grow"}},
		{"wrong size", memfd(chunkSize/2, unix.MFD_ALLOW_SEALING, sealed), chunkSize, []string{"not a memory file of 16 MiB", "it holds 8 MiB"}},
		{"not memory", devnull, chunkSize, []string{"not a memory file"}},
	} {
		before, used := fdCount(), p.used()
		payload := make([]byte, 12)
		binary.LittleEndian.PutUint64(payload, c.size)
		require.NoError(t, tx.send(KindChunk, driver.HandlePOSIXFD, payload, c.fd))
		require.NoError(t, unix.Close(c.fd)) // the sender's own
		_, err := rx.RecvChunk(p.mem, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, c.want...)
		require.Equal(t, before-1, fdCount(), "%s: the descriptor that came is closed, and the sender's", c.name)
		require.Equal(t, used, p.used(), "%s: nothing imported", c.name)
		require.NoError(t, p.mem.Check())
	}
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
