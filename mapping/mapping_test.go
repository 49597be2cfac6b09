package mapping_test

import (
	"bytes"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

const gran = 64 * units.KiB

// stack is the whole core on a small host driver: two devices of 16
// granules, one 32-granule reservation with its table.
type stack struct {
	drv   *host.Driver
	space *vaspace.Space
	mem   *physical.Memory
	res   *vaspace.Reservation
	tab   *mapping.Table
}

func newStack(t testing.TB) *stack {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 2, Capacity: 16 * gran, Granularity: gran})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	s := &stack{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
	s.res, err = s.space.Reserve(32*gran, 0)
	require.NoError(t, err)
	s.tab, err = mapping.New(s.res, s.mem)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := s.tab.Close(); err != nil && !errors.Is(err, driver.ErrClosed) {
			t.Errorf("closing the table: %v", err)
		}
	})
	return s
}

func (s *stack) at(g float64) driver.Addr { return s.res.Base() + driver.Addr(g*float64(gran)) }

// state is everything a refused call must leave as it was: the table's
// spans, each device's usage, the chunks, and the kernel's mappings of the
// reservation.
type state struct {
	Spans  []mapping.Span
	Usage  []physical.Usage
	Chunks []string
	Kernel []procmaps.Entry
}

func (s *stack) state(t testing.TB) state {
	t.Helper()
	var st state
	for sp := range s.tab.Spans() {
		st.Spans = append(st.Spans, sp)
	}
	for d := range s.drv.Devices() {
		u, err := s.mem.Usage(driver.DeviceID(d))
		require.NoError(t, err)
		st.Usage = append(st.Usage, u)
	}
	for _, c := range s.mem.Chunks() {
		st.Chunks = append(st.Chunks, fmt.Sprintf("%s released=%v maps=%d", c, c.Released(), c.Mappings()))
	}
	es, err := procmaps.Read()
	require.NoError(t, err)
	r := s.res.Range()
	st.Kernel = procmaps.Within(es, uint64(r.Base), uint64(r.End()))
	require.NoError(t, s.tab.Check())
	require.NoError(t, s.mem.Check())
	require.NoError(t, s.drv.Check())
	return st
}

// TestBadInput: every refusal the issue lists, each checked for its
// sentinel (and, where it helps the user, its message) and for leaving the
// whole stack as it was.
func TestBadInput(t *testing.T) {
	s := newStack(t)
	a, err := s.mem.Create(0, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	b, err := s.mem.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	dead, err := s.mem.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, dead.Release())
	require.NoError(t, s.tab.Map(s.at(4), a))
	require.NoError(t, s.tab.SetAccess(s.at(4), gran, 0, driver.AccessRead))
	require.NoError(t, s.tab.SetAccess(s.at(4), 2*gran, 1, driver.AccessReadWrite))
	require.NoError(t, s.tab.Write(1, s.at(4), []byte("keep")))
	other, err := s.space.Reserve(4*gran, 0)
	require.NoError(t, err)
	otherMem := physical.New(s.drv)
	foreign, err := otherMem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	buf := make([]byte, 4)

	cases := []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"create zero size", func() error { _, err := s.mem.Create(0, 0, driver.ChunkOptions{}); return err }, driver.ErrInvalid, "zero"},
		{"create misaligned size", func() error { _, err := s.mem.Create(0, gran+4096, driver.ChunkOptions{}); return err },
			driver.ErrMisaligned, "64 KiB"},
		{"create on unknown device", func() error { _, err := s.mem.Create(2, gran, driver.ChunkOptions{}); return err },
			driver.ErrNoDevice, "device 2"},
		{"create out of memory", func() error { _, err := s.mem.Create(0, 16*gran, driver.ChunkOptions{}); return err },
			driver.ErrOutOfMemory, "asked 1 MiB, device has 832 KiB free"},
		{"release released chunk", dead.Release, driver.ErrBadHandle, "already released"},
		{"reserve zero size", func() error { _, err := s.space.Reserve(0, 0); return err }, driver.ErrInvalid, ""},
		{"reserve misaligned size", func() error { _, err := s.space.Reserve(gran/2, 0); return err }, driver.ErrMisaligned, "64 KiB"},
		{"reserve alignment not a power of two", func() error { _, err := s.space.Reserve(gran, 3*gran); return err },
			driver.ErrInvalid, "power of two"},
		{"map at misaligned address", func() error { return s.tab.Map(s.at(10.5), b) }, driver.ErrMisaligned, "64 KiB"},
		{"map outside the reservation", func() error { return s.tab.Map(other.Base(), b) }, driver.ErrNotReserved, ""},
		{"map across the reservation's end", func() error { return s.tab.Map(s.at(31), a) }, driver.ErrNotReserved, ""},
		{"map over a mapped granule", func() error { return s.tab.Map(s.at(5), b) }, driver.ErrOverlap, "chunk"},
		{"map a released chunk", func() error { return s.tab.Map(s.at(10), dead) }, driver.ErrBadHandle, "released"},
		{"map a chunk of another memory", func() error { return s.tab.Map(s.at(10), foreign) }, driver.ErrBadHandle, "another"},
		{"unmap an unmapped address", func() error { return s.tab.Unmap(s.at(10)) }, driver.ErrNotMapped, ""},
		{"unmap part of a mapping", func() error { return s.tab.Unmap(s.at(5)) }, driver.ErrPartial, "inside the mapping"},
		{"unmap a range cutting a mapping", func() error {
			return s.tab.UnmapRange(vaspace.Range{Base: s.at(0), Size: 5 * gran})
		}, driver.ErrPartial, ""},
		{"unmap outside the reservation", func() error { return s.tab.Unmap(other.Base()) }, driver.ErrNotReserved, ""},
		{"set access on an unmapped range", func() error { return s.tab.SetAccess(s.at(10), gran, 0, driver.AccessRead) },
			driver.ErrNotMapped, ""},
		{"set access on a partly mapped range", func() error { return s.tab.SetAccess(s.at(4), 3*gran, 0, driver.AccessRead) },
			driver.ErrNotMapped, ""},
		{"set access for an unknown device", func() error { return s.tab.SetAccess(s.at(4), gran, 7, driver.AccessRead) },
			driver.ErrNoDevice, ""},
		{"set access to an undefined value", func() error { return s.tab.SetAccess(s.at(4), gran, 0, 2) }, driver.ErrInvalid, ""},
		{"set access over zero bytes", func() error { return s.tab.SetAccess(s.at(4), 0, 0, driver.AccessRead) }, driver.ErrInvalid, ""},
		{"set access at a misaligned address", func() error { return s.tab.SetAccess(s.at(4.5), gran, 0, driver.AccessRead) },
			driver.ErrMisaligned, ""},
		{"read a reserved-only granule", func() error { return s.tab.Read(0, s.at(20), buf) }, driver.ErrAccessDenied, "not mapped"},
		{"read without access", func() error { return s.tab.Read(0, s.at(5), buf) }, driver.ErrAccessDenied, "no access"},
		{"write with read access", func() error { return s.tab.Write(0, s.at(4), []byte("lost")) }, driver.ErrAccessDenied, "read access"},
		{"read for an unknown device", func() error { return s.tab.Read(9, s.at(4), buf) }, driver.ErrNoDevice, ""},
		{"lookup an unmapped address", func() error { _, err := s.tab.Lookup(s.at(0)); return err }, driver.ErrNotMapped, ""},
		{"free a reservation with live mappings", s.res.Free, driver.ErrBusy, "chunk 1"},
		{"map a nil chunk", func() error { return s.tab.Map(s.at(10), nil) }, driver.ErrInvalid, "the chunk is nil"},
		{"map a chunk not made by Create", func() error { return s.tab.Map(s.at(10), &physical.Chunk{}) }, driver.ErrBadHandle, "another"},
		{"unmap a range past the top of the address space", func() error {
			return s.tab.UnmapRange(vaspace.Range{Base: s.at(4), Size: math.MaxUint64})
		}, driver.ErrInvalid, "past the end of the address space"},
		{"new table of a nil reservation", func() error { _, err := mapping.New(nil, s.mem); return err }, driver.ErrInvalid, "nil"},
		{"new table of a nil memory", func() error { _, err := mapping.New(s.res, nil); return err }, driver.ErrInvalid, "nil"},
		{"new table of a reservation not made by Reserve", func() error { _, err := mapping.New(&vaspace.Reservation{}, s.mem); return err },
			driver.ErrInvalid, "no driver"},
		{"new table of a memory not made by New", func() error { _, err := mapping.New(s.res, &physical.Memory{}); return err },
			driver.ErrInvalid, "no driver"},
		{"new table of a memory made with no driver", func() error { _, err := mapping.New(s.res, physical.New(nil)); return err },
			driver.ErrInvalid, "no driver"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.state(t)
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			require.Equal(t, before, s.state(t), "the refused call changed the state")
			got := make([]byte, 4)
			require.NoError(t, s.tab.Read(1, s.at(4), got))
			require.Equal(t, "keep", string(got), "the bytes survived")
		})
	}
	require.NoError(t, other.Free())
	require.NoError(t, foreign.Release())
}

// TestCallsAfterClose: every operation on a closed table, a freed
// reservation and closed physical memory is ErrClosed and changes nothing.
func TestCallsAfterClose(t *testing.T) {
	s := newStack(t)
	c, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.tab.Map(s.at(0), c))
	require.NoError(t, s.tab.Close())
	require.Zero(t, c.Mappings(), "Close unmapped")
	closed := []func() error{
		func() error { return s.tab.Map(s.at(0), c) },
		func() error { return s.tab.Unmap(s.at(0)) },
		func() error { return s.tab.UnmapRange(s.res.Range()) },
		func() error { return s.tab.SetAccess(s.at(0), gran, 0, driver.AccessRead) },
		func() error { _, err := s.tab.Lookup(s.at(0)); return err },
		func() error { return s.tab.Read(0, s.at(0), make([]byte, 1)) },
		func() error { return s.tab.Write(0, s.at(0), make([]byte, 1)) },
		s.tab.Close,
	}
	require.NoError(t, s.res.Free())
	closed = append(closed,
		s.res.Free,
		func() error { _, err := mapping.New(s.res, s.mem); return err },
		func() error { _, err := s.res.Carve(gran, 0); return err },
	)
	require.NoError(t, s.mem.Close())
	closed = append(closed,
		s.mem.Close,
		c.Release,
		func() error { _, err := s.mem.Create(0, gran, driver.ChunkOptions{}); return err },
	)
	for i, call := range closed {
		err := call()
		require.True(t, errors.Is(err, driver.ErrClosed), "call %d: %v", i, err)
	}
	u, err := s.mem.Usage(0)
	require.NoError(t, err)
	require.Zero(t, u.Used)
}

// TestAliasing (CUDA virtual aliasing: cuMemMap of one handle twice): one chunk mapped at two addresses of a
// reservation; bytes written through one are read through the other, and
// each mapping has its own access.
func TestAliasing(t *testing.T) {
	s := newStack(t)
	c, err := s.mem.Create(0, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.tab.Map(s.at(0), c))
	require.NoError(t, s.tab.Map(s.at(16), c))
	require.Equal(t, 2, c.Mappings())
	require.NoError(t, s.tab.SetAccess(s.at(0), 2*gran, 0, driver.AccessReadWrite))
	require.NoError(t, s.tab.SetAccess(s.at(16), 2*gran, 1, driver.AccessRead))
	msg := []byte("written through the first address")
	require.NoError(t, s.tab.Write(0, s.at(1), msg))
	got := make([]byte, len(msg))
	require.NoError(t, s.tab.Read(1, s.at(17), got))
	require.Equal(t, msg, got)
	require.True(t, errors.Is(s.tab.Read(1, s.at(1), got), driver.ErrAccessDenied), "device 1 was granted the alias only")
	e, err := s.tab.Lookup(s.at(17))
	require.NoError(t, err)
	require.Same(t, c, e.Chunk)
	require.Equal(t, gran, e.Offset)
	require.Equal(t, []driver.Access{driver.AccessNone, driver.AccessRead}, e.Access)
	// Release the handle: both mappings keep the memory alive.
	require.NoError(t, c.Release())
	require.NoError(t, s.tab.Unmap(s.at(0)))
	require.NoError(t, s.tab.Read(1, s.at(17), got))
	require.Equal(t, msg, got)
	u, _ := s.mem.Usage(0)
	require.Equal(t, 2*gran, u.Used)
	require.NoError(t, s.tab.Unmap(s.at(16)))
	u, _ = s.mem.Usage(0)
	require.Zero(t, u.Used)
}

// TestConcurrentDisjoint: goroutines map, grant, write, read back and
// unmap disjoint ranges of one table at once (run with -race).
func TestConcurrentDisjoint(t *testing.T) {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 * gran, Granularity: gran})
	require.NoError(t, err)
	defer drv.Close()
	res, err := vaspace.New(drv).Reserve(256*gran, 0)
	require.NoError(t, err)
	mem := physical.New(drv)
	tab, err := mapping.New(res, mem)
	require.NoError(t, err)
	const workers, rounds = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := driver.DeviceID(w % 2)
			for r := 0; r < rounds; r++ {
				if err := func() error {
					c, err := mem.Create(dev, 2*gran, driver.ChunkOptions{})
					if err != nil {
						return err
					}
					at := res.Base() + driver.Addr(uint64(w*32+(r%8)*4)*gran)
					if err := tab.Map(at, c); err != nil {
						return err
					}
					if err := tab.SetAccess(at, 2*gran, dev, driver.AccessReadWrite); err != nil {
						return err
					}
					msg := []byte(fmt.Sprintf("worker %d round %d", w, r))
					if err := tab.Write(dev, at+driver.Addr(gran), msg); err != nil {
						return err
					}
					got := make([]byte, len(msg))
					if err := tab.Read(dev, at+driver.Addr(gran), got); err != nil {
						return err
					}
					if !bytes.Equal(msg, got) {
						return errors.Newf("read %q, wrote %q", got, msg)
					}
					if r%2 == 0 {
						if err := c.Release(); err != nil {
							return err
						}
						return tab.Unmap(at)
					}
					if err := tab.Unmap(at); err != nil {
						return err
					}
					return c.Release()
				}(); err != nil {
					errs <- errors.Wrapf(err, "worker %d round %d", w, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, tab.Check())
	require.NoError(t, mem.Check())
	require.NoError(t, drv.Check())
	for d := driver.DeviceID(0); d < 2; d++ {
		u, err := mem.Usage(d)
		require.NoError(t, err)
		require.Zero(t, u.Used)
		require.LessOrEqual(t, u.Peak, 8*gran, "four workers a device, one 2-granule chunk each at a time")
		require.GreaterOrEqual(t, u.Peak, 2*gran)
	}
}

// TestNoLeaks: after the whole stack is used and closed, file descriptors,
// kernel mappings and resident shared memory are back where they started.
func TestNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 2, Capacity: 32 * gran, Granularity: gran})
		require.NoError(t, err)
		space := vaspace.New(drv)
		mem := physical.New(drv)
		var tabs []*mapping.Table
		for r := 0; r < 3; r++ {
			res, err := space.Reserve(64*gran, 0)
			require.NoError(t, err)
			tab, err := mapping.New(res, mem)
			require.NoError(t, err)
			tabs = append(tabs, tab)
			for i := 0; i < 6; i++ {
				c, err := mem.Create(driver.DeviceID(i%2), 2*gran, driver.ChunkOptions{Shareable: i == 0})
				require.NoError(t, err)
				at := res.Base() + driver.Addr(uint64(5*i)*gran)
				require.NoError(t, tab.Map(at, c))
				require.NoError(t, tab.SetAccess(at, 2*gran, 0, driver.AccessReadWrite))
				require.NoError(t, tab.Write(0, at, []byte{1}))
				if i%2 == 0 {
					require.NoError(t, c.Release()) // released while mapped
				}
			}
		}
		// Leave it all live: closing in order must return everything.
		for _, tab := range tabs {
			require.NoError(t, tab.Close())
		}
		require.NoError(t, mem.Close())
		require.NoError(t, space.Close())
		for d := driver.DeviceID(0); d < 2; d++ {
			hb, err := drv.HeapBytes(d)
			require.NoError(t, err)
			require.Zero(t, hb, "device %d heap returned to the kernel before Close", d)
		}
		require.NoError(t, drv.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "%v before, %v after", before, after)
	require.Zero(t, after.VmarenaMaps)
}

// manyDevices is a host driver that claims more devices than the
// contract allows (a driver of someone else's, broken).
type manyDevices struct{ *host.Driver }

func (m manyDevices) Devices() []driver.Device {
	devs := make([]driver.Device, driver.MaxDevices+1)
	for i := range devs {
		devs[i] = m.Driver.Devices()[0]
		devs[i].ID = driver.DeviceID(i)
	}
	return devs
}

// TestTooManyDevicesRefused: a table records each device's access in a
// fixed row of driver.MaxDevices; a driver reporting more is refused with
// ErrInvalid, and the reservation stays free of any table.
func TestTooManyDevicesRefused(t *testing.T) {
	s := newStack(t)
	d := manyDevices{s.drv}
	space := vaspace.New(d)
	res, err := space.Reserve(4*gran, 0)
	require.NoError(t, err)
	_, err = mapping.New(res, physical.New(d))
	drivertest.RequireIs(t, err, driver.ErrInvalid, "33 devices", "1 to 32")
	require.NoError(t, res.Free(), "no table was attached")
}

// TestMapGrantUnmapAllocations: a map, a grant over the whole mapping and
// an unmap allocate the two records they keep (the table's entry and the
// driver ledger's) and nothing else: the access runs of a fresh mapping
// live inline, and the driver call reaches physical as a pointer, not a
// closure. Skipped where the invariants tag runs the checks, which
// allocate.
func TestMapGrantUnmapAllocations(t *testing.T) {
	if invariants.Enabled {
		t.Skip("the invariant checks allocate")
	}
	s := newStack(t)
	c, err := s.mem.Create(0, 4*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Release()) }()
	n := testing.AllocsPerRun(50, func() {
		require.NoError(t, s.tab.Map(s.at(0), c))
		require.NoError(t, s.tab.SetAccess(s.at(0), 4*gran, 1, driver.AccessReadWrite))
		require.NoError(t, s.tab.Unmap(s.at(0)))
	})
	require.LessOrEqual(t, n, 2.0, "allocations a map, grant and unmap")
}
