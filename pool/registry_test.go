package pool

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// registered counts the ranges and default pools the registry holds for d.
func registered(d driver.Driver) (ranges, defaults int) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	n := 0
	if rs := reg.ranges[d]; rs != nil {
		n = rs.Len()
	}
	return n, len(reg.defaults[d])
}

// TestRegistryConcurrentDestroyAndFree runs, from many goroutines at once
// on several pools and both devices' default pools: pools being created,
// allocated from and destroyed (Destroy racing with the frees of their
// own allocations, so it is refused with ErrBusy until the last one); the
// package-level FreeAsync of those allocations from other goroutines and
// streams, and of addresses no pool holds; package-level MallocAsync and
// FreeAsync on the default pools; and synchronizes, whose hooks take every
// pool's lock. Every path that takes the registry's lock and a pool's runs
// against every other: with the lock order broken this deadlocks (and
// fails after the bounded wait) or -race reports it. Afterwards the
// registry holds nothing but the default pools, and every byte is back.
func TestRegistryConcurrentDestroyAndFree(t *testing.T) {
	e := newEnv(t, 1024*g)
	const (
		owners = 4  // goroutines creating, allocating from and destroying pools
		freers = 4  // goroutines freeing the owners' allocations
		rounds = 15 // pools each owner goes through
		blocks = 6  // allocations per pool
	)
	newStream := func(dev driver.DeviceID) *stream.Stream {
		s, err := stream.New(e.drv, dev)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Destroy() })
		return s
	}
	type toFreeBlock struct {
		ptr driver.Addr
		dev driver.DeviceID
	}
	toFree := make(chan toFreeBlock, owners*blocks)
	errs := make(chan error, 1024)
	report := func(err error) {
		if err != nil {
			select {
			case errs <- err:
			default:
			}
		}
	}
	var wg, ownersWG sync.WaitGroup

	for o := range owners {
		s := newStream(driver.DeviceID(o % 2))
		wg.Add(1)
		ownersWG.Add(1)
		go func() {
			defer wg.Done()
			defer ownersWG.Done()
			for range rounds {
				p, err := New(e.space, e.mem, Props{Device: s.Device(), ChunkSize: g, MaxSize: 64 * g})
				if err != nil {
					report(err)
					return
				}
				for i := range blocks {
					ptr, err := p.MallocAsync(100+uint64(i)*g/3, s)
					if err != nil {
						report(err)
						return
					}
					toFree <- toFreeBlock{ptr, s.Device()} // buffered for every live block: never blocks
				}
				// Destroy races with the freers: refused while any block is
				// live, then it succeeds.
				for {
					err := p.Destroy()
					if err == nil {
						break
					}
					// Busy until the freers have freed its blocks, which they
					// do: a retry that never ends is a bug, and go test's
					// -timeout shows every goroutine's stack.
					if !errors.Is(err, driver.ErrBusy) {
						report(errors.Wrap(err, "destroy"))
						return
					}
					time.Sleep(50 * time.Microsecond)
				}
				report(p.Check())
			}
		}()
	}
	for f := range freers {
		ss := []*stream.Stream{newStream(0), newStream(1)} // a block is freed on its device's stream
		rng := rand.New(rand.NewPCG(uint64(f), 7))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range toFree {
				s := ss[b.dev]
				report(FreeAsync(b.ptr, s))
				// An address no live pool holds, or inside a live block —
				// or inside a pool of the other device: once b is freed its
				// pool may be destroyed and its range reused by a new pool
				// of the other device, and a free there on this stream is
				// refused for the device.
				err := FreeAsync(b.ptr+driver.Addr(1+rng.IntN(64)), s)
				otherDevice := errors.Is(err, driver.ErrInvalid) && strings.Contains(err.Error(), "the pool's memory is device")
				if !errors.Is(err, driver.ErrNotAllocated) && !errors.Is(err, driver.ErrClosed) && !otherDevice {
					report(errors.Newf("free of a bad address: %v", err))
				}
				if rng.IntN(4) == 0 {
					report(s.Synchronize()) // the hooks take every pool's lock
				}
			}
		}()
	}
	// The default pools, through the package-level calls.
	for dflt := range 4 {
		s := newStream(driver.DeviceID(dflt % 2))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				ptr, err := MallocAsync(uint64(64+i*100), s)
				if err != nil {
					report(err)
					return
				}
				report(FreeAsync(ptr, s))
				if i%8 == 0 {
					report(s.Synchronize())
				}
			}
		}()
	}
	go func() { ownersWG.Wait(); close(toFree) }()
	wg.Wait() // a deadlock hangs here until go test's -timeout, with every goroutine's stack
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	require.NoError(t, checkRegistry())
	ranges, defaults := registered(e.drv)
	require.Equal(t, 2, defaults, "the two devices' default pools")
	require.Equal(t, 2*3, ranges, "only the default pools' ranges (small, large and stitch) are left")
	require.NoError(t, CloseDefaults(e.drv))
	ranges, defaults = registered(e.drv)
	require.Zero(t, ranges+defaults)
	require.NoError(t, checkRegistry())
	require.Zero(t, e.used(t, 0)+e.used(t, 1), "every byte went back")
}

// TestFreeAsyncFindsStitchedAllocations: an allocation the allocator
// served from its second (stitch) range is found by the package-level
// FreeAsync too: the registry holds every range of the pool.
func TestFreeAsyncFindsStitchedAllocations(t *testing.T) {
	pe := newPoolEnv(t, Props{MaxSize: 32 * g}, true, true, true)
	// Keep freed memory committed at synchronize, so there are free
	// chunks to stitch.
	require.NoError(t, pe.p.SetAttribute(ReleaseThreshold, 32*g))
	const step = 5 * g
	var xs []driver.Addr
	for range 4 {
		x, err := pe.p.MallocAsync(step, pe.a)
		require.NoError(t, err)
		xs = append(xs, x)
	}
	require.NoError(t, FreeAsync(xs[0], pe.a))
	require.NoError(t, FreeAsync(xs[2], pe.a))
	// The synchronize gives the completed frees back to the allocator:
	// the first and third chunks are wholly free, apart.
	require.NoError(t, pe.a.Synchronize())
	big, err := pe.p.MallocAsync(2*step, pe.a)
	require.NoError(t, err)
	main := vaspace.Range{Base: pe.p.Base(), Size: pe.p.Max()}
	require.False(t, main.Contains(big), "served from the stitch range, not the main one")
	require.Len(t, pe.p.ranges, 3, "small, large and stitch ranges")
	require.Same(t, pe.p, reg.owner(pe.drv, big))
	require.NoError(t, FreeAsync(big, pe.a))
	require.False(t, pe.p.Owns(big))
	require.NoError(t, FreeAsync(xs[1], pe.a))
	require.NoError(t, FreeAsync(xs[3], pe.a))
	require.NoError(t, pe.a.Synchronize())
	require.NoError(t, checkRegistry())
}

// TestFreeAsyncFindsPoolByDriver: two sim drivers have address spaces of
// their own, so their pools can hand out the same address; the package
// level FreeAsync frees it in the pool of the stream's driver only.
func TestFreeAsyncFindsPoolByDriver(t *testing.T) {
	var ps []*Pool
	var ss []*stream.Stream
	for range 2 {
		d, err := sim.New(sim.Options{Devices: 1, Capacity: units.GiB})
		require.NoError(t, err)
		drivertest.CloseAtEnd(t, d)
		p, err := New(vaspace.New(d), physical.New(d), Props{})
		require.NoError(t, err)
		s, err := stream.New(d, 0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Destroy() })
		ps, ss = append(ps, p), append(ss, s)
	}
	a0, err := ps[0].MallocAsync(4096, ss[0])
	require.NoError(t, err)
	a1, err := ps[1].MallocAsync(4096, ss[1])
	require.NoError(t, err)
	if a0 != a1 {
		t.Skipf("the two sim drivers gave different addresses (%s, %s): nothing to tell apart", a0, a1)
	}
	require.NoError(t, FreeAsync(a0, ss[0]))
	require.False(t, ps[0].Owns(a0))
	require.True(t, ps[1].Owns(a1), "the other driver's pool keeps its allocation at the same address")
	require.NoError(t, FreeAsync(a1, ss[1]))
	for i, p := range ps {
		require.NoError(t, ss[i].Synchronize())
		require.NoError(t, p.Destroy())
	}
	require.NoError(t, checkRegistry())
}

// sliceDriver is a host driver whose dynamic type is not comparable: a
// struct value holding a slice. Keying a map with it panics.
type sliceDriver struct {
	*host.Driver
	tags []string
}

// TestNonComparableDriver: a pool, default pool or CloseDefaults on a
// driver that cannot key a map is an error naming why, not a panic, and
// nothing is reserved or registered.
func TestNonComparableDriver(t *testing.T) {
	e := newEnv(t, 64*g)
	d := sliceDriver{Driver: e.drv.(*host.Driver), tags: []string{"x"}}
	space := vaspace.New(d)
	ranges0, defaults0 := registered(e.drv)
	require.NotPanics(t, func() {
		_, err := New(space, physical.New(d), Props{ChunkSize: g})
		drivertest.RequireIs(t, err, driver.ErrInvalid, "pool: new pool", "pool.sliceDriver is not comparable")
		_, err = Default(d, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "pool: default pool", "not comparable")
		drivertest.RequireIs(t, CloseDefaults(d), driver.ErrInvalid, "pool: close default pools", "not comparable")
		_, err = Default(nil, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
	})
	require.Empty(t, space.Reservations(), "nothing reserved")
	ranges, defaults := registered(e.drv)
	require.Equal(t, ranges0, ranges)
	require.Equal(t, defaults0, defaults)
	require.NoError(t, checkRegistry())
	require.Zero(t, e.used(t, 0))

	// A pointer to the same driver is comparable, and works.
	p, err := New(vaspace.New(&d), physical.New(&d), Props{ChunkSize: g, MaxSize: 4 * g})
	require.NoError(t, err)
	require.NoError(t, p.Destroy())
}

// TestRegistryCheckFindsBrokenIndex: the registry's check reports what is
// wrong with its index, all at once.
func TestRegistryCheckFindsBrokenIndex(t *testing.T) {
	pe := newPoolEnv(t, Props{MaxSize: 4 * g}, true, true, true)
	require.NoError(t, checkRegistry())
	reg.remove(pe.p)
	require.NoError(t, checkRegistry(), "a pool not indexed is not the registry's business")
	fake := &Pool{d: pe.p.d, props: pe.p.props, ranges: pe.p.ranges} // another pool claiming the same ranges
	require.NoError(t, reg.add(pe.p))
	err := reg.add(fake)
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.Contains(t, err.Error(), "overlaps")
	require.NoError(t, checkRegistry(), "the refused add changed nothing")

	reg.mu.Lock()
	rs := reg.ranges[pe.drv]
	i, _ := rs.Find(pe.p.ranges[0].Base)
	rs.At(i).Val = fake // the index says another pool owns the range
	reg.mu.Unlock()
	err = checkRegistry()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.Contains(t, err.Error(), "a pool owns")
	reg.mu.Lock()
	rs.At(i).Val = pe.p
	reg.mu.Unlock()
	require.NoError(t, checkRegistry())
}

// TestCloseDefaultsWhileHostFuncAllocates: the default pools are closed
// while a free is in flight behind a host function that allocates from
// (and frees to) the default pool. CloseDefaults waits for the free
// holding only the lock that orders default pools' creation; Default finds
// an existing pool without that lock, so the host function's allocation
// goes through, and both finish instead of waiting for each other.
func TestCloseDefaultsWhileHostFuncAllocates(t *testing.T) {
	e := newEnv(t, 64*g)
	s, err := stream.New(e.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	s2, err := stream.New(e.drv, 0)
	require.NoError(t, err)
	defer s2.Destroy()
	ptr, err := MallocAsync(1000, s)
	require.NoError(t, err)
	gate := make(chan struct{})
	var hostErr error
	require.NoError(t, s.Launch("allocates", func() error {
		<-gate
		p, err := MallocAsync(64, s2)
		if err == nil {
			err = FreeAsync(p, s2)
		}
		hostErr = err
		return nil
	}))
	require.NoError(t, FreeAsync(ptr, s))                       // completes after the host function
	time.AfterFunc(20*time.Millisecond, func() { close(gate) }) // once CloseDefaults waits
	watchdog := time.AfterFunc(5*time.Second, func() {
		buf := make([]byte, 1<<20)
		panic(fmt.Sprintf("CloseDefaults did not return within 5s; goroutines:\n%s", buf[:runtime.Stack(buf, true)]))
	})
	require.NoError(t, CloseDefaults(e.drv))
	watchdog.Stop()
	require.NoError(t, s.Synchronize())
	require.NoError(t, hostErr)
	_, defaults := registered(e.drv)
	require.Zero(t, defaults)
	require.Zero(t, e.used(t, 0), "every byte went back")
}
