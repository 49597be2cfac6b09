package tensor_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// hammer runs At and Set over every element of x in a loop on another
// goroutine until the returned stop is called (at most 10 s: a watchdog,
// the callers stop it long before). A fault would kill the test binary.
func hammer(t *testing.T, x *tensor.Tensor) (stop func() int) {
	t.Helper()
	n := x.NumElements()
	var quit atomic.Bool
	var rounds atomic.Int64
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; !quit.Load(); k++ {
			i := k % n
			if err := x.Set(float64(k%1000), i); err != nil {
				t.Errorf("set %d: %v", i, err)
				return
			}
			if _, err := x.At(i); err != nil {
				t.Errorf("at %d: %v", i, err)
				return
			}
			if rounds.Add(1) == 1 {
				close(started)
			}
		}
	}()
	<-started // the loop is running before the caller's operations start
	return func() int {
		quit.Store(true)
		wg.Wait()
		return int(rounds.Load())
	}
}

// TestArenaTensorPinsItsMemory: Move, SetAccess and Grant over the memory
// of a live OnArena tensor, while another goroutine reads and writes it
// with At and Set, are refused with ErrBusy naming the view, and leave
// the arena as it was (stats, layout, access, bytes); nothing faults. Once
// the tensor is released they go through. (Unpinned, Move would unmap the
// old chunk before mapping the new one under the tensor, and SetAccess to
// none or read would be accepted, so the next At or Set would fault.)
func TestArenaTensorPinsItsMemory(t *testing.T) {
	s := newStack(t)
	a, err := arena.New(s.space, s.mem, arena.Options{Max: 8 * gran, ChunkSize: gran, MaxChunk: gran})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	x, err := tensor.OnArena(a, tensor.Int32, int(3*gran/4)) // 3 chunks' worth
	require.NoError(t, err)
	for i := range x.NumElements() {
		require.NoError(t, x.Set(float64(i), i))
	}
	committed := a.Committed()
	before, layout := a.Stats(), a.Layout()

	stop := hammer(t, x)
	refused := map[string]func() error{
		"move":               func() error { return a.Move(0, committed, 1) },
		"move one chunk":     func() error { return a.Move(gran, gran, 1) },
		"set access to none": func() error { return a.SetAccess(0, driver.AccessNone) },
		"set access to read": func() error { return a.SetAccess(0, driver.AccessRead) },
		"grant none":         func() error { return a.Grant(0, gran, gran, driver.AccessNone) },
		"grant read":         func() error { return a.Grant(0, 0, committed, driver.AccessRead) },
	}
	for range 20 {
		for name, op := range refused {
			drivertest.RequireIs(t, op(), driver.ErrBusy, "live view")
			require.Equal(t, before, a.Stats(), name)
			require.Equal(t, layout, a.Layout(), name)
			acc, err := a.AccessAt(0, gran)
			require.NoError(t, err)
			require.Equal(t, driver.AccessReadWrite, acc, name)
			require.Equal(t, driver.AccessReadWrite, a.Access(0), name)
		}
	}
	// Another device's access may change: the host keeps device 0's.
	require.NoError(t, a.SetAccess(1, driver.AccessRead))
	require.NoError(t, a.SetAccess(1, driver.AccessNone))
	require.Positive(t, stop())
	require.NoError(t, a.Check())

	for i := range x.NumElements() {
		require.NoError(t, x.Set(float64(i), i))
	}
	require.NoError(t, x.Release())
	require.NoError(t, a.Move(0, committed, 1), "nothing pins it any more")
	dev, err := a.DeviceAt(0)
	require.NoError(t, err)
	require.Equal(t, driver.DeviceID(1), dev)
	require.NoError(t, a.SetAccess(0, driver.AccessRead))
	require.NoError(t, a.Check())
}

// TestOnArenaRefusesReadOnlyMemory: a tensor is written through its
// storage, so OnArena over memory that no device may write is refused
// (ErrAccessDenied) instead of handing out a tensor whose Set faults, and
// the arena is as it was.
func TestOnArenaRefusesReadOnlyMemory(t *testing.T) {
	a := newArena(t, 8*gran)
	require.NoError(t, a.Grow(gran))
	require.NoError(t, a.SetAccess(0, driver.AccessRead))
	before := a.Stats()
	_, err := tensor.OnArena(a, tensor.Float32, 16)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not writable")
	require.Equal(t, before, a.Stats())
	require.NoError(t, a.Check())

	require.NoError(t, a.SetAccess(0, driver.AccessReadWrite))
	x, err := tensor.OnArena(a, tensor.Float32, 16)
	require.NoError(t, err)
	require.NoError(t, x.Set(1.5, 3))
	require.NoError(t, x.Release())
}

// TestAllocatorTensorPinsItsMemory: SetAccess on an allocator that would
// take write access from memory under a live Empty tensor is refused
// (ErrBusy) while another goroutine reads and writes the tensor; nothing
// changes and nothing faults. With no live allocation it goes through,
// and Empty then refuses memory it could not write (ErrAccessDenied).
func TestAllocatorTensorPinsItsMemory(t *testing.T) {
	al := newAllocator(t, 8*gran)
	x, err := tensor.Empty(al, tensor.Float64, 100)
	require.NoError(t, err)
	before := al.Stats()
	stop := hammer(t, x)
	for range 20 {
		for _, acc := range []driver.Access{driver.AccessNone, driver.AccessRead} {
			drivertest.RequireIs(t, al.SetAccess(0, acc), driver.ErrBusy, "1 live allocation")
			require.Equal(t, before, al.Stats())
			require.Equal(t, driver.AccessReadWrite, al.Access(0))
		}
	}
	require.NoError(t, al.SetAccess(1, driver.AccessRead), "device 1's access may change")
	require.Positive(t, stop())
	require.NoError(t, al.Check())
	require.NoError(t, x.Release())

	require.NoError(t, al.SetAccess(0, driver.AccessRead))
	_, err = tensor.Empty(al, tensor.Float64, 100)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not writable")
	require.Zero(t, al.Stats().Live)
	require.NoError(t, al.SetAccess(0, driver.AccessReadWrite))
	require.NoError(t, al.Check())
}

// TestFreeOfATensorsAllocation: freeing the allocation of a live Empty
// tensor by its address is refused (ErrBusy: the tensor owns it), and
// nothing changes; the tensor's Release frees exactly its own allocation.
// (Were the Free to go through, a new allocation could reuse the address,
// and the tensor's Release would free that one.)
func TestFreeOfATensorsAllocation(t *testing.T) {
	al := newAllocator(t, 8*gran)
	x, err := tensor.Empty(al, tensor.Float32, 64)
	require.NoError(t, err)
	require.NoError(t, x.Set(7, 5))
	before := al.Stats()
	drivertest.RequireIs(t, al.Free(x.Addr()), driver.ErrBusy, "owned by its holder")
	require.Equal(t, before, al.Stats())
	require.NoError(t, al.Check())
	v, err := x.At(5)
	require.NoError(t, err)
	require.Equal(t, 7.0, v)

	other, err := al.Alloc(64*4, tensor.AllocAlign)
	require.NoError(t, err)
	require.NotEqual(t, x.Addr(), other)
	require.NoError(t, x.Release())
	n, err := al.Size(other)
	require.NoError(t, err, "the tensor's Release left the other allocation alone")
	require.Equal(t, uint64(64*4), n)
	drivertest.RequireIs(t, x.Release(), driver.ErrClosed)
	require.NoError(t, al.Free(other))
	require.Zero(t, al.Stats().Live)
}

// TestAppendRowsAgainstArenaAppend: AppendRows and arena.Append on the
// Growable's arena from two goroutines (misuse: the arena is the
// Growable's) never hand out the same bytes: every row tensor and every
// appended view are disjoint, and an AppendRows that finds the arena
// grown by someone else is refused (ErrBusy) with the Growable unchanged.
// (An AppendRows that read Len, then grew, would let an Append in between
// get the bytes of its rows.)
func TestAppendRowsAgainstArenaAppend(t *testing.T) {
	const rowBytes = 256
	for round := range 40 {
		a := newArena(t, 64*gran)
		g, err := tensor.NewGrowable(a, tensor.Uint8, rowBytes)
		require.NoError(t, err)
		type span struct{ lo, hi driver.Addr }
		var rows, views []span
		var keep []*arena.View
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			for range 30 {
				x, err := g.AppendRows(1)
				if err != nil {
					if !errors.Is(err, driver.ErrBusy) {
						t.Errorf("append rows: %v", err)
					}
					continue
				}
				rows = append(rows, span{x.Addr(), x.Addr() + rowBytes})
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			for range 30 {
				v, err := a.Append(rowBytes, 1)
				if err != nil {
					t.Errorf("arena append: %v", err)
					return
				}
				keep = append(keep, v)
				views = append(views, span{v.Addr(), v.Addr() + rowBytes})
			}
		}()
		close(start)
		wg.Wait()
		for _, r := range rows {
			for _, v := range views {
				require.False(t, r.lo < v.hi && v.lo < r.hi, "round %d: row [%#x, %#x) and view [%#x, %#x) overlap", round, r.lo, r.hi, v.lo, v.hi)
			}
		}
		require.NoError(t, g.Check())
		require.Len(t, rows, g.Rows())
		require.NoError(t, g.Release())
		for _, v := range keep {
			require.NoError(t, v.Release())
		}
	}
}
