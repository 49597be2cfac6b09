package arena

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

type poolEnv struct {
	*env
	p    *Pool
	a, b *stream.Stream
}

// newPoolEnv is a pool on device 0 of a small host driver and two streams
// of device 0. policies sets follow, opportunistic, internal.
func newPoolEnv(t *testing.T, props PoolProps, follow, opportunistic, internal bool) *poolEnv {
	t.Helper()
	e := newEnv(t, 64*g)
	if props.ChunkSize == 0 {
		props.ChunkSize = g
	}
	p, err := NewPool(e.space, e.mem, props)
	require.NoError(t, err)
	set := func(a PoolAttr, on bool) {
		v := uint64(0)
		if on {
			v = 1
		}
		require.NoError(t, p.SetAttribute(a, v))
	}
	set(ReuseFollowEventDependencies, follow)
	set(ReuseAllowOpportunistic, opportunistic)
	set(ReuseAllowInternalDependencies, internal)
	a, err := stream.New(e.drv, 0)
	require.NoError(t, err)
	b, err := stream.New(e.drv, 0)
	require.NoError(t, err)
	pe := &poolEnv{env: e, p: p, a: a, b: b}
	t.Cleanup(func() {
		_ = a.Destroy()
		_ = b.Destroy()
		require.NoError(t, p.Check())
	})
	return pe
}

// blockStream enqueues on s a host function that waits until the returned
// function is called (or a second passes, so a bug cannot hang the test).
func blockStream(t *testing.T, s *stream.Stream) (release func()) {
	ch := make(chan struct{})
	require.NoError(t, s.Launch("blocked", func() error {
		select {
		case <-ch:
		case <-time.After(time.Second):
		}
		return nil
	}))
	return func() { close(ch) }
}

func TestPoolSameStreamReuse(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, false, false, false)
	release := blockStream(t, pe.a) // the free is not even completed
	p1, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	p2, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.Equal(t, p1, p2, "memory freed on A is reused by a later allocation on A at once")
	release()
	require.NoError(t, pe.p.FreeAsync(p2, pe.a))
	require.NoError(t, pe.a.Synchronize())
}

func TestPoolReuseFollowsEventDependencies(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, false, false)
	release := blockStream(t, pe.a)
	p1, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	p2, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.NotEqual(t, p1, p2, "B has no dependency on the free yet")
	ev, err := stream.NewEvent(pe.drv, 0)
	require.NoError(t, err)
	require.NoError(t, pe.a.Record(ev)) // after the free
	require.NoError(t, pe.b.Wait(ev))
	p3, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.Equal(t, p1, p3, "after B waits on an event recorded after the free, B reuses it")
	release()
	require.NoError(t, pe.p.FreeAsync(p2, pe.b))
	require.NoError(t, pe.p.FreeAsync(p3, pe.b))
	require.NoError(t, pe.b.Synchronize())
	require.NoError(t, ev.Destroy())
}

func TestPoolOpportunisticReuse(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, false, true, false)
	// Keep freed memory pooled at the synchronize, so what B gets is the
	// pool's reuse and not the allocator's.
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 1<<40))
	release := blockStream(t, pe.a)
	p1, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	p2, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.NotEqual(t, p1, p2, "the free has not completed")
	release()
	require.NoError(t, pe.a.Synchronize())
	p3, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.Equal(t, p1, p3, "once the free has completed, B may reuse it")
	require.NoError(t, pe.p.FreeAsync(p2, pe.b))
	require.NoError(t, pe.p.FreeAsync(p3, pe.b))
}

func TestPoolInternalDependencies(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, false, false, true)
	release := blockStream(t, pe.a)
	p1, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	p2, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.Equal(t, p1, p2, "the pool reuses the block and makes B wait for the free")
	ran := make(chan struct{})
	require.NoError(t, pe.b.Launch("after", func() error { close(ran); return nil }))
	select {
	case <-ran:
		t.Fatal("work on B ran before the free on A completed")
	case <-time.After(30 * time.Millisecond):
	}
	release()
	<-ran
	require.NoError(t, pe.p.FreeAsync(p2, pe.b))
	require.NoError(t, pe.b.Synchronize())
}

func TestPoolPoliciesOffNeverAcrossStreams(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, false, false, false)
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 1<<40)) // keep the memory pooled
	p1, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	require.NoError(t, pe.a.Synchronize())
	ev, err := stream.NewEvent(pe.drv, 0)
	require.NoError(t, err)
	require.NoError(t, pe.a.Record(ev))
	require.NoError(t, pe.b.Wait(ev))
	p2, err := pe.p.MallocAsync(1000, pe.b)
	require.NoError(t, err)
	require.NotEqual(t, p1, p2, "with every policy off, never across streams — even completed and ordered")
	require.NoError(t, pe.p.FreeAsync(p2, pe.b))
	require.NoError(t, ev.Destroy())
}

func TestPoolReleaseThreshold(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, true, true)
	reserved := func() uint64 { v, err := pe.p.Attribute(ReservedMemCurrent); require.NoError(t, err); return v }
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 4*g))
	p1, err := pe.p.MallocAsync(10*g, pe.a)
	require.NoError(t, err)
	require.GreaterOrEqual(t, reserved(), 10*g)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	require.GreaterOrEqual(t, reserved(), 10*g, "nothing goes back before a synchronize")
	require.NoError(t, pe.a.Synchronize())
	require.LessOrEqual(t, reserved(), 4*g, "above the threshold, memory went back at the synchronize")
	require.Equal(t, reserved(), pe.used(t, 0), "the device has it back")

	// Under the threshold, freed memory stays pooled through a synchronize.
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 64*g))
	p2, err := pe.p.MallocAsync(10*g, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p2, pe.a))
	require.NoError(t, pe.a.Synchronize())
	require.GreaterOrEqual(t, reserved(), 10*g)
	high, err := pe.p.Attribute(ReservedMemHigh)
	require.NoError(t, err)
	require.GreaterOrEqual(t, high, 10*g)
}

func TestPoolAttributes(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, true, true)
	for _, a := range []PoolAttr{ReuseFollowEventDependencies, ReuseAllowOpportunistic, ReuseAllowInternalDependencies} {
		v, err := pe.p.Attribute(a)
		require.NoError(t, err)
		require.Equal(t, uint64(1), v, "%s defaults on", a)
		require.NoError(t, pe.p.SetAttribute(a, 0))
		v, _ = pe.p.Attribute(a)
		require.Zero(t, v)
		drivertest.RequireIs(t, pe.p.SetAttribute(a, 2), driver.ErrInvalid, "0 or 1")
	}
	p1, err := pe.p.MallocAsync(3000, pe.a)
	require.NoError(t, err)
	used, _ := pe.p.Attribute(UsedMemCurrent)
	require.Equal(t, uint64(3000), used)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	used, _ = pe.p.Attribute(UsedMemCurrent)
	require.Zero(t, used)
	high, _ := pe.p.Attribute(UsedMemHigh)
	require.Equal(t, uint64(3000), high)
	drivertest.RequireIs(t, pe.p.SetAttribute(UsedMemHigh, 5), driver.ErrInvalid, "can only be reset")
	require.NoError(t, pe.p.SetAttribute(UsedMemHigh, 0))
	high, _ = pe.p.Attribute(UsedMemHigh)
	require.Zero(t, high, "reset to the current value")
	drivertest.RequireIs(t, pe.p.SetAttribute(UsedMemCurrent, 0), driver.ErrInvalid, "read-only")
	drivertest.RequireIs(t, pe.p.SetAttribute(ReservedMemCurrent, 0), driver.ErrInvalid, "read-only")
	drivertest.RequireIs(t, pe.p.SetAttribute(99, 0), driver.ErrInvalid, "unknown")
	_, err = pe.p.Attribute(0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "unknown")
	require.NoError(t, pe.a.Synchronize())
}

func TestPoolTrimToKeepsOutstanding(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, true, true)
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 1<<40))
	live, err := pe.p.MallocAsync(2*g, pe.a)
	require.NoError(t, err)
	release := blockStream(t, pe.a)
	inFlight, err := pe.p.MallocAsync(6*g, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(inFlight, pe.a)) // not completed: A is blocked
	require.NoError(t, pe.p.TrimTo(0))
	st := pe.p.Allocator().Stats()
	require.GreaterOrEqual(t, st.Committed, 8*g, "neither the live allocation nor the free in flight gave memory back")
	release()
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, pe.p.TrimTo(3*g))
	st = pe.p.Allocator().Stats()
	require.GreaterOrEqual(t, st.Committed, 2*g, "the live allocation keeps its memory")
	require.Less(t, st.Committed, 8*g, "the completed free went back")
	require.NoError(t, pe.p.FreeAsync(live, pe.a))
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, pe.p.TrimTo(0))
	require.Zero(t, pe.p.Allocator().Stats().Committed)
}

// TestPoolPoisonCatchesUseAfterFree: with poisoning (what the invariants
// build turns on everywhere), work that reads freed memory later in stream
// order sees PoisonByte, not the old data.
func TestPoolPoisonCatchesUseAfterFree(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{Poison: true}, true, true, true)
	p1, err := pe.p.MallocAsync(256, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.a.CopyHtoD(p1, bytes.Repeat([]byte{7}, 256)))
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	stale := make([]byte, 256)
	require.NoError(t, pe.a.CopyDtoH(stale, p1)) // a use after free, in stream order
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, bytes.Repeat([]byte{PoisonByte}, 256), stale)
}

func TestPoolAccess(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{}, true, true, true)
	p1, err := pe.p.MallocAsync(g, pe.a)
	require.NoError(t, err)
	s1, err := stream.New(pe.drv, 1)
	require.NoError(t, err)
	defer s1.Destroy()
	require.NoError(t, pe.drv.EnablePeerAccess(1, 0))
	buf := make([]byte, 8)
	require.NoError(t, s1.CopyDtoH(buf, p1))
	drivertest.RequireIs(t, s1.Synchronize(), driver.ErrAccessDenied, "device 1 has none access")
	require.Equal(t, driver.AccessNone, pe.p.Access(1))
	require.NoError(t, pe.p.SetAccess(1, driver.AccessRead))
	require.Equal(t, driver.AccessRead, pe.p.Access(1))
	require.NoError(t, s1.CopyDtoH(buf, p1))
	require.NoError(t, s1.Synchronize(), "granted")
	p2, err := pe.p.MallocAsync(20*g, pe.a) // memory reserved later gets the access too
	require.NoError(t, err)
	require.NoError(t, s1.CopyDtoH(buf, p2+driver.Addr(19*g)))
	require.NoError(t, s1.Synchronize())
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	require.NoError(t, pe.p.FreeAsync(p2, pe.a))
	require.NoError(t, pe.a.Synchronize())
}

func TestDefaultPool(t *testing.T) {
	e := newEnv(t, 64*g)
	s, err := stream.New(e.drv, 1)
	require.NoError(t, err)
	p1, err := MallocAsync(5000, s)
	require.NoError(t, err)
	dp, err := DefaultPool(e.drv, 1)
	require.NoError(t, err)
	require.True(t, dp.Owns(p1))
	again, err := DefaultPool(e.drv, 1)
	require.NoError(t, err)
	require.Same(t, dp, again)
	drivertest.RequireIs(t, dp.Destroy(), driver.ErrInvalid, "default pool")
	drivertest.RequireIs(t, CloseDefaultPools(e.drv), driver.ErrBusy, "1 live allocation")
	require.NoError(t, FreeAsync(p1, s))
	drivertest.RequireIs(t, FreeAsync(p1, s), driver.ErrNotAllocated)
	require.NoError(t, s.Destroy())
	require.NoError(t, CloseDefaultPools(e.drv))
	require.Zero(t, e.used(t, 1))
}

func TestPoolBadInput(t *testing.T) {
	pe := newPoolEnv(t, PoolProps{MaxSize: 8 * g}, true, true, true)
	p1, err := pe.p.MallocAsync(100, pe.a)
	require.NoError(t, err)
	other := newEnv(t, 16*g)
	foreign, err := stream.New(other.drv, 0)
	require.NoError(t, err)
	defer foreign.Destroy()
	state := func() (uint64, int) {
		require.NoError(t, pe.p.Check())
		u, _ := pe.p.Attribute(UsedMemCurrent)
		return u, pe.p.Allocator().Stats().Live
	}
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"zero size", func() error { _, err := pe.p.MallocAsync(0, pe.a); return err }, driver.ErrInvalid, "zero"},
		{"past the pool's maximum", func() error { _, err := pe.p.MallocAsync(9*g, pe.a); return err }, driver.ErrOutOfMemory, ""},
		{"stream of another driver", func() error { _, err := pe.p.MallocAsync(10, foreign); return err }, driver.ErrInvalid, "another driver"},
		{"free of a foreign pointer", func() error { return pe.p.FreeAsync(p1+256, pe.a) }, driver.ErrNotAllocated, "not the start"},
		{"destroy with live allocations", pe.p.Destroy, driver.ErrBusy, "1 live allocation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u0, l0 := state()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			u1, l1 := state()
			require.Equal(t, u0, u1)
			require.Equal(t, l0, l1)
		})
	}
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	drivertest.RequireIs(t, pe.p.FreeAsync(p1, pe.a), driver.ErrNotAllocated, "freed twice")
	require.NoError(t, pe.p.Destroy())
	_, err = pe.p.MallocAsync(1, pe.a)
	drivertest.RequireIs(t, err, driver.ErrClosed, "destroyed pool")
	drivertest.RequireIs(t, pe.p.Destroy(), driver.ErrClosed)
	require.Zero(t, pe.used(t, 0))
}

// TestPoolAccessUnreachable: on a machine whose devices cannot reach each
// other, granting another device access to a pool is refused, and nothing
// changes.
func TestPoolAccessUnreachable(t *testing.T) {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 16 * g, Granularity: g, NoPeerAccess: true})
	require.NoError(t, err)
	defer drv.Close()
	p, err := NewPool(vaspace.New(drv), physical.New(drv), PoolProps{ChunkSize: g})
	require.NoError(t, err)
	s, err := stream.New(drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	ptr, err := p.MallocAsync(g, s)
	require.NoError(t, err)
	drivertest.RequireIs(t, p.SetAccess(1, driver.AccessRead), driver.ErrUnsupported, "device 1 cannot access device 0")
	require.Equal(t, driver.AccessNone, p.Access(1))
	require.Equal(t, driver.AccessReadWrite, p.Access(0))
	drivertest.RequireIs(t, p.SetAccess(5, driver.AccessRead), driver.ErrNoDevice)
	require.NoError(t, p.SetAccess(1, driver.AccessNone), "revoking needs no reachability")
	require.NoError(t, p.Check())
	require.NoError(t, p.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, p.Destroy())
}
