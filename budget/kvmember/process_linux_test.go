//go:build linux

package kvmember

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/testexec"
)

// TestMain runs the child of TestProcesses when the test binary is
// re-executed with VMARENA_KVMEMBER_BOOK set.
func TestMain(m *testing.M) {
	if path := os.Getenv("VMARENA_KVMEMBER_BOOK"); path != "" {
		if err := cacheChild(path); err != nil {
			fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " "))
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// cacheChild is a serving process: a cache member that runs one sequence
// of 16 tokens (4 pages) and has freed four more (16 pages cached or
// idle). It answers "hold BYTES running LEN preempted N" to each line of
// stdin, and leaves when stdin closes.
func cacheChild(path string) error {
	b, err := budget.Open(path, budget.Options{})
	if err != nil {
		return err
	}
	s := newCache(childTB{}, 32*page, 8)
	if s.k, err = Join(b, "child", 0, 32*page, s.c); err != nil {
		return err
	}
	next := 0
	run, err := admit(s.k, tokens(&next, 16), 0)
	if err != nil {
		return err
	}
	var done []interface{ Free() error }
	for range 4 {
		q, err := admit(s.k, tokens(&next, 16), 0)
		if err != nil {
			return err
		}
		done = append(done, q)
	}
	for _, q := range done {
		if err := q.Free(); err != nil {
			return err
		}
	}
	if err := s.k.Sync(); err != nil {
		return err
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Printf("hold %d running %d preempted %d used %d\n", s.k.Stats().Hold, run.Len(), s.c.Stats().Preemptions, s.used(childTB{}))
	}
	if err := run.Free(); err != nil {
		return err
	}
	if err := s.c.Close(); err != nil {
		return err
	}
	if err := s.k.Close(); err != nil {
		return err
	}
	if err := s.drv.Close(); err != nil {
		return err
	}
	return b.Close()
}

// childTB is the testing.TB newCache and used need, in a child: a
// failure ends the process.
type childTB struct{ testing.TB }

func (childTB) Helper() {}
func (childTB) Errorf(format string, args ...any) {
	fmt.Printf("error "+format+"\n", args...)
}
func (childTB) FailNow() { os.Exit(1) }

// TestProcesses: a cache member in another process gives back its
// cached and idle pages when one here grows, keeping its running
// sequence's pages; past that the growth is refused, naming it.
func TestProcesses(t *testing.T) {
	path := t.TempDir() + "/book"
	b, err := budget.Open(path, budget.Options{Capacity: 32 * page})
	require.NoError(t, err)
	defer b.Close()
	ctx, cancel := testexec.Context(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMARENA_KVMEMBER_BOOK="+path)
	w, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	child := func() (hold uint64, running, preempted int, used uint64) {
		_, err := fmt.Fprintln(w, "?")
		require.NoError(t, err)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		_, err = fmt.Sscanf(line, "hold %d running %d preempted %d used %d", &hold, &running, &preempted, &used)
		require.NoError(t, err, line)
		return
	}
	hold, _, _, _ := child()
	require.Equal(t, uint64(20*page), hold)

	s := newCache(t, 32*page, 8)
	s.k, err = Join(b, "here", 0, 32*page, s.c)
	require.NoError(t, err)
	require.Equal(t, uint64(page), s.k.Stats().Hold, "a page to start")
	require.NoError(t, s.k.Grow(24*page), "11 free, 13 given back")
	hold, running, preempted, used := child()
	require.Equal(t, uint64(7*page), hold)
	require.LessOrEqual(t, used, hold)
	require.Equal(t, 16, running)
	require.Zero(t, preempted)
	// The child can spare 3 more pages, not 8: refused, nothing changed.
	err = s.k.Grow(8 * page)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Contains(t, err.Error(), "child (pid")
	require.Equal(t, uint64(25*page), s.k.Stats().Hold)
	hold, _, _, _ = child()
	require.Equal(t, uint64(7*page), hold)
	require.NoError(t, s.k.Grow(3*page))
	hold, running, preempted, used = child()
	require.Equal(t, uint64(4*page), hold, "its running sequence's pages")
	require.LessOrEqual(t, used, hold)
	require.Equal(t, 16, running)
	require.Zero(t, preempted)
	require.NoError(t, w.Close())
	require.NoError(t, cmd.Wait())
	s.close(t)
}
