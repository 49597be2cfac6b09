//go:build linux

package budget

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// chunk is the device tests' chunk size.
const chunk = 4 * mib

// hostDevice is a host driver of one device as large as the book,
// shared through member m.
func hostDevice(capacity uint64, m *Member) (driver.Driver, error) {
	d, err := host.New(host.Options{Devices: 1, Capacity: capacity, Granularity: 2 * mib})
	if err != nil {
		return nil, err
	}
	w, err := NewDevice(d, 0, m)
	if err != nil {
		return nil, errors.CombineErrors(err, d.Close())
	}
	return w, nil
}

// deviceChild is a process with a host device of its own, as large as the
// whole book, shared through it: it creates and releases chunks as its
// stdin says ("create N", "release N"), answering "created K" (and the
// error that stopped it) or "released K", then "used BYTES" (its host
// driver's own count); it leaves at "exit" or when stdin closes.
func deviceChild(path, name string) error {
	b, err := Open(path, Options{})
	if err != nil {
		return err
	}
	m, err := b.Join(name, 0, b.Capacity(), nil)
	if err != nil {
		return err
	}
	d, err := hostDevice(b.Capacity(), m)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	var hs []driver.Handle
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 {
			break
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return err
		}
		k := 0
		var why error
		for ; k < n; k++ {
			if f[0] == "create" {
				h, err := d.Create(0, chunk, driver.ChunkOptions{})
				if err != nil {
					why = err
					break
				}
				hs = append(hs, h)
			} else {
				if len(hs) == 0 {
					break
				}
				if err := d.Release(hs[len(hs)-1]); err != nil {
					return err
				}
				hs = hs[:len(hs)-1]
			}
		}
		fmt.Printf("%sd %d\n", f[0], k)
		if why != nil {
			fmt.Printf("error %s\n", strings.ReplaceAll(why.Error(), "\n", " "))
		}
		fmt.Printf("used %d\n", d.(driver.Books).Used(0))
	}
	if err := d.Close(); err != nil {
		return err
	}
	if err := m.Close(); err != nil {
		return err
	}
	return b.Close()
}

// command sends a command to a device child and reads its answer: the count,
// the error line (if any) and its device's use.
func command(t *testing.T, w *os.File, r *bufio.Reader, cmd string) (n int, errLine string, used uint64) {
	t.Helper()
	_, err := fmt.Fprintln(w, cmd)
	require.NoError(t, err)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		f := strings.SplitN(strings.TrimSpace(line), " ", 2)
		switch f[0] {
		case "created", "released":
			n, err = strconv.Atoi(f[1])
			require.NoError(t, err)
		case "error":
			errLine = f[1]
		case "used":
			used, err = strconv.ParseUint(f[1], 10, 64)
			require.NoError(t, err)
			return n, errLine, used
		default:
			t.Fatalf("unexpected %q", line)
		}
	}
}

// TestDeviceProcesses: two processes, each with a host device as large
// as the book, never commit more than the book's capacity between them:
// the second is refused what the first holds (an out-of-memory error
// naming it), gets what the first releases, and all of it once the first
// is killed.
func TestDeviceProcesses(t *testing.T) {
	path := bookPath(t)
	b := open(t, path, 64*mib)
	defer b.Close()
	a, aw, ar := startChild(t, "device", path, "VMARENA_BUDGET_NAME=a")
	_, cw, cr := startChild(t, "device", path, "VMARENA_BUDGET_NAME=c")
	defer cw.Close()
	defer aw.Close()

	n, e, aUsed := command(t, aw, ar, "create 12")
	require.Equal(t, 12, n, e)
	require.Equal(t, uint64(48*mib), aUsed)
	n, e, cUsed := command(t, cw, cr, "create 8")
	require.Equal(t, 4, n, "16 MiB are left")
	require.Contains(t, e, "out of memory")
	require.Contains(t, e, "a (pid")
	require.LessOrEqual(t, aUsed+cUsed, uint64(64*mib), "never over-committed")
	in := sumHolds(t, b)
	require.Len(t, in, 2)

	n, _, aUsed = command(t, aw, ar, "release 6")
	require.Equal(t, 6, n)
	require.Equal(t, uint64(24*mib), aUsed)
	n, _, cUsed = command(t, cw, cr, "create 8")
	require.Equal(t, 6, n, "what a released")
	require.Equal(t, uint64(40*mib), cUsed)
	require.Equal(t, uint64(64*mib), aUsed+cUsed)
	sumHolds(t, b)

	// a dies holding 24 MiB: its hold goes with it.
	require.NoError(t, a.Process.Signal(syscall.SIGKILL))
	_ = a.Wait()
	n, _, cUsed = command(t, cw, cr, "create 8")
	require.Equal(t, 6, n)
	require.Equal(t, uint64(64*mib), cUsed)
	in = sumHolds(t, b)
	require.Len(t, in, 1)
	require.Equal(t, "c", in[0].Name)
	require.Equal(t, uint64(64*mib), in[0].Committed)
}

// TestDeviceAccounting: a chunk's bytes go back to the member when its
// memory goes back to the device — released and unmapped, in either
// order — and at Close; what the driver or the book refuses, and bad
// input, leave the hold as it was.
func TestDeviceAccounting(t *testing.T) {
	b := open(t, bookPath(t), 16*mib)
	defer b.Close()
	m, err := b.Join("m", 0, 16*mib, nil)
	require.NoError(t, err)
	defer m.Close()
	hold := func() uint64 {
		in, err := m.Info()
		require.NoError(t, err)
		return in.Committed
	}
	d, err := hostDevice(16*mib, m)
	require.NoError(t, err)
	_, isHost := d.(driver.HostMapper)
	require.True(t, isHost, "a host driver stays a HostMapper")
	require.False(t, d.Supports(driver.FeatureShareable))
	w := d.(*deviceHost).Device

	base, err := d.Reserve(8*mib, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, chunk, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, uint64(chunk), hold())
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.Release(h))
	require.Equal(t, uint64(chunk), hold(), "released but mapped: still on the device")
	require.NoError(t, d.Unmap(base, chunk))
	require.Zero(t, hold())
	require.Zero(t, w.Live())

	h, err = d.Create(0, chunk, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.Unmap(base, chunk))
	require.Equal(t, uint64(chunk), hold(), "unmapped but live")
	require.NoError(t, d.Release(h))
	require.Zero(t, hold())

	// Refusals change nothing.
	_, err = d.Create(0, 3*mib, driver.ChunkOptions{}) // not a multiple of the granularity
	require.True(t, errors.Is(err, driver.ErrMisaligned), "%v", err)
	_, err = d.Create(0, chunk, driver.ChunkOptions{Shareable: true})
	require.True(t, errors.Is(err, driver.ErrUnsupported), "%v", err)
	_, err = d.Create(0, 20*mib, driver.ChunkOptions{})
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.True(t, errors.Is(d.Release(12345), driver.ErrBadHandle))
	require.Zero(t, hold())
	for _, c := range []struct {
		d   driver.Driver
		dev driver.DeviceID
		m   *Member
	}{{nil, 0, m}, {w.d, 0, nil}, {w.d, 1, m}, {w.d, -1, m}} {
		_, err := NewDevice(c.d, c.dev, c.m)
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	}
	var nilDev *Device
	require.True(t, errors.Is(nilDev.Close(), driver.ErrInvalid))
	require.Zero(t, nilDev.Live())

	// Close gives back what is live.
	for range 3 {
		_, err := d.Create(0, chunk, driver.ChunkOptions{})
		require.NoError(t, err)
	}
	require.Equal(t, uint64(3*chunk), hold())
	require.NoError(t, d.Unreserve(base, 8*mib))
	require.NoError(t, d.Close())
	require.Zero(t, hold())
	require.True(t, errors.Is(d.Close(), driver.ErrClosed))
}

// TestDeviceNoLeaks: a shared device used and closed leaves no
// descriptor or mapping behind.
func TestDeviceNoLeaks(t *testing.T) {
	path := bookPath(t)
	work := func() {
		b := open(t, path, 16*mib)
		m, err := b.Join("m", 0, 16*mib, nil)
		require.NoError(t, err)
		d, err := hostDevice(16*mib, m)
		require.NoError(t, err)
		base, err := d.Reserve(8*mib, 0, 0)
		require.NoError(t, err)
		h, err := d.Create(0, chunk, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(base, h))
		require.NoError(t, d.Unmap(base, chunk))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(base, 8*mib))
		require.NoError(t, d.Close())
		require.NoError(t, m.Close())
		require.NoError(t, b.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %v, after %v", before, after)
}

// TestDeviceConformance: the shared device passes the driver contract,
// every test on a book as large as the device. The sim driver stands
// under it: the suite leaves mappings at the end of some tests, which
// only the host driver's own tests can tear down.
func TestDeviceConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		b := open(t, bookPath(t), 64*mib)
		m, err := b.Join("m", 0, 64*mib, nil)
		require.NoError(t, err)
		d, err := sim.New(sim.Options{Devices: 2, Capacity: 64 * mib})
		require.NoError(t, err)
		w, err := NewDevice(d, 0, m)
		require.NoError(t, err)
		t.Cleanup(func() {
			if err := w.Close(); err != nil && !errors.Is(err, driver.ErrClosed) && !errors.Is(err, driver.ErrBusy) {
				t.Errorf("closing the driver: %v", err)
			}
			in, err := m.Info()
			require.NoError(t, err)
			require.Equal(t, w.(*Device).Live(), in.Committed, "the hold is the live chunks' bytes")
			require.NoError(t, m.Close())
			require.NoError(t, b.Close())
		})
		return w
	})
}

// TestDeviceCUDA: over the CUDA driver (its C stand-in), the device's
// own count of free memory (cuMemGetInfo) is asked too: memory taken
// outside the book is not promised again, and a book larger than the
// device is refused.
func TestDeviceCUDA(t *testing.T) {
	cfg := cudatest.Small()
	g := cfg.MinGranularity
	d, _ := cudatest.Open(t, cfg, cuda.Options{})

	big := open(t, bookPath(t), 2*cfg.Capacity)
	bm, err := big.Join("big", 0, 2*cfg.Capacity, nil)
	require.NoError(t, err)
	_, err = NewDevice(d, 0, bm)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.Contains(t, err.Error(), "over the device's")
	require.NoError(t, bm.Close())
	require.NoError(t, big.Close())

	b := open(t, bookPath(t), cfg.Capacity)
	defer b.Close()
	m, err := b.Join("m", 0, cfg.Capacity, nil)
	require.NoError(t, err)
	defer m.Close()
	w, err := NewDevice(d, 0, m)
	require.NoError(t, err)
	h, err := w.Create(0, 4*g, driver.ChunkOptions{})
	require.NoError(t, err)
	// Another user of the device, outside the book, takes 56 granules.
	out, err := d.Create(0, 56*g, driver.ChunkOptions{})
	require.NoError(t, err)
	_, err = w.Create(0, 8*g, driver.ChunkOptions{})
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Contains(t, err.Error(), "taken outside the book")
	in, err := m.Info()
	require.NoError(t, err)
	require.Equal(t, 4*g, in.Committed, "the hold as it was")
	h2, err := w.Create(0, 4*g, driver.ChunkOptions{})
	require.NoError(t, err, "what the device has left")
	require.NoError(t, d.Release(out))
	require.NoError(t, w.Release(h))
	require.NoError(t, w.Release(h2))
	in, err = m.Info()
	require.NoError(t, err)
	require.Zero(t, in.Committed)
	require.NoError(t, w.Close())
}

// TestDeviceReleaseRefusedByTheBook: a chunk released while something
// that is not a member holds the book's lock goes back to the device,
// and the Release answers the book's ErrBusy; its bytes are given back
// to the member at the next call that reaches the book once the lock is
// free, so the member's hold is again what the device has live.
func TestDeviceReleaseRefusedByTheBook(t *testing.T) {
	old := lockWait
	lockWait = 100 * time.Millisecond
	t.Cleanup(func() { lockWait = old })
	path := bookPath(t)
	b := open(t, path, 16*mib)
	defer b.Close()
	m, err := b.Join("m", 0, 16*mib, nil)
	require.NoError(t, err)
	defer m.Close()
	hold := func() uint64 {
		in, err := m.Info()
		require.NoError(t, err)
		return in.Committed
	}
	d, err := hostDevice(16*mib, m)
	require.NoError(t, err)
	w := d.(*deviceHost).Device
	h, err := d.Create(0, chunk, driver.ChunkOptions{})
	require.NoError(t, err)
	h2, err := d.Create(0, chunk, driver.ChunkOptions{})
	require.NoError(t, err)

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, ofd(f, unix.F_OFD_SETLK, unix.F_WRLCK, 0))
	err = d.Release(h)
	require.ErrorIs(t, err, driver.ErrBusy)
	require.Equal(t, uint64(chunk), w.Live(), "the chunk is back on the device")
	require.Equal(t, uint64(chunk), d.(driver.Books).Used(0))
	require.NoError(t, f.Close()) // the lock goes with it

	h3, err := d.Create(0, chunk, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, w.Live(), hold(), "the member holds what the device has live")
	require.NoError(t, d.Release(h2))
	require.NoError(t, d.Release(h3))
	require.Zero(t, w.Live())
	require.Zero(t, hold())
	require.NoError(t, d.Close())
	require.Zero(t, hold())
}
