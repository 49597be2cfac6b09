package stream_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
)

func newHost(t *testing.T) *host.Driver {
	t.Helper()
	d, err := host.New(host.Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func newStreams(t *testing.T, d driver.Driver, n int) []*stream.Stream {
	t.Helper()
	var ss []*stream.Stream
	for i := 0; i < n; i++ {
		s, err := stream.New(d, 0)
		require.NoError(t, err)
		ss = append(ss, s)
		t.Cleanup(func() { _ = s.Destroy() })
	}
	return ss
}

// TestOrderedAfter: the vector clocks learn order from waits on events,
// also through a third stream, and never from anything else.
func TestOrderedAfter(t *testing.T) {
	d := newHost(t)
	ss := newStreams(t, d, 3)
	a, b, c := ss[0], ss[1], ss[2]
	ev1, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	ev2, err := stream.NewEvent(d, 0)
	require.NoError(t, err)

	require.NoError(t, a.Launch("work", func() error { return nil }))
	require.Equal(t, uint64(1), a.Position())
	require.True(t, a.OrderedAfter(a, 1), "a stream is ordered after itself")
	require.False(t, b.OrderedAfter(a, 1))

	require.NoError(t, a.Record(ev1)) // position 2
	require.NoError(t, b.Wait(ev1))
	require.True(t, b.OrderedAfter(a, 1))
	require.True(t, b.OrderedAfter(a, 2), "the record itself is covered")
	require.NoError(t, a.Launch("later", func() error { return nil }))
	require.False(t, b.OrderedAfter(a, 3), "work on a after the record is not")

	require.NoError(t, b.Record(ev2))
	require.NoError(t, c.Wait(ev2))
	require.True(t, c.OrderedAfter(a, 2), "c learned a's order through b")
	require.True(t, c.OrderedAfter(b, b.Position()))
	require.False(t, c.OrderedAfter(a, 3))

	require.NoError(t, a.Synchronize())
	require.False(t, c.OrderedAfter(a, 3), "a host synchronize is not a stream dependency")
	require.NoError(t, ev1.Destroy())
	require.NoError(t, ev2.Destroy())
}

func TestSynchronizeHooks(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	var n atomic.Int32
	cancel := stream.OnSynchronize(d, func() { n.Add(1) })
	require.NoError(t, s.Synchronize())
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Record(ev))
	require.NoError(t, ev.Synchronize())
	require.Equal(t, int32(2), n.Load(), "stream and event synchronizes run the hooks")
	require.NoError(t, ev.WaitDone())
	require.Equal(t, int32(2), n.Load(), "WaitDone does not")
	cancel()
	require.NoError(t, s.Synchronize())
	require.Equal(t, int32(2), n.Load(), "cancelled")
	require.NoError(t, ev.Destroy())
}

func TestCopiesAndHostBuffers(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	g := d.Granularity()
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, 2*g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, 2*g, 0, driver.AccessReadWrite))

	hb, err := stream.NewHostBuffer(d, 4096)
	require.NoError(t, err)
	buf := hb.Bytes()
	require.Len(t, buf, 4096)
	copy(buf, "pinned")
	require.NoError(t, s.CopyHtoD(base, buf[:6]))
	require.NoError(t, s.CopyDtoD(base+driver.Addr(g), base, 6))
	require.NoError(t, s.Memset(base, 'x', 3))
	out := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(out, base+driver.Addr(g)))
	back := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(back, base))
	hh := make([]byte, 6)
	require.NoError(t, s.CopyHtoH(hh, back))
	start, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	end, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Record(start))
	require.NoError(t, s.Launch("sleep", func() error { time.Sleep(5 * time.Millisecond); return nil }))
	require.NoError(t, s.Record(end))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "pinned", string(out))
	require.Equal(t, "xxxned", string(back))
	require.Equal(t, "xxxned", string(hh))
	el, err := stream.Elapsed(start, end)
	require.NoError(t, err)
	require.GreaterOrEqual(t, el, 5*time.Millisecond)

	drivertest.RequireIs(t, s.CopyHtoH(make([]byte, 2), make([]byte, 3)), driver.ErrInvalid)

	// The synchronous forms return with the bytes moved.
	require.NoError(t, s.CopyHtoDSync(base, []byte("sync")))
	require.NoError(t, s.MemsetSync(base+4, '!', 1))
	require.NoError(t, s.CopyDtoDSync(base+driver.Addr(g), base, 5))
	got := make([]byte, 5)
	require.NoError(t, s.CopyDtoHSync(got, base+driver.Addr(g)))
	require.Equal(t, "sync!", string(got))
	hh2 := make([]byte, 5)
	require.NoError(t, s.CopyHtoHSync(hh2, got))
	require.Equal(t, "sync!", string(hh2))
	require.NoError(t, s.CopyDtoD(base, base+driver.Addr(4*g), 1)) // outside the reservation: fails when it runs
	drivertest.RequireIs(t, s.CopyDtoHSync(got, base), driver.ErrNotReserved, "operation")
	require.NoError(t, hb.Free())
	drivertest.RequireIs(t, hb.Free(), driver.ErrClosed)
	require.Nil(t, hb.Bytes())
	for _, e := range []*stream.Event{start, end} {
		require.NoError(t, e.Destroy())
	}
}

// TestErrorsSurfaceAtSynchronize: a failing host function is reported by
// the next synchronize, naming it; the stream then works again.
func TestErrorsSurfaceAtSynchronize(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	require.NoError(t, s.Launch("kernel A", func() error { return driver.ErrInvalid }))
	ran := false
	require.NoError(t, s.Launch("kernel B", func() error { ran = true; return nil }))
	err := s.Synchronize()
	drivertest.RequireIs(t, err, driver.ErrInvalid, "kernel A", "1 later operation(s) skipped")
	require.False(t, ran)
	require.NoError(t, s.Launch("kernel C", func() error { ran = true; return nil }))
	require.NoError(t, s.Synchronize())
	require.True(t, ran)
}

func TestBadInput(t *testing.T) {
	d := newHost(t)
	other := newHost(t)
	s := newStreams(t, d, 1)[0]
	foreign, err := stream.NewEvent(other, 0)
	require.NoError(t, err)
	_, err = stream.New(d, 5)
	drivertest.RequireIs(t, err, driver.ErrNoDevice)
	drivertest.RequireIs(t, s.Record(foreign), driver.ErrInvalid, "another driver")
	drivertest.RequireIs(t, s.Wait(foreign), driver.ErrInvalid, "another driver")
	ev, err := stream.NewEvent(d, 1)
	require.NoError(t, err)
	drivertest.RequireIs(t, s.Record(ev), driver.ErrInvalid, "device 1")
	require.Zero(t, s.Position(), "refused calls enqueue nothing")
	require.NoError(t, ev.Destroy())
	drivertest.RequireIs(t, s.Record(ev), driver.ErrClosed)
	drivertest.RequireIs(t, ev.Destroy(), driver.ErrClosed)

	sd, err := sim.New(sim.Options{})
	require.NoError(t, err)
	defer sd.Close()
	ss, err := stream.New(sd, 0)
	require.NoError(t, err)
	drivertest.RequireIs(t, ss.CopyHtoD(1<<40, []byte{1}), driver.ErrUnsupported)
	require.Zero(t, ss.Position())
	require.NoError(t, ss.Destroy())
	drivertest.RequireIs(t, ss.Destroy(), driver.ErrClosed)
	drivertest.RequireIs(t, ss.Launch("x", func() error { return nil }), driver.ErrClosed)
	drivertest.RequireIs(t, ss.Synchronize(), driver.ErrClosed)
	require.NoError(t, foreign.Destroy())
}
