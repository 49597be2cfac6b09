package pool

import (
	"bytes"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/units"
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
func newPoolEnv(t *testing.T, props Props, follow, opportunistic, internal bool) *poolEnv {
	t.Helper()
	return backend{testdrivers.Host()}.poolEnv(t, props, follow, opportunistic, internal)
}

// poolEnv is newPoolEnv on d.
func (d backend) poolEnv(t *testing.T, props Props, follow, opportunistic, internal bool) *poolEnv {
	t.Helper()
	e := d.env(t, 64*g)
	if props.ChunkSize == 0 {
		props.ChunkSize = g
	}
	p, err := New(e.space, e.mem, props)
	require.NoError(t, err)
	set := func(a Attr, on bool) {
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
	})
	destroyAtEnd(t, p, a)
	t.Cleanup(func() { require.NoError(t, p.Check()) })
	return pe
}

// blockStream enqueues on s a host function that waits until the returned
// function is called, or the test ends (its cleanup calls it too, before
// the stream's: a failed test does not leave the stream blocked).
func blockStream(t *testing.T, s *stream.Stream) (release func()) {
	ch := make(chan struct{})
	release = sync.OnceFunc(func() { close(ch) })
	t.Cleanup(release)
	require.NoError(t, s.Launch("blocked", func() error { <-ch; return nil }))
	return release
}

func TestPoolSameStreamReuse(t *testing.T) { onEveryDriver(t, poolSameStreamReuse) }

func poolSameStreamReuse(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, false, false, false)
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
	onEveryDriver(t, poolReuseFollowsEventDependencies)
}

func poolReuseFollowsEventDependencies(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, false, false)
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

func TestPoolOpportunisticReuse(t *testing.T) { onEveryDriver(t, poolOpportunisticReuse) }

func poolOpportunisticReuse(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, false, true, false)
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

func TestPoolInternalDependencies(t *testing.T) { onEveryDriver(t, poolInternalDependencies) }

func poolInternalDependencies(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, false, false, true)
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
	onEveryDriver(t, poolPoliciesOffNeverAcrossStreams)
}

func poolPoliciesOffNeverAcrossStreams(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, false, false, false)
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

func TestPoolReleaseThreshold(t *testing.T) { onEveryDriver(t, poolReleaseThreshold) }

func poolReleaseThreshold(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, true, true)
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

// TestPoolReleasesFromTheMiddle: memory freed between live allocations goes
// back at the synchronize too — the old allocator could give back only its
// free tail, so a pool kept it.
func TestPoolReleasesFromTheMiddle(t *testing.T) { onEveryDriver(t, poolReleasesFromTheMiddle) }

func poolReleasesFromTheMiddle(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, true, true)
	reserved := func() uint64 { v, err := pe.p.Attribute(ReservedMemCurrent); require.NoError(t, err); return v }
	var ps []driver.Addr
	for range 3 {
		p, err := pe.p.MallocAsync(4*g, pe.a)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	require.GreaterOrEqual(t, reserved(), 12*g)
	require.NoError(t, pe.p.FreeAsync(ps[1], pe.a))
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, 8*g, reserved(), "the middle allocation's chunks went back (and any spare): the live memory stays")
	require.Equal(t, reserved(), pe.used(t, 0))
	for _, p := range []driver.Addr{ps[0], ps[2]} {
		require.NoError(t, pe.p.FreeAsync(p, pe.a))
	}
	require.NoError(t, pe.a.Synchronize())
	require.Zero(t, reserved())
	require.NoError(t, pe.p.Check())
}

func TestPoolAttributes(t *testing.T) { onEveryDriver(t, poolAttributes) }

func poolAttributes(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, true, true)
	for _, a := range []Attr{ReuseFollowEventDependencies, ReuseAllowOpportunistic, ReuseAllowInternalDependencies} {
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

func TestPoolTrimToKeepsOutstanding(t *testing.T) { onEveryDriver(t, poolTrimToKeepsOutstanding) }

func poolTrimToKeepsOutstanding(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, true, true)
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 1<<40))
	live, err := pe.p.MallocAsync(2*g, pe.a)
	require.NoError(t, err)
	release := blockStream(t, pe.a)
	inFlight, err := pe.p.MallocAsync(6*g, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(inFlight, pe.a)) // not completed: A is blocked
	require.NoError(t, pe.p.TrimTo(0))
	require.GreaterOrEqual(t, reserved(t, pe.p), 8*g, "neither the live allocation nor the free in flight gave memory back")
	release()
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, pe.p.TrimTo(3*g))
	require.GreaterOrEqual(t, reserved(t, pe.p), 2*g, "the live allocation keeps its memory")
	require.Less(t, reserved(t, pe.p), 8*g, "the completed free went back")
	require.NoError(t, pe.p.FreeAsync(live, pe.a))
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, pe.p.TrimTo(0))
	require.Zero(t, reserved(t, pe.p))
}

// TestPoolPoisonCatchesUseAfterFree: with poisoning (what the invariants
// build turns on everywhere), work that reads freed memory later in stream
// order sees PoisonByte, not the old data.
func TestPoolPoisonCatchesUseAfterFree(t *testing.T) { onEveryDriver(t, poolPoisonCatchesUseAfterFree) }

func poolPoisonCatchesUseAfterFree(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{Poison: true}, true, true, true)
	p1, err := pe.p.MallocAsync(256, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.a.CopyHtoD(p1, bytes.Repeat([]byte{7}, 256)))
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	stale := make([]byte, 256)
	require.NoError(t, pe.a.CopyDtoH(stale, p1)) // a use after free, in stream order
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, bytes.Repeat([]byte{PoisonByte}, 256), stale)
}

func TestPoolAccess(t *testing.T) { onEveryDriver(t, poolAccess) }

func poolAccess(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{}, true, true, true)
	p1, err := pe.p.MallocAsync(g, pe.a)
	require.NoError(t, err)
	s1, err := stream.New(pe.drv, 1)
	require.NoError(t, err)
	defer s1.Destroy()
	require.NoError(t, pe.drv.EnablePeerAccess(1, 0))
	buf := hostBuffer(t, pe.drv, 8)
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

func TestDefaultPool(t *testing.T) { onEveryDriver(t, defaultPool) }

func defaultPool(t *testing.T, d backend) {
	e := d.env(t, 64*g)
	s, err := stream.New(e.drv, 1)
	require.NoError(t, err)
	p1, err := MallocAsync(5000, s)
	require.NoError(t, err)
	dp, err := Default(e.drv, 1)
	require.NoError(t, err)
	require.True(t, dp.Owns(p1))
	again, err := Default(e.drv, 1)
	require.NoError(t, err)
	require.Same(t, dp, again)
	drivertest.RequireIs(t, dp.Destroy(), driver.ErrInvalid, "default pool")
	drivertest.RequireIs(t, CloseDefaults(e.drv), driver.ErrBusy, "1 live allocation")
	require.NoError(t, FreeAsync(p1, s))
	drivertest.RequireIs(t, FreeAsync(p1, s), driver.ErrNotAllocated)
	require.NoError(t, s.Destroy())
	require.NoError(t, CloseDefaults(e.drv))
	require.Zero(t, e.used(t, 1))
}

func TestPoolBadInput(t *testing.T) { onEveryDriver(t, poolBadInput) }

func poolBadInput(t *testing.T, d backend) {
	pe := d.poolEnv(t, Props{MaxSize: 8 * g}, true, true, true)
	p1, err := pe.p.MallocAsync(100, pe.a)
	require.NoError(t, err)
	dev1, err := stream.New(pe.drv, 1)
	require.NoError(t, err)
	defer dev1.Destroy()
	other := newEnv(t, 16*g)
	foreign, err := stream.New(other.drv, 0)
	require.NoError(t, err)
	defer foreign.Destroy()
	state := func() (uint64, int) {
		require.NoError(t, pe.p.Check())
		u, _ := pe.p.Attribute(UsedMemCurrent)
		return u, allocations(pe.p)
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
		{"free on a stream of another device", func() error { return pe.p.FreeAsync(p1, dev1) }, driver.ErrInvalid, "device 0's, the stream device 1's"},
		{"free on a stream of another driver", func() error { return pe.p.FreeAsync(p1, foreign) }, driver.ErrInvalid, "another driver"},
		{"package-level free of an address no pool holds", func() error { return FreeAsync(driver.Addr(g), pe.a) }, driver.ErrNotAllocated, "no pool of this driver"},
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
	p, err := New(vaspace.New(drv), physical.New(drv), Props{ChunkSize: g})
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

// TestPoolHandsOutNoAllocator: the pool owns its allocator alone. No
// exported method returns (directly, or inside a struct, slice, map or
// pointer) anything of the packages that could grow, shrink, free into,
// close or carve its memory: the allocator and its arena, a page table, a
// reservation, a physical chunk.
func TestPoolHandsOutNoAllocator(t *testing.T) {
	forbidden := map[string]bool{
		"github.com/vmarena/vmarena/arena":    true,
		"github.com/vmarena/vmarena/mapping":  true,
		"github.com/vmarena/vmarena/vaspace":  true,
		"github.com/vmarena/vmarena/physical": true,
	}
	seen := map[reflect.Type]bool{}
	var walk func(where string, ty reflect.Type)
	walk = func(where string, ty reflect.Type) {
		if seen[ty] {
			return
		}
		seen[ty] = true
		require.False(t, forbidden[ty.PkgPath()], "%s hands out %s", where, ty)
		switch ty.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
			walk(where, ty.Elem())
		case reflect.Map:
			walk(where, ty.Key())
			walk(where, ty.Elem())
		case reflect.Struct:
			for i := range ty.NumField() {
				if ty.Field(i).IsExported() {
					walk(where+"."+ty.Field(i).Name, ty.Field(i).Type)
				}
			}
		case reflect.Func:
			for i := range ty.NumOut() {
				walk(where, ty.Out(i))
			}
		}
	}
	pt := reflect.TypeOf(&Pool{})
	require.Positive(t, pt.NumMethod())
	for i := range pt.NumMethod() {
		m := pt.Method(i)
		for j := range m.Type.NumOut() {
			walk("Pool."+m.Name, m.Type.Out(j))
		}
	}
	_, hasAllocator := pt.MethodByName("Allocator")
	require.False(t, hasAllocator)
}

// TestNewRefusesBadSizes: a chunk size larger than the maximum size, a
// maximum size that is not whole chunks, a chunk size off the device's
// granularity or beyond its capacity are refused at New, saying which,
// with nothing reserved, registered or committed. Accepted sizes are
// reported as used.
func TestNewRefusesBadSizes(t *testing.T) {
	e := newEnv(t, 64*g)
	ranges0, _ := registered(e.drv)
	for _, c := range []struct {
		name      string
		props     Props
		sentinel  error
		fragments []string
	}{
		{"chunk larger than the maximum", Props{ChunkSize: 8 * g, MaxSize: 4 * g}, driver.ErrInvalid,
			[]string{"chunk size 512 KiB exceeds the maximum size 256 KiB"}},
		{"maximum not whole chunks", Props{ChunkSize: 4 * g, MaxSize: 10 * g}, driver.ErrInvalid,
			[]string{"maximum size 640 KiB is not a multiple of the chunk size 256 KiB"}},
		{"maximum one byte over", Props{ChunkSize: g, MaxSize: 4*g + 1}, driver.ErrInvalid, []string{"not a multiple"}},
		{"default chunk larger than the maximum", Props{MaxSize: g}, driver.ErrInvalid, []string{"chunk size 2 MiB exceeds"}},
		{"chunk larger than the device", Props{ChunkSize: 128 * g}, driver.ErrInvalid, []string{"exceeds device 0's capacity"}},
		{"chunk off the granularity", Props{ChunkSize: g / 2, MaxSize: 4 * g}, driver.ErrMisaligned, []string{"chunk size", "granularity"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(e.space, e.mem, c.props)
			drivertest.RequireIs(t, err, c.sentinel, append([]string{"pool: new pool"}, c.fragments...)...)
			require.Empty(t, e.space.Reservations(), "nothing reserved")
			ranges, _ := registered(e.drv)
			require.Equal(t, ranges0, ranges, "nothing registered")
			require.Zero(t, e.used(t, 0))
		})
	}
	t.Run("hints at whole chunks", func(t *testing.T) {
		_, err := New(e.space, e.mem, Props{ChunkSize: 4 * g, MaxSize: 10 * g})
		require.Contains(t, errors.FlattenHints(err), fmt.Sprintf("use %d or %d bytes", 8*g, 12*g))
	})

	// Accepted: defaults filled in, a default maximum rounded down to
	// whole chunks.
	p, err := New(e.space, e.mem, Props{ChunkSize: 3 * g})
	require.NoError(t, err)
	require.Equal(t, 63*g, p.Props().MaxSize, "64 granules of capacity hold 21 chunks of 3")
	require.LessOrEqual(t, 63*g, p.Max())
	require.NoError(t, p.Destroy())
	p, err = New(e.space, e.mem, Props{MaxSize: 4 * units.MiB})
	require.NoError(t, err)
	require.Equal(t, 2*units.MiB, p.Props().ChunkSize, "the recommended granularity")
	require.NoError(t, p.Destroy())
}

// books is everything a refused call must leave as it was: the pool's
// figures and lists, the allocator's allocations, the device's committed
// memory, and the registry's pools.
type books struct {
	attrs                   [4]uint64 // reserved and used, current and high
	live, pending, idle     int
	allocations             int
	used0, used1            uint64
	ranges, defaults        int
	streamPos, deadPos      uint64
	ownsLive, ownsLiveOther bool
}

func (pe *poolEnv) books(t *testing.T, dead *stream.Stream, ptr driver.Addr) books {
	t.Helper()
	require.NoError(t, pe.p.Check())
	require.NoError(t, checkRegistry())
	var b books
	for i, a := range []Attr{ReservedMemCurrent, ReservedMemHigh, UsedMemCurrent, UsedMemHigh} {
		v, err := pe.p.Attribute(a)
		require.NoError(t, err)
		b.attrs[i] = v
	}
	pe.p.mu.Lock()
	b.live, b.pending, b.idle = len(pe.p.live), pe.p.pending.len(), len(pe.p.idle)
	pe.p.mu.Unlock()
	b.allocations = allocations(pe.p)
	b.used0, b.used1 = pe.used(t, 0), pe.used(t, 1)
	b.ranges, b.defaults = registered(pe.drv)
	b.streamPos, b.deadPos = pe.a.Position(), dead.Position()
	b.ownsLive = pe.p.Owns(ptr)
	return b
}

// TestDestroyedStreamRefused: every pool entry point that takes a stream
// refuses a destroyed one with ErrClosed, and a nil one (or a nil pool)
// with ErrInvalid, before anything else: no memory is handed out or taken
// back, no default pool is created, no event is recorded or taken, and the
// books are as they were.
func TestDestroyedStreamRefused(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	dead, err := stream.New(pe.drv, 0)
	require.NoError(t, err)
	require.NoError(t, dead.Destroy())
	// A live allocation, and a pending free that a malloc on any stream
	// could reuse (with an inserted dependency).
	ptr, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	freed, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(freed, pe.a))
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"Pool.MallocAsync", func() error { _, err := pe.p.MallocAsync(1000, dead); return err }, driver.ErrClosed, "destroyed"},
		{"MallocFromPoolAsync", func() error { _, err := MallocFromPoolAsync(pe.p, 1000, dead); return err }, driver.ErrClosed, "destroyed"},
		{"MallocAsync (default pool)", func() error { _, err := MallocAsync(1000, dead); return err }, driver.ErrClosed, "destroyed"},
		{"Pool.FreeAsync", func() error { return pe.p.FreeAsync(ptr, dead) }, driver.ErrClosed, "destroyed"},
		{"FreeAsync", func() error { return FreeAsync(ptr, dead) }, driver.ErrClosed, "destroyed"},
		{"FreeAsync of an address no pool holds", func() error { return FreeAsync(driver.Addr(g), dead) }, driver.ErrClosed, "destroyed"},
		{"Pool.MallocAsync on nil", func() error { _, err := pe.p.MallocAsync(1000, nil); return err }, driver.ErrInvalid, "no stream"},
		{"MallocFromPoolAsync on nil", func() error { _, err := MallocFromPoolAsync(pe.p, 1000, nil); return err }, driver.ErrInvalid, "no stream"},
		{"MallocFromPoolAsync from a nil pool", func() error { _, err := MallocFromPoolAsync(nil, 1000, pe.a); return err }, driver.ErrInvalid, "no pool"},
		{"MallocAsync on nil", func() error { _, err := MallocAsync(1000, nil); return err }, driver.ErrInvalid, "no stream"},
		{"Pool.FreeAsync on nil", func() error { return pe.p.FreeAsync(ptr, nil) }, driver.ErrInvalid, "no stream"},
		{"FreeAsync on nil", func() error { return FreeAsync(ptr, nil) }, driver.ErrInvalid, "no stream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := pe.books(t, dead, ptr)
			err := func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panicked: %v", r)
					}
				}()
				return c.call()
			}()
			drivertest.RequireIs(t, err, c.sentinel, c.mentions)
			require.Equal(t, before, pe.books(t, dead, ptr))
		})
	}
	require.True(t, pe.p.Owns(ptr))
	require.NoError(t, pe.p.FreeAsync(ptr, pe.a))
	require.NoError(t, pe.a.Synchronize())
	_, defaults := registered(pe.drv)
	require.Zero(t, defaults, "no default pool was created")
}

// TestDestroyWhileHostFuncSynchronizes: a pool destroyed while a free is
// in flight behind a host function that synchronizes another stream. The
// synchronize runs the hooks, which take the pool's lock; Destroy waits
// for the free without it, so both finish instead of waiting for each
// other.
func TestDestroyWhileHostFuncSynchronizes(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	ptr, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	gate := make(chan struct{})
	var syncErr error
	require.NoError(t, pe.a.Launch("synchronizes b", func() error {
		<-gate
		syncErr = pe.b.Synchronize()
		return nil
	}))
	require.NoError(t, pe.p.FreeAsync(ptr, pe.a))               // completes after the host function
	time.AfterFunc(20*time.Millisecond, func() { close(gate) }) // once Destroy waits
	watchdog := time.AfterFunc(5*time.Second, func() {
		buf := make([]byte, 1<<20)
		panic(fmt.Sprintf("Destroy did not return within 5s; goroutines:\n%s", buf[:runtime.Stack(buf, true)]))
	})
	require.NoError(t, pe.p.Destroy())
	watchdog.Stop()
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, syncErr)
	require.Zero(t, pe.used(t, 0), "every byte went back")
}
