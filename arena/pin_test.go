package arena

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/procmaps"
)

// touchLoop stores and loads every byte of b, one a step, on another
// goroutine until stop is called (a 10 s watchdog ends it otherwise); stop
// returns how many steps ran. A fault would kill the test binary.
func touchLoop(b []byte) (stop func() int) {
	var quit atomic.Bool
	var steps atomic.Int64
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; !quit.Load(); k++ {
			i := (k * 4099) % len(b)
			b[i] = byte(i)
			if b[i] != byte(i) {
				panic("the byte just stored changed")
			}
			if steps.Add(1) == 1 {
				close(started)
			}
		}
	}()
	<-started // the loop is running before the caller's operations start
	return func() int {
		quit.Store(true)
		wg.Wait()
		return int(steps.Load())
	}
}

// TestViewPinsAgainstMoveAndRevoke: while another goroutine loads and
// stores through a live view's bytes, Move over its chunks and any
// SetAccess or Grant that would leave them writable by no device are
// refused (ErrBusy, naming the views), and the range is as it was: stats,
// layout, access, bytes. Changes that leave some device write access go
// through. (Were the view not to pin them, Move would unmap the chunk
// under it and the revokes would be accepted: the next store would fault.)
func TestViewPinsAgainstMoveAndRevoke(t *testing.T) {
	e := newEnv(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Access: []driver.DeviceID{0, 1}})
	require.NoError(t, s.Commit(0, 4*g))
	v, err := s.View(g, 2*g)
	require.NoError(t, err)
	b, err := v.Bytes()
	require.NoError(t, err)
	for i := range b {
		b[i] = byte(i) // what the loop stores too
	}
	before, layout := s.Stats(), s.Layout()

	stop := touchLoop(b)
	for range 20 {
		for name, op := range map[string]func() error{
			"move":                  func() error { return s.Move(0, 4*g, 1) },
			"move the viewed chunk": func() error { return s.Move(2*g, g, 1) },
			"grant read to both": func() error {
				if err := s.Grant(0, g, g, driver.AccessRead); err != nil {
					return err
				}
				return s.Grant(1, g, g, driver.AccessRead)
			},
			"set access to none for both": func() error {
				if err := s.SetAccess(1, driver.AccessNone); err != nil {
					return err
				}
				return s.SetAccess(0, driver.AccessNone)
			},
		} {
			err := op()
			drivertest.RequireIs(t, err, driver.ErrBusy, "1 live view(s) pin the chunk at")
			// The first half of the two-step ops went through (device 0
			// or 1 still writes); put it back before comparing.
			require.NoError(t, s.Grant(0, 0, 4*g, driver.AccessReadWrite), name)
			require.NoError(t, s.SetAccess(1, driver.AccessReadWrite), name)
			after := s.Stats()
			after.Grants = before.Grants
			require.Equal(t, before, after, name)
			require.Equal(t, layout, s.Layout(), name)
		}
	}
	require.Positive(t, stop())
	require.NoError(t, s.Check())
	for i := range b {
		require.Equal(t, byte(i), b[i], "byte %d of the view", i)
	}
	require.NoError(t, v.Release())
	require.NoError(t, s.Move(0, 4*g, 1), "nothing pins the chunks any more")
	require.NoError(t, s.SetAccess(0, driver.AccessNone))
	require.NoError(t, s.SetAccess(1, driver.AccessNone))
	require.NoError(t, s.Check())
}

// TestViewsMadeDuringMoves: one goroutine makes views, stores and loads
// through them and releases them while another moves the chunks back and
// forth. A move that meets a view — made before it looked or while it
// copied — is refused (ErrBusy) and changes nothing; no store faults and
// none is lost.
func TestViewsMadeDuringMoves(t *testing.T) {
	e := newEnv(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 4 * g, ChunkSize: g})
	require.NoError(t, s.Commit(0, 4*g))
	var quit atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; !quit.Load(); k++ {
			off := uint64(k%4) * g
			v, err := s.View(off, g)
			if err != nil {
				t.Errorf("view: %v", err)
				return
			}
			b, err := v.Bytes()
			if err != nil {
				t.Errorf("bytes: %v", err)
				return
			}
			for i := 0; i < len(b); i += 512 {
				b[i] = byte(k)
			}
			for i := 0; i < len(b); i += 512 {
				if b[i] != byte(k) {
					t.Errorf("view at %#x: byte %d is %d, %d was stored", off, i, b[i], byte(k))
				}
			}
			if err := v.Release(); err != nil {
				t.Errorf("release: %v", err)
				return
			}
		}
	}()
	moved, busy, on := 0, 0, driver.DeviceID(0)
	for i := 0; i < 200 && !t.Failed(); i++ {
		to := driver.DeviceID(1 - i%2)
		err := s.Move(0, 4*g, to)
		switch {
		case err == nil:
			if to != on {
				moved, on = moved+1, to
			}
		case errors.Is(err, driver.ErrBusy):
			busy++
		default:
			require.NoError(t, err)
		}
	}
	quit.Store(true)
	wg.Wait()
	require.NoError(t, s.Check())
	require.Equal(t, moved, s.Stats().Moves, "%d moves went through, %d were refused", moved, busy)
	require.Equal(t, []Extent{{0, 4 * g, on, false}}, s.Layout())
}

// TestAllocatorPinsLiveAllocations: with an allocation live, SetAccess
// that would leave the memory writable by no device is refused (ErrBusy)
// and changes nothing; Bytes refuses memory no device may write
// (ErrAccessDenied), as AllocOwned does before allocating.
func TestAllocatorPinsLiveAllocations(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 8*g, PolicyDefault)
	p, err := al.Alloc(1000, 0)
	require.NoError(t, err)
	b, err := al.Bytes(p)
	require.NoError(t, err)
	b[999] = 7
	before := al.Stats()
	for _, acc := range []driver.Access{driver.AccessNone, driver.AccessRead} {
		drivertest.RequireIs(t, al.SetAccess(0, acc), driver.ErrBusy, "1 live allocation(s)")
		require.Equal(t, before, al.Stats())
		require.Equal(t, driver.AccessReadWrite, al.Access(0))
	}
	require.NoError(t, al.Check())
	require.Equal(t, byte(7), b[999])
	require.NoError(t, al.SetAccess(1, driver.AccessNone), "device 1's access may change")
	require.NoError(t, al.Free(p))

	require.NoError(t, al.SetAccess(0, driver.AccessRead), "no allocation is live")
	p, err = al.Alloc(1000, 0)
	require.NoError(t, err)
	_, err = al.Bytes(p)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not writable by any device")
	require.NoError(t, al.Free(p))
	_, err = al.AllocOwned(1000, 0)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not writable by any device")
	require.Zero(t, al.Stats().Live)
	require.NoError(t, al.SetAccess(0, driver.AccessReadWrite))
	require.NoError(t, al.Check())
}

// TestOwnedAllocation: Free of an owned allocation's address is refused
// (ErrBusy) and changes nothing; its Release frees exactly it, once, even
// when another allocation later takes the same address.
func TestOwnedAllocation(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 8*g, PolicyDefault)
	o, err := al.AllocOwned(4096, 256)
	require.NoError(t, err)
	require.Equal(t, uint64(4096), o.Size())
	b, err := o.Bytes()
	require.NoError(t, err)
	require.Len(t, b, 4096)
	b[0] = 1
	before := al.Stats()
	drivertest.RequireIs(t, al.Free(o.Addr()), driver.ErrBusy, "owned by its holder")
	require.Equal(t, before, al.Stats())
	require.NoError(t, al.Check())

	require.NoError(t, o.Release())
	drivertest.RequireIs(t, o.Release(), driver.ErrClosed)
	_, err = o.Bytes()
	drivertest.RequireIs(t, err, driver.ErrClosed)
	drivertest.RequireIs(t, al.Free(o.Addr()), driver.ErrNotAllocated)
	p, err := al.Alloc(4096, 256)
	require.NoError(t, err)
	require.Equal(t, o.Addr(), p, "the address is reused")
	drivertest.RequireIs(t, o.Release(), driver.ErrClosed, "already released")
	n, err := al.Size(p)
	require.NoError(t, err, "the stale handle left the new allocation alone")
	require.Equal(t, uint64(4096), n)
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Check())

	for _, z := range []*Owned{nil, {}} {
		drivertest.RequireIs(t, z.Release(), driver.ErrInvalid, "not made by Allocator.AllocOwned")
		_, err := z.Bytes()
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not made by Allocator.AllocOwned")
		require.Zero(t, z.Addr())
		require.Zero(t, z.Size())
	}
}

// TestAppendAndResizeFrom: Append refuses memory no device may write
// (ErrAccessDenied) before growing; ResizeFrom grows or shrinks only from
// the length it is given (ErrBusy otherwise), and not under a live view.
func TestAppendAndResizeFrom(t *testing.T) {
	e := newEnv(t, 16*g)
	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g})
	require.NoError(t, a.Grow(100))
	require.NoError(t, a.SetAccess(0, driver.AccessRead))
	before := a.Stats()
	for _, n := range []uint64{10, 2 * g} { // inside the committed chunk, and past it
		_, err := a.Append(n, 8)
		drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not writable by any device")
		require.Equal(t, before, a.Stats())
	}
	require.NoError(t, a.SetAccess(0, driver.AccessReadWrite))
	v, err := a.Append(10, 8)
	require.NoError(t, err)
	require.Equal(t, uint64(104), v.Offset())

	before = a.Stats()
	drivertest.RequireIs(t, a.ResizeFrom(100, 200), driver.ErrBusy, "the arena is 114 B long")
	drivertest.RequireIs(t, a.ResizeFrom(114, 50), driver.ErrBusy, "reaches past it")
	require.Equal(t, before, a.Stats())
	require.NoError(t, a.ResizeFrom(114, 3*g))
	require.Equal(t, 3*g, a.Len())
	require.NoError(t, a.ResizeFrom(3*g, 114))
	require.NoError(t, v.Release())
	require.NoError(t, a.ResizeFrom(114, 0))
	require.NoError(t, a.Check())
}

// TestReadOnlyViewPins: a read-only view lets its chunks' access drop to
// read-only — and then its bytes are the pages themselves, mapped
// read-only (the kernel says r--), while a plain view's Bytes over them is
// still refused — but not to none: a SetAccess or Grant that would leave
// them readable by no device is refused (ErrBusy, naming the read-only
// views) and changes nothing, and so are Move and Decommit under it. A
// plain view next to it keeps its own chunk writable.
func TestReadOnlyViewPins(t *testing.T) { onEveryDriver(t, readOnlyViewPins) }

func readOnlyViewPins(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, s.Commit(0, 4*g))
	want := []byte("the shared prefix")
	require.NoError(t, s.Write(0, g+5, want))
	rv, err := s.ViewReadOnly(g, 2*g)
	require.NoError(t, err)
	require.Equal(t, "read-only view [0x10000, +128 KiB)", rv.String())
	wv, err := s.View(3*g, g)
	require.NoError(t, err)

	accessIs := func(acc driver.Access, off uint64) {
		t.Helper()
		got, err := s.AccessAt(0, off)
		require.NoError(t, err)
		require.Equal(t, acc, got)
		got, err = e.drv.Access(s.Base()+driver.Addr(off), 0)
		require.NoError(t, err)
		require.Equal(t, acc, got, "the driver's access at %#x", off)
		if d.Name == "host" {
			es, err := procmaps.Read()
			require.NoError(t, err)
			m, ok := procmaps.Find(es, uint64(s.Base())+off)
			require.True(t, ok)
			require.Equal(t, acc.Allows(driver.AccessRead), m.Readable(), "the kernel's %s at %#x", m.Perms, off)
			require.Equal(t, acc.Allows(driver.AccessReadWrite), m.Writable(), "the kernel's %s at %#x", m.Perms, off)
		}
	}
	refused := func(name string, err error, wantErr error, msg string) {
		t.Helper()
		drivertest.RequireIs(t, err, wantErr, msg)
		require.NoError(t, s.Check(), name)
	}

	// Read-only is allowed under the read-only view.
	require.NoError(t, s.Grant(0, g, 2*g, driver.AccessRead))
	accessIs(driver.AccessRead, g)
	accessIs(driver.AccessRead, 2*g)
	accessIs(driver.AccessReadWrite, 3*g)
	if e.hostMapped() {
		b, err := rv.Bytes()
		require.NoError(t, err, "a read-only view's bytes over read-only memory")
		require.Equal(t, want, b[5:5+len(want)])
		pv, err := s.View(g, g)
		require.NoError(t, err)
		_, err = pv.Bytes()
		refused("a plain view's bytes", err, driver.ErrAccessDenied, "not writable by any device")
		require.NoError(t, pv.Release())
	}

	before, layout := s.Stats(), s.Layout()
	for name, op := range map[string]func() error{
		"grant none":           func() error { return s.Grant(0, g, g, driver.AccessNone) },
		"grant none over both": func() error { return s.Grant(0, 0, 3*g, driver.AccessNone) },
		"set access to none":   func() error { return s.SetAccess(0, driver.AccessNone) },
	} {
		refused(name, op(), driver.ErrBusy, "1 live read-only view(s) pin the chunk at [0x10000, +64 KiB), which no device could read any more")
		require.Equal(t, before, s.Stats(), name)
		require.Equal(t, layout, s.Layout(), name)
		accessIs(driver.AccessReadWrite, 0)
		accessIs(driver.AccessRead, g)
		accessIs(driver.AccessRead, 2*g)
	}
	// The plain view keeps its chunk writable: read-only is refused there.
	refused("grant read under the plain view", s.Grant(0, 3*g, g, driver.AccessRead), driver.ErrBusy,
		"1 live view(s) pin the chunk at [0x30000, +64 KiB), which no device could write any more")
	accessIs(driver.AccessReadWrite, 3*g)
	refused("move", s.Move(g, g, 1), driver.ErrBusy, "pin")
	refused("decommit", s.Decommit(g, g), driver.ErrBusy, "pin")
	require.Equal(t, before, s.Stats())
	got := make([]byte, len(want))
	require.NoError(t, s.Read(0, g+5, got))
	require.Equal(t, want, got)

	// Check counts each chunk's read-only views.
	i, ok := s.slots.Find(g)
	require.True(t, ok)
	s.slots.At(i).Val.readViews--
	require.ErrorContains(t, s.Check(), "chunk at 0x10000 counts 1 views (0 read-only), 1 (1) cover it")
	s.slots.At(i).Val.readViews++
	require.NoError(t, s.Check())

	// Another device that reads is enough.
	require.NoError(t, s.Grant(1, g, g, driver.AccessRead))
	require.NoError(t, s.Grant(0, g, g, driver.AccessNone))
	require.NoError(t, s.Grant(0, g, g, driver.AccessRead))
	require.NoError(t, s.Grant(1, g, g, driver.AccessNone))

	// Released, the view pins nothing; a read-only view over memory no
	// device reads has no bytes.
	require.NoError(t, rv.Release())
	_, err = rv.Bytes()
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.NoError(t, s.Grant(0, g, 2*g, driver.AccessNone))
	accessIs(driver.AccessNone, g)
	rv, err = s.ViewReadOnly(g, g)
	require.NoError(t, err)
	if e.hostMapped() {
		_, err = rv.Bytes()
		drivertest.RequireIs(t, err, driver.ErrAccessDenied, "not readable by any device")
	}
	require.NoError(t, s.Grant(0, g, g, driver.AccessRead), "read access may come back under it")
	require.NoError(t, rv.Release())
	require.NoError(t, wv.Release())
	require.NoError(t, s.Check())
}

// TestArenaReadOnlyView: an arena's read-only view lies inside Len, as its
// plain views do, and pins its chunk the same way.
func TestArenaReadOnlyView(t *testing.T) {
	e := newEnv(t, 16*g)
	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g})
	require.NoError(t, a.Grow(g))
	require.NoError(t, a.Grow(g)) // two chunks
	_, err := a.ViewReadOnly(g, 2*g)
	drivertest.RequireIs(t, err, driver.ErrNotMapped, "the arena is 128 KiB long")
	_, err = a.ViewReadOnly(0, 0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "zero bytes")
	v, err := a.ViewReadOnly(g, g)
	require.NoError(t, err)
	require.NoError(t, a.Grant(0, g, g, driver.AccessRead))
	b, err := v.Bytes()
	require.NoError(t, err)
	require.Len(t, b, int(g))
	drivertest.RequireIs(t, a.SetAccess(0, driver.AccessNone), driver.ErrBusy, "read-only view(s)")
	drivertest.RequireIs(t, a.Shrink(g), driver.ErrBusy, "reaches past it")
	require.Equal(t, 1, a.Stats().Views)
	require.NoError(t, a.Check())
	require.NoError(t, v.Release())
	require.NoError(t, a.SetAccess(0, driver.AccessNone))
	require.NoError(t, a.Check())
}
