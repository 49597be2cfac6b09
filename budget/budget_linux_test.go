//go:build linux

package budget

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/testexec"
)

const mib = 1 << 20

// TestMain runs the child roles of the multi-process tests: the test
// binary re-executed with VMARENA_BUDGET_CHILD set.
func TestMain(m *testing.M) {
	if role := os.Getenv("VMARENA_BUDGET_CHILD"); role != "" {
		if err := child(role, os.Getenv("VMARENA_BUDGET_BOOK")); err != nil {
			fmt.Println("child error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child is one role: "hold" joins as "held", acquires 48 MiB and waits to
// be killed; "giver" joins as "giver", acquires 48 MiB all idle and gives
// back what it is asked, until its stdin closes.
func child(role, path string) error {
	if role == "device" {
		return deviceChild(path, os.Getenv("VMARENA_BUDGET_NAME"))
	}
	b, err := Open(path, Options{})
	if err != nil {
		return err
	}
	var m *Member
	give := func(want uint64) {
		in, err := m.Info()
		if err != nil {
			return
		}
		n := min(want, in.Idle)
		if n > 0 {
			_ = m.Release(n)
			fmt.Printf("gave %d\n", n)
		}
	}
	name := map[string]string{"hold": "held", "giver": "giver"}[role]
	if m, err = b.Join(name, 0, 64*mib, give); err != nil {
		return err
	}
	if err := m.Acquire(48 * mib); err != nil {
		return err
	}
	if role == "giver" {
		if err := m.SetIdle(48 * mib); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes it (or kills us)
	if err := m.Close(); err != nil {
		return err
	}
	return b.Close()
}

// startChild runs a role and waits for its "ready".
func startChild(t *testing.T, role, path string, env ...string) (*exec.Cmd, *os.File, *bufio.Reader) {
	t.Helper()
	ctx, cancel := testexec.Context(t)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), "VMARENA_BUDGET_CHILD="+role, "VMARENA_BUDGET_BOOK="+path)
	stdin, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdin = stdin
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	require.NoError(t, stdin.Close())
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	return cmd, w, r
}

func open(t *testing.T, path string, capacity uint64) *Book {
	t.Helper()
	b, err := Open(path, Options{Capacity: capacity, GiveBackWait: 5 * time.Second})
	require.NoError(t, err)
	return b
}

func bookPath(t *testing.T) string { return filepath.Join(t.TempDir(), "budget") }

// sumHolds checks the over-commit invariant on a listing.
func sumHolds(t *testing.T, b *Book) []Info {
	t.Helper()
	in, err := b.Members()
	require.NoError(t, err)
	var sum uint64
	for _, m := range in {
		sum += max(m.Committed, m.Floor)
		require.LessOrEqual(t, m.Idle, m.Committed)
		require.LessOrEqual(t, m.Committed, m.Ceiling)
	}
	require.LessOrEqual(t, sum, b.Capacity(), "never over-committed")
	return in
}

func TestAcquireRelease(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 100*mib)
	a, err := b.Join("a", 10*mib, 80*mib, nil)
	require.NoError(t, err)
	c, err := b.Join("c", 20*mib, 60*mib, nil)
	require.NoError(t, err)
	require.NoError(t, a.Acquire(70*mib))
	// c's floor is guaranteed: 10 MiB is all that is left for c above it.
	require.NoError(t, c.Acquire(30*mib))
	err = c.Acquire(1 * mib)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.Contains(t, err.Error(), "a (pid")
	require.Contains(t, err.Error(), "holds 70 MiB")
	require.NoError(t, a.Release(20*mib))
	require.NoError(t, c.Acquire(20*mib))
	in := sumHolds(t, b)
	require.Equal(t, []uint64{50 * mib, 50 * mib}, []uint64{in[0].Committed, in[1].Committed})
	require.NoError(t, a.Close())
	require.NoError(t, c.Acquire(10*mib))
	require.NoError(t, c.Close())
	require.NoError(t, b.Close())
}

// TestBadInput: every refusal names its sentinel and changes nothing.
func TestBadInput(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 100*mib)
	a, err := b.Join("a", 10*mib, 50*mib, nil)
	require.NoError(t, err)
	require.NoError(t, a.Acquire(30*mib))
	require.NoError(t, a.SetIdle(5*mib))
	before := sumHolds(t, b)
	cases := []struct {
		name string
		call func() error
		want error
		msg  string
	}{
		{"zero acquire", func() error { return a.Acquire(0) }, driver.ErrInvalid, "zero"},
		{"over the ceiling", func() error { return a.Acquire(21 * mib) }, driver.ErrOutOfMemory, "ceiling"},
		{"release too much", func() error { return a.Release(31 * mib) }, driver.ErrInvalid, "holds 30 MiB"},
		{"release zero", func() error { return a.Release(0) }, driver.ErrInvalid, "holds"},
		{"idle over the hold", func() error { return a.SetIdle(31 * mib) }, driver.ErrInvalid, "holds"},
		{"a name in use", func() error { _, err := b.Join("a", 0, mib, nil); return err }, driver.ErrInvalid, "name"},
		{"an empty name", func() error { _, err := b.Join("", 0, mib, nil); return err }, driver.ErrInvalid, "name"},
		{"a control character", func() error { _, err := b.Join("a\nb", 0, mib, nil); return err }, driver.ErrInvalid, "control"},
		{"a long name", func() error { _, err := b.Join(strings.Repeat("x", MaxName+1), 0, mib, nil); return err }, driver.ErrInvalid, "name"},
		{"floor over ceiling", func() error { _, err := b.Join("b", 2*mib, mib, nil); return err }, driver.ErrInvalid, "floor"},
		{"zero ceiling", func() error { _, err := b.Join("b", 0, 0, nil); return err }, driver.ErrInvalid, "zero"},
		{"ceiling over capacity", func() error { _, err := b.Join("b", 0, 101*mib, nil); return err }, driver.ErrInvalid, "capacity"},
		{"no room for a floor", func() error { _, err := b.Join("b", 71*mib, 71*mib, nil); return err }, driver.ErrOutOfMemory, "floor"},
		{"set limits of no one", func() error { return b.SetLimits("z", 0, mib) }, driver.ErrInvalid, "no such member"},
		{"ceiling under the hold", func() error { return b.SetLimits("a", 0, 29*mib) }, driver.ErrBusy, "holds 30 MiB"},
		{"floor over ceiling (set)", func() error { return b.SetLimits("a", 40*mib, 35*mib) }, driver.ErrInvalid, "floor"},
		{"open another capacity", func() error { _, err := Open(path, Options{Capacity: mib}); return err }, driver.ErrInvalid, "capacity"},
		{"open a directory", func() error { _, err := Open(t.TempDir(), Options{Capacity: mib}); return err }, driver.ErrInvalid, ""},
		{"a new book with no capacity", func() error { _, err := Open(bookPath(t), Options{}); return err }, driver.ErrInvalid, "capacity"},
		{"a negative wait", func() error { _, err := Open(path, Options{GiveBackWait: -1}); return err }, driver.ErrInvalid, "negative"},
		{"close with members", b.Close, driver.ErrBusy, "members"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), c.msg)
			require.True(t, strings.HasPrefix(err.Error(), "budget: "), err.Error())
			require.Equal(t, before, sumHolds(t, b), "nothing changed")
		})
	}
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Close(), driver.ErrClosed)
	require.ErrorIs(t, a.Acquire(mib), driver.ErrClosed)
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Close(), driver.ErrClosed)
	var zb Book
	_, err = zb.Members()
	require.ErrorIs(t, err, driver.ErrInvalid)
	var zm *Member
	require.ErrorIs(t, zm.Acquire(mib), driver.ErrInvalid)
}

// giver is a member whose callback gives back its idle memory.
func giver(t *testing.T, b *Book, name string, floor, ceiling uint64) *Member {
	t.Helper()
	var m *Member
	m, err := b.Join(name, floor, ceiling, func(want uint64) {
		in, err := m.Info()
		if err != nil {
			return
		}
		if n := min(want, in.Idle, in.Committed-min(in.Committed, in.Floor)); n > 0 {
			_ = m.Release(n)
			_ = m.SetIdle(in.Idle - n)
		}
	})
	require.NoError(t, err)
	return m
}

func TestGiveBack(t *testing.T) {
	path := bookPath(t)
	b1, b2 := open(t, path, 100*mib), open(t, path, 0) // two processes' views
	a := giver(t, b1, "a", 10*mib, 100*mib)
	require.NoError(t, a.Acquire(90*mib))
	require.NoError(t, a.SetIdle(60*mib))
	c, err := b2.Join("c", 0, 100*mib, nil)
	require.NoError(t, err)
	require.NoError(t, c.Acquire(50*mib)) // 40 free, 10 asked of a
	in := sumHolds(t, b2)
	require.Equal(t, uint64(50*mib), in[0].Committed)
	require.Equal(t, uint64(20*mib), in[0].Idle)
	require.Equal(t, uint64(1), in[0].Asked)
	require.Equal(t, uint64(40*mib), in[0].GivenBack)
	// a's floor stays its own, and only its idle is asked for.
	err = c.Acquire(50 * mib)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.Contains(t, err.Error(), "does not cover")
	require.NoError(t, c.Acquire(20*mib))
	in = sumHolds(t, b2)
	require.Equal(t, uint64(30*mib), in[0].Committed)
	require.NoError(t, a.Close())
	require.NoError(t, c.Close())
	require.NoError(t, b1.Close())
	require.NoError(t, b2.Close())
}

// TestGiveBackLate: a member that does not give back in time leaves the
// asker with ErrOutOfMemory naming it.
func TestGiveBackLate(t *testing.T) {
	path := bookPath(t)
	b, err := Open(path, Options{Capacity: 100 * mib, GiveBackWait: 20 * time.Millisecond})
	require.NoError(t, err)
	release := make(chan struct{})
	var a *Member
	a, err = b.Join("slow", 0, 100*mib, func(want uint64) { <-release })
	require.NoError(t, err)
	require.NoError(t, a.Acquire(90*mib))
	require.NoError(t, a.SetIdle(90*mib))
	c, err := b.Join("c", 0, 100*mib, nil)
	require.NoError(t, err)
	err = c.Acquire(50 * mib)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.Contains(t, err.Error(), "slow did not within")
	require.Contains(t, err.Error(), "slow (pid")
	in := sumHolds(t, b)
	require.Equal(t, uint64(0), in[1].Committed, "the failed acquire changed nothing")
	close(release)
	require.NoError(t, a.Close())
	require.NoError(t, c.Close())
	require.NoError(t, b.Close())
}

// TestDeadMemberAcrossProcesses: a child holding 48 MiB is killed with
// SIGKILL; its hold returns to the budget.
func TestKilledMidHold(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 64*mib)
	cmd, w, _ := startChild(t, "hold", path)
	defer w.Close()
	in := sumHolds(t, b)
	require.Len(t, in, 1)
	require.Equal(t, uint64(48*mib), in[0].Committed)
	require.Equal(t, cmd.Process.Pid, in[0].PID)
	m, err := b.Join("me", 0, 64*mib, nil)
	require.NoError(t, err)
	require.ErrorIs(t, m.Acquire(32*mib), driver.ErrOutOfMemory) // held alive
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.NoError(t, m.Acquire(32*mib)) // the dead hold was swept
	in = sumHolds(t, b)
	require.Len(t, in, 1)
	require.Equal(t, "me", in[0].Name)
	require.NoError(t, m.Close())
	require.NoError(t, b.Close())
}

// TestGiveBackAcrossProcesses: a child gives back its idle memory when
// this process asks.
func TestGiveBackAcrossProcesses(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 64*mib)
	cmd, w, r := startChild(t, "giver", path)
	m, err := b.Join("asker", 0, 64*mib, nil)
	require.NoError(t, err)
	require.NoError(t, m.Acquire(40*mib)) // 16 free, 24 from the child
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "gave "+strconv.Itoa(24*mib)+"\n", line)
	in := sumHolds(t, b)
	require.Equal(t, uint64(24*mib), in[0].Committed)
	require.NoError(t, w.Close()) // the child leaves
	require.NoError(t, cmd.Wait())
	require.NoError(t, m.Acquire(24*mib))
	require.NoError(t, m.Close())
	require.NoError(t, b.Close())
}

// TestHostile: garbage in the shared books is a clear error, never a
// crash or an over-commit; garbage in a mailbox is bounded.
func TestHostile(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 64*mib)
	a := giver(t, b, "a", 0, 64*mib)
	require.NoError(t, a.Acquire(32*mib))
	require.NoError(t, a.SetIdle(32*mib))
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	write := func(data []byte) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(data, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	// A mailbox full of garbage: the member gives back at most what it
	// has, the books stay sound.
	mb := b.mailbox(a.slot)
	*mb.bytes = ^uint64(0)
	*mb.req += 7
	futexWake(mb.req)
	for { // the callback runs on a's goroutine
		if in, _ := a.Info(); in.Committed == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	sumHolds(t, b)
	require.NoError(t, a.Acquire(32*mib))
	good, err = os.ReadFile(path)
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(1, 2))
	corrupt := []struct {
		name string
		edit func(d []byte)
		msg  string
	}{
		{"magic", func(d []byte) { d[0] = 'X' }, "not a budget book"},
		{"capacity", func(d []byte) { binary.LittleEndian.PutUint64(d[16:], 0) }, "capacity"},
		{"both copies torn", func(d []byte) { d[copy0+30]++; d[copy1+30]++ }, "CRC"},
		{"a hold over the capacity, CRC fixed", func(d []byte) {
			for _, c := range []int{copy0, copy1} {
				binary.LittleEndian.PutUint64(d[c+stateHead+32:], 1<<40)
				binary.LittleEndian.PutUint32(d[c+8:], stateCRC(d[c:]))
			}
		}, "corrupt book"},
		{"random bytes", func(d []byte) {
			for i := 0; i < copy1+stateSize; i++ {
				d[i] = byte(rng.Uint32())
			}
		}, ""},
	}
	for _, c := range corrupt {
		t.Run(c.name, func(t *testing.T) {
			d := append([]byte(nil), good...)
			c.edit(d)
			write(d)
			for _, call := range []func() error{
				func() error { return a.Acquire(mib) },
				func() error { return a.Release(mib) },
				func() error { _, err := b.Members(); return err },
				func() error { _, err := Open(path, Options{}); return err },
			} {
				err := call()
				require.ErrorIs(t, err, driver.ErrInvalid)
				require.Contains(t, err.Error(), c.msg)
			}
			write(good)
			require.Len(t, sumHolds(t, b), 1)
		})
	}
	// A torn newer copy (a member killed mid-write) reads as the older.
	d := append([]byte(nil), good...)
	_, which, err := decode(d)
	require.NoError(t, err)
	off := copy0 + (1-which)*stateSize
	binary.LittleEndian.PutUint64(d[off:], binary.LittleEndian.Uint64(d[copy0+which*stateSize:])+1)
	d[off+40]++
	write(d)
	in := sumHolds(t, b)
	require.Equal(t, uint64(32*mib), in[0].Committed)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// TestOpenWithoutACapacity: opening a book that is not there without a
// capacity is refused and creates no file.
func TestOpenWithoutACapacity(t *testing.T) {
	path := bookPath(t)
	_, err := Open(path, Options{})
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.Contains(t, err.Error(), "no book there")
	require.NoFileExists(t, path)
	b := open(t, path, 64*mib) // with one it is made
	require.NoError(t, b.Close())
	b2, err := Open(path, Options{})
	require.NoError(t, err)
	require.Equal(t, uint64(64*mib), b2.Capacity())
	require.NoError(t, b2.Close())
}

// TestHostileCoTenant: what something that is not a member can do to a
// book's file, beyond writing bytes into it (TestHostile), leaves the
// members with clear errors, never a crash, a hang or an over-commit:
// a generation forged to 2^64-1 (which would outrank every later write),
// a capacity rewritten after Open, the file cut short under the mapping
// (a SIGBUS on the next read), the file replaced at its path (a join's
// liveness lock would land on the new file, and the member's own book
// would see it dead), the book's lock held for good, and the liveness
// locks of free slots held.
func TestHostileCoTenant(t *testing.T) {
	forge := func(t *testing.T, path string, edit func(d []byte)) {
		t.Helper()
		d, err := os.ReadFile(path)
		require.NoError(t, err)
		edit(d)
		for _, c := range []int{copy0, copy1} {
			binary.LittleEndian.PutUint32(d[c+8:], stateCRC(d[c:]))
		}
		require.NoError(t, os.WriteFile(path, d, 0o600))
	}
	// setup is a book of 100 MiB and a member a of it.
	setup := func(t *testing.T) (string, *Book, *Member) {
		path := bookPath(t)
		b := open(t, path, 100*mib)
		return path, b, giver(t, b, "a", 0, 100*mib)
	}
	t.Run("generation 2^64-1", func(t *testing.T) {
		path, b, a := setup(t)
		forge(t, path, func(d []byte) {
			_, which, err := decode(d)
			require.NoError(t, err)
			binary.LittleEndian.PutUint64(d[copy0+which*stateSize:], ^uint64(0))
		})
		for range 3 {
			err := a.Acquire(90 * mib)
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.Contains(t, err.Error(), "generation")
		}
		_, err := b.Join("c", 0, 10*mib, nil)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.Error(t, a.Close())
		require.NoError(t, b.Close())
	})
	t.Run("capacity rewritten", func(t *testing.T) {
		path, b, a := setup(t)
		forge(t, path, func(d []byte) {
			binary.LittleEndian.PutUint64(d[16:], 1<<40)
			for _, c := range []int{copy0, copy1} {
				binary.LittleEndian.PutUint64(d[c+16:], 1<<40)
			}
		})
		require.ErrorIs(t, b.SetLimits("a", 0, 1<<40), driver.ErrInvalid)
		err := a.Acquire(1 << 39)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.Contains(t, err.Error(), "it was opened with 100 MiB")
		require.Equal(t, uint64(100*mib), b.Capacity())
		require.Error(t, a.Close())
		require.NoError(t, b.Close())
	})
	t.Run("cut short under the mapping", func(t *testing.T) {
		path, b, a := setup(t)
		x := giver(t, b, "x", 0, 100*mib)
		require.NoError(t, x.Acquire(10*mib))
		require.NoError(t, x.SetIdle(10*mib))
		require.NoError(t, os.Truncate(path, 0))
		for _, call := range []func() error{
			func() error { return a.Acquire(mib) },
			func() error { return a.Release(mib) },
			func() error { _, err := b.Members(); return err },
			func() error { _, err := b.Join("c", 0, mib, nil); return err },
		} {
			err := call()
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.Contains(t, err.Error(), "cut short")
		}
		require.Error(t, a.Close())
		require.Error(t, x.Close())
		require.NoError(t, b.Close())
		_, err := Open(path, Options{})
		require.ErrorIs(t, err, driver.ErrInvalid, "a book of 0 bytes")
	})
	t.Run("replaced at its path", func(t *testing.T) {
		path := bookPath(t)
		b := open(t, path, 100*mib)
		x := giver(t, b, "x", 0, 100*mib)
		require.NoError(t, os.Remove(path))
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		_, err := b.Join("a", 0, 100*mib, nil)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.Contains(t, err.Error(), "no longer the book's file")
		require.NoError(t, x.Acquire(100*mib), "x's hold stands, the whole capacity")
		in := sumHolds(t, b)
		require.Len(t, in, 1)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Zero(t, fi.Size(), "the file at the path untouched")
		require.NoError(t, x.Close())
		require.NoError(t, b.Close())
	})
	t.Run("the lock held for good", func(t *testing.T) {
		old := lockWait
		lockWait = 100 * time.Millisecond
		t.Cleanup(func() { lockWait = old })
		path, b, a := setup(t)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		require.NoError(t, ofd(f, unix.F_OFD_SETLK, unix.F_WRLCK, 0))
		err = a.Acquire(mib)
		require.ErrorIs(t, err, driver.ErrBusy)
		require.Contains(t, err.Error(), "held for")
		require.NoError(t, f.Close()) // the lock goes with it
		require.NoError(t, a.Acquire(mib))
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	})
	t.Run("free slots' liveness locks held", func(t *testing.T) {
		path := bookPath(t)
		b := open(t, path, 100*mib)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		for slot := range 3 {
			require.NoError(t, ofd(f, unix.F_OFD_SETLK, unix.F_WRLCK, liveBase+int64(slot)))
		}
		a, err := b.Join("a", 0, 10*mib, nil)
		require.NoError(t, err)
		require.Equal(t, 3, a.slot, "the first free slot whose lock is free")
		require.NoError(t, a.Close())
		for slot := 3; slot < MaxMembers; slot++ {
			require.NoError(t, ofd(f, unix.F_OFD_SETLK, unix.F_WRLCK, liveBase+int64(slot)))
		}
		_, err = b.Join("a", 0, 10*mib, nil)
		require.ErrorIs(t, err, driver.ErrBusy)
		require.NoError(t, b.Close())
	})
}

// TestModel runs random joins, leaves, deaths, acquires (with
// give-backs), releases and limit changes over three views of one book
// against a reference model, comparing after every step.
func TestModel(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 300) })
	}
}

type refMember struct {
	slot                              int
	floor, ceiling, hold, idle, asked uint64
	given                             uint64
}

func runModel(t *testing.T, seed uint64, steps int) {
	const capacity = 64 * mib
	rng := rand.New(rand.NewPCG(seed, seed*7))
	path := bookPath(t)
	books := []*Book{open(t, path, capacity), open(t, path, 0), open(t, path, 0)}
	live := map[string]*Member{}
	ref := map[string]*refMember{}
	size := func() uint64 { return uint64(1+rng.IntN(16)) * mib }
	freeSlot := func() int {
		for s := 0; ; s++ {
			used := false
			for _, r := range ref {
				used = used || r.slot == s
			}
			if !used {
				return s
			}
		}
	}
	st := func() *state {
		s := &state{capacity: capacity}
		for name, r := range ref {
			s.recs[r.slot] = record{used: true, name: name, floor: r.floor, ceiling: r.ceiling, hold: r.hold, idle: r.idle}
		}
		return s
	}
	nameOf := func(slot int) string {
		for n, r := range ref {
			if r.slot == slot {
				return n
			}
		}
		return ""
	}
	pick := func() string {
		if len(live) == 0 {
			return ""
		}
		names := make([]string, 0, len(live))
		for n := range live {
			names = append(names, n)
		}
		slices.Sort(names)
		return names[rng.IntN(len(names))]
	}
	for step := 0; step < steps; step++ {
		op := rng.IntN(8)
		name := pick()
		var desc string
		switch {
		case op == 0 || name == "":
			name = fmt.Sprintf("m%d", step)
			floor, ceiling := size()/2, size()*3
			desc = fmt.Sprintf("join %s %d %d", name, floor, ceiling)
			err := st().checkLimits(func() string { return "" }, -1, floor, min(ceiling, capacity))
			if len(ref) == MaxMembers {
				err = driver.ErrBusy
			}
			b := books[rng.IntN(len(books))]
			var m *Member
			m, gerr := b.Join(name, floor, min(ceiling, capacity), func(want uint64) {
				in, err := m.Info()
				if err != nil {
					return
				}
				if n := min(want, in.Idle, in.Committed-min(in.Committed, in.Floor)); n > 0 {
					_ = m.Release(n)
					_ = m.SetIdle(in.Idle - n)
				}
			})
			if err != nil {
				require.Error(t, gerr, desc)
				break
			}
			require.NoError(t, gerr, desc)
			require.Equal(t, freeSlot(), m.slot, desc)
			live[name] = m
			ref[name] = &refMember{slot: m.slot, floor: floor, ceiling: min(ceiling, capacity)}
		case op == 1:
			desc = "leave " + name
			require.NoError(t, live[name].Close(), desc)
			delete(live, name)
			delete(ref, name)
		case op == 2:
			desc = "kill " + name
			live[name].kill()
			delete(live, name)
			delete(ref, name) // the comparison's listing sweeps it
		case op <= 4:
			n := size()
			desc = fmt.Sprintf("%s acquires %d", name, n)
			r := ref[name]
			s := st()
			short, plan, coverable := s.plan(r.slot, n)
			ok := r.hold+n <= r.ceiling && coverable
			err := live[name].Acquire(n)
			if !ok {
				require.ErrorIs(t, err, driver.ErrOutOfMemory, desc)
				break
			}
			require.NoError(t, err, desc)
			for _, a := range plan {
				v := ref[nameOf(a.slot)]
				v.hold -= a.bytes
				v.idle -= a.bytes
				v.asked++
				v.given += a.bytes
			}
			_ = short
			r.hold += n
		case op == 5:
			r := ref[name]
			n := size()
			desc = fmt.Sprintf("%s releases %d", name, n)
			err := live[name].Release(n)
			if n > r.hold {
				require.ErrorIs(t, err, driver.ErrInvalid, desc)
				break
			}
			require.NoError(t, err, desc)
			r.hold -= n
			r.idle = min(r.idle, r.hold)
		case op == 6:
			r := ref[name]
			n := uint64(rng.IntN(int(r.hold/mib)+2)) * mib
			desc = fmt.Sprintf("%s idle %d", name, n)
			err := live[name].SetIdle(n)
			if n > r.hold {
				require.ErrorIs(t, err, driver.ErrInvalid, desc)
				break
			}
			require.NoError(t, err, desc)
			r.idle = n
		default:
			r := ref[name]
			floor, ceiling := size()/2, size()*4
			desc = fmt.Sprintf("set %s %d %d", name, floor, ceiling)
			err := st().checkLimits(func() string { return "" }, r.slot, floor, ceiling)
			gerr := books[0].SetLimits(name, floor, ceiling)
			if err != nil {
				require.Error(t, gerr, desc)
				require.ErrorIs(t, gerr, errors.UnwrapAll(err), desc)
				break
			}
			require.NoError(t, gerr, desc)
			r.floor, r.ceiling = floor, ceiling
		}
		in := sumHolds(t, books[rng.IntN(len(books))])
		require.Len(t, in, len(ref), desc)
		for _, got := range in {
			r := ref[got.Name]
			require.NotNil(t, r, desc)
			want := Info{Name: got.Name, PID: os.Getpid(), Slot: r.slot, Floor: r.floor, Ceiling: r.ceiling,
				Committed: r.hold, Idle: r.idle, Asked: r.asked, GivenBack: r.given}
			require.Equal(t, want, got, "step %d: %s", step, desc)
		}
	}
	for _, m := range live {
		require.NoError(t, m.Close())
	}
	for _, b := range books {
		require.NoError(t, b.Close())
	}
}

// TestNoLeaks: books and members opened and closed give back every
// descriptor, mapping and goroutine.
func TestNoLeaks(t *testing.T) {
	path := bookPath(t)
	work := func() {
		b := open(t, path, 64*mib)
		b2 := open(t, path, 0)
		a := giver(t, b, "a", 0, 64*mib)
		require.NoError(t, a.Acquire(60*mib))
		require.NoError(t, a.SetIdle(60*mib))
		c, err := b2.Join("c", 0, 64*mib, nil)
		require.NoError(t, err)
		require.NoError(t, c.Acquire(30*mib))
		require.NoError(t, a.Close())
		require.NoError(t, c.Close())
		require.NoError(t, b.Close())
		require.NoError(t, b2.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %v, after %v", before, after)
	work()
	// Close returns once serve has closed its done channel; the goroutine
	// itself ends a moment later. One that never ends is a leak, left to
	// go test's -timeout.
	buf := make([]byte, 1<<20)
	for strings.Contains(string(buf[:runtime.Stack(buf, true)]), "budget.(*Member).serve") {
		time.Sleep(time.Millisecond)
	}
}

// TestJoinOnAFileCutShort: a book file cut short past its books but
// before the mailboxes (a page boundary a co-tenant's truncate can land
// on) makes a join fault where it sets the new member's mailbox, after it
// took a slot's liveness lock: the join is refused (ErrInvalid) and lets
// that lock and its descriptor go, so once the file is whole again the
// next join gets the same slot.
func TestJoinOnAFileCutShort(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 64*mib)
	require.NoError(t, os.Truncate(path, mailOff))
	_, err := b.Join("a", 0, 64*mib, nil)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.Contains(t, err.Error(), "cut short")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: liveBase, Len: 1}
	require.NoError(t, unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk))
	require.Equal(t, int16(unix.F_UNLCK), lk.Type, "slot 0's liveness lock is still held")
	require.NoError(t, os.Truncate(path, FileSize))
	a, err := b.Join("a", 0, 64*mib, nil)
	require.NoError(t, err)
	require.Zero(t, a.slot)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}
