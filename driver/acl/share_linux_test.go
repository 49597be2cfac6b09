package acl

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// The allow-list test runs real child processes: the test binary
// re-executed with VMARENA_ACL_CHILD naming the role and VMARENA_ACL_STANDIN
// the stand-in file the parent tested, which TestMain runs instead of the
// tests. Parent and child talk over the child's stdin and stdout, a line
// at a time.
const (
	childRoleEnv = "VMARENA_ACL_CHILD"
	childLibEnv  = "VMARENA_ACL_STANDIN"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		if err := child(role, os.Getenv(childLibEnv), os.Stdin, os.Stdout); err != nil {
			fmt.Printf("child error: %+v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child plays role over its own copy of the stand-in at path:
//
//	importer  imports the token the parent sends, reads the parent's
//	          pattern, and reads it again after the parent released its
//	          chunk; then gives everything back
//	refused   is refused the token (not on its allow-list), and after the
//	          parent released its chunk finds no token at all
func child(role, path string, in io.Reader, out io.Writer) error {
	lines := bufio.NewScanner(in)
	next := func(want string) (string, error) {
		if !lines.Scan() {
			return "", errors.Newf("stdin closed waiting for %s: %v", want, lines.Err())
		}
		return lines.Text(), nil
	}
	lib, err := standin.OpenPath(path, small)
	if err != nil {
		return err
	}
	d, err := Open(Options{Library: path})
	if err != nil {
		return err
	}
	// The exporter allows the ID AscendCL knows this process by, which
	// only this process can learn.
	pid, err := d.HostPID()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "pid %d\n", pid)
	line, err := next("the token")
	if err != nil {
		return err
	}
	var sh driver.Shareable
	var seed byte
	if _, err := fmt.Sscanf(line, "%d %d %d", &sh.Token, &sh.Size, &seed); err != nil {
		return errors.Wrapf(err, "token line %q", line)
	}
	sh.Type = driver.HandleToken
	switch role {
	case "importer":
		h, err := d.Import(sh, 0)
		if err != nil {
			return err
		}
		base, err := d.Reserve(sh.Size, 0, 0)
		if err != nil {
			return err
		}
		if err := errors.CombineErrors(d.Map(base, h), d.SetAccess(base, sh.Size, 0, driver.AccessReadWrite)); err != nil {
			return err
		}
		check := func() error {
			got := make([]byte, sh.Size)
			if err := d.Read(base, got); err != nil {
				return err
			}
			if string(got) != string(pattern(int(sh.Size), seed)) {
				return errors.New("the imported memory does not hold the parent's pattern")
			}
			return nil
		}
		if err := check(); err != nil {
			return err
		}
		fmt.Fprintln(out, "imported")
		if _, err := next("released"); err != nil {
			return err
		}
		if err := check(); err != nil {
			return errors.Wrap(err, "after the exporter released its chunk")
		}
		fmt.Fprintln(out, "still-read")
		if err := errors.CombineErrors(d.Unmap(base, sh.Size), d.Release(h)); err != nil {
			return err
		}
		if err := errors.CombineErrors(d.Unreserve(base, sh.Size), d.Close()); err != nil {
			return err
		}
	case "refused":
		_, err := d.Import(sh, 0)
		if !errors.Is(err, driver.ErrAccessDenied) || !strings.Contains(err.Error(), "ACL_ERROR_RT_NO_PERMISSION (207006)") {
			return errors.Newf("want ErrAccessDenied naming ACL_ERROR_RT_NO_PERMISSION (207006), got %v", err)
		}
		fmt.Fprintln(out, "refused")
		if _, err := next("released"); err != nil {
			return err
		}
		_, err = d.Import(sh, 0)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "ACL_ERROR_RT_PARAM_INVALID (107000)") {
			return errors.Newf("after the release want ErrInvalid naming ACL_ERROR_RT_PARAM_INVALID (107000), got %v", err)
		}
		fmt.Fprintln(out, "unknown")
		if err := d.Close(); err != nil {
			return err
		}
	default:
		return errors.Newf("unknown role %q", role)
	}
	if leaks := lib.Leaks(); len(leaks) > 0 {
		return errors.Newf("the child's stand-in still holds %v", leaks)
	}
	return nil
}

// proc is a child process and the parent's ends of its stdin and stdout.
type proc struct {
	t     *testing.T
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func spawn(t *testing.T, role, lib string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childLibEnv+"="+lib)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	p := &proc{t: t, role: role, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

func (p *proc) send(line string) {
	p.t.Helper()
	_, err := fmt.Fprintln(p.stdin, line)
	require.NoError(p.t, err, "write to the %s child", p.role)
}

// expect waits for the child's next line, which must be want.
func (p *proc) expect(want string) {
	p.t.Helper()
	got, ok := <-p.lines
	require.True(p.t, ok, "the %s child ended before saying %q", p.role, want)
	require.Equal(p.t, want, got, "the %s child", p.role)
}

// hostPID reads the host process ID the child says it has (HostPID).
func (p *proc) hostPID() int {
	p.t.Helper()
	got, ok := <-p.lines
	require.True(p.t, ok, "the %s child ended before saying its process ID", p.role)
	var pid int
	_, err := fmt.Sscanf(got, "pid %d", &pid)
	require.NoError(p.t, err, "the %s child said %q", p.role, got)
	return pid
}

// done waits for the child to exit, successfully.
func (p *proc) done() {
	p.t.Helper()
	require.NoError(p.t, p.stdin.Close())
	for line := range p.lines {
		p.t.Errorf("the %s child said %q", p.role, line)
	}
	require.NoError(p.t, p.cmd.Wait(), "the %s child", p.role)
}

// TestAllowListAcrossProcesses: a chunk the parent exports is imported by
// the child it allowed, whose own stand-in reads the parent's bytes;
// another child, not allowed, is refused by "AscendCL" itself; after the
// parent releases its chunk the importer still reads it, the token is
// gone, and nothing is left behind.
func TestAllowListAcrossProcesses(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	size := 2 * g
	base, err := d.Reserve(size, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, size, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, size, 0, driver.AccessReadWrite))
	const seed = 42
	require.NoError(t, d.Write(base, pattern(int(size), seed)))
	sh, err := d.Export(h)
	require.NoError(t, err)
	require.Equal(t, driver.HandleToken, sh.Type)
	require.Equal(t, int64(1), lib.Live("tokens"))

	imp := spawn(t, "importer", lib.Path())
	ref := spawn(t, "refused", lib.Path())
	pid := imp.hostPID()
	require.Equal(t, imp.cmd.Process.Pid, pid, "no container here: the host ID is the process's")
	ref.hostPID()
	require.NoError(t, d.AllowPIDs(h, []int{pid}))
	token := fmt.Sprintf("%d %d %d", sh.Token, sh.Size, seed)
	imp.send(token)
	ref.send(token)
	imp.expect("imported")
	ref.expect("refused")

	require.NoError(t, d.Unmap(base, size))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(base, size))
	require.Zero(t, lib.Used(0), "the parent's share of the memory went")
	require.Zero(t, lib.Live("tokens"), "the token went with the chunk")
	require.NotContains(t, unixSockets(t), tokenName(sh.Token))
	imp.send("released")
	ref.send("released")
	imp.expect("still-read")
	ref.expect("unknown")
	imp.done()
	ref.done()
	requireNothingLeft(t)
}

// TestImportFromAnotherInstance: two drivers over two stand-in instances
// of one process, which share like two processes (with one process ID):
// the import is refused until the exporter allows this process, refused
// (changing nothing) for a wrong size, and then holds the memory past the
// exporter's release.
func TestImportFromAnotherInstance(t *testing.T) {
	exp, elib := openStandin(t, small, Options{})
	imp, ilib := openStandin(t, small, Options{})
	size := 2 * g
	base, err := exp.Reserve(size, 0, 0)
	require.NoError(t, err)
	h, err := exp.Create(1, size, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	require.NoError(t, exp.Map(base, h))
	require.NoError(t, exp.SetAccess(base, size, 1, driver.AccessReadWrite))
	require.NoError(t, exp.Write(base, pattern(int(size), 3)))
	sh, err := exp.Export(h)
	require.NoError(t, err)

	_, err = imp.Import(sh, 0)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "aclrtMemImportFromShareableHandle: ACL_ERROR_RT_NO_PERMISSION (207006)")
	require.Contains(t, errors.FlattenDetails(err), "not on the allow-list", "AscendCL's own message is kept")
	require.NoError(t, exp.AllowPIDs(h, []int{os.Getpid()}))
	for _, wrong := range []uint64{g, 2 * size} {
		bad := sh
		bad.Size = wrong
		_, err = imp.Import(bad, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the token's memory is not")
		require.Zero(t, ilib.Live("allocations"), "a refused import holds nothing")
		require.Zero(t, ilib.Live("mappings"))
		require.Zero(t, ilib.Live("reservations"))
		require.Zero(t, imp.Used(0))
	}
	ih, err := imp.Import(sh, 0)
	require.NoError(t, err)
	require.Equal(t, size, imp.Used(0))
	ibase, err := imp.Reserve(size, 0, 0)
	require.NoError(t, err)
	require.NoError(t, imp.Map(ibase, ih))
	require.NoError(t, imp.SetAccess(ibase, size, 0, driver.AccessReadWrite))

	require.NoError(t, exp.Unmap(base, size))
	require.NoError(t, exp.Release(h))
	require.Zero(t, elib.Live("tokens"))
	got := make([]byte, size)
	require.NoError(t, imp.Read(ibase, got))
	require.Equal(t, pattern(int(size), 3), got, "the importer keeps the memory")
	require.NoError(t, imp.Unmap(ibase, size))
	require.NoError(t, imp.Release(ih))
	require.Zero(t, ilib.Used(1))
}

// TestSelfImport: a token this process exported is not imported (AscendCL
// refuses that): the driver makes the import a second chunk over the same
// handle, which is one memory, and frees the handle when both are
// released.
func TestSelfImport(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	h, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	sh, err := d.Export(h)
	require.NoError(t, err)
	imp, err := d.Import(sh, 1)
	require.NoError(t, err)
	require.Zero(t, lib.Calls("aclrtMemImportFromShareableHandle"), "AscendCL is not asked")
	require.Equal(t, int64(1), lib.Live("allocations"), "one handle")

	// The import maps in a reservation of its own: AscendCL binds a
	// reservation to local or imported memory, never both, and the driver
	// holds the self-import to that too.
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	other, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.Map(other, imp))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, d.SetAccess(other, g, 1, driver.AccessReadWrite))
	one, two := pattern(256, 1), pattern(256, 2)
	require.NoError(t, d.Write(base, one))
	got := make([]byte, 256)
	require.NoError(t, d.Read(other, got))
	require.Equal(t, one, got, "written through one chunk, read through the other")
	require.NoError(t, d.Write(other, two))
	require.NoError(t, d.Read(base, got))
	require.Equal(t, two, got)

	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Unmap(other, g))
	require.NoError(t, d.Release(h))
	require.Equal(t, g, lib.Used(0), "the import still holds the memory")
	require.Equal(t, int64(1), lib.Live("tokens"), "and the token lives with it")
	require.NoError(t, d.Release(imp))
	require.Zero(t, lib.Used(0))
	require.Zero(t, lib.Live("allocations"))
	require.Zero(t, lib.Live("tokens"))
	require.NoError(t, d.Unreserve(base, g))
	require.NoError(t, d.Unreserve(other, g))
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// tokenName is how /proc/net/unix shows the stand-in's socket of a token.
func tokenName(tok uint64) string {
	return fmt.Sprintf("@vmstandin:acl:%d:%016x", os.Getuid(), tok)
}

// unixSockets lists the Unix socket names /proc/net/unix shows.
func unixSockets(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	var names []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 8 {
			names = append(names, f[7])
		}
	}
	return strings.Join(names, "\n")
}

// requireNothingLeft fails unless the stand-in left no file in /dev/shm
// or the temporary directory, and no socket of this process's tokens.
func requireNothingLeft(t *testing.T) {
	t.Helper()
	for _, dir := range []string{"/dev/shm", os.TempDir()} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		for _, e := range entries {
			require.NotContains(t, e.Name(), "vmstandin", "left in %s", filepath.Join(dir, e.Name()))
		}
	}
	prefix := "@vmstandin:acl:" + strconv.Itoa(os.Getuid()) + ":"
	for _, name := range strings.Split(unixSockets(t), "\n") {
		require.False(t, strings.HasPrefix(name, prefix) && socketOfThisProcess(t, name), "socket %s is left", name)
	}
}

// socketOfThisProcess says whether one of this process's descriptors is
// the socket /proc/net/unix names (other test binaries may hold their own).
func socketOfThisProcess(t *testing.T, name string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 8 && f[7] == name {
			inodes["socket:["+f[6]+"]"] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && inodes[link] {
			return true
		}
	}
	return false
}
