package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/pool"
)

// objects are one object of each kind on a sim driver, and a function
// that closes each (the driver is closed at the end of the test).
type objects struct {
	cache *kvcache.Cache
	al    *arena.Allocator
	a     *arena.Arena
	s     *arena.Sparse
	p     *pool.Pool
}

func newObjects(t *testing.T) *objects {
	t.Helper()
	e := simEnv(t)
	o := &objects{cache: newCache(t, e)}
	var err error
	o.al, err = arena.NewAllocator(e.space, e.mem, arena.AllocatorOptions{Max: 64 * units.MiB})
	require.NoError(t, err)
	o.a, err = arena.New(e.space, e.mem, arena.Options{Max: 64 * units.MiB})
	require.NoError(t, err)
	o.s, err = arena.NewSparse(e.space, e.mem, arena.SparseOptions{Max: 64 * units.MiB})
	require.NoError(t, err)
	o.p, err = pool.New(e.space, e.mem, pool.Props{MaxSize: 64 * units.MiB})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range []interface{ Closed() bool }{o.cache, o.al, o.a, o.s} {
			if !c.Closed() {
				require.NoError(t, c.(interface{ Close() error }).Close())
			}
		}
		if err := o.p.Destroy(); err != nil {
			require.ErrorIs(t, err, driver.ErrClosed)
		}
	})
	return o
}

// collectors are the collectors of o's objects, all named name.
func (o *objects) collectors(t *testing.T, name string) []*metrics.Collector {
	t.Helper()
	var cs []*metrics.Collector
	for _, mk := range []func() (*metrics.Collector, error){
		func() (*metrics.Collector, error) { return metrics.NewKVCacheCollector(name, o.cache) },
		func() (*metrics.Collector, error) { return metrics.NewAllocatorCollector(name, o.al) },
		func() (*metrics.Collector, error) { return metrics.NewArenaCollector(name, o.a) },
		func() (*metrics.Collector, error) { return metrics.NewPoolCollector(name+" pool", o.p) },
		func() (*metrics.Collector, error) { return metrics.NewSparseCollector(name+" range", o.s) },
	} {
		c, err := mk()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	return cs
}

// TestConstructorsRefuse: a nil object, a zero one (not made by its
// package), a closed one and a name that cannot be a label value are
// errors that say so, never a collector that panics later.
func TestConstructorsRefuse(t *testing.T) {
	type mk func(name string) (*metrics.Collector, error)
	kinds := map[string]struct {
		nil, zero mk
		zeroIs    error
	}{
		"kvcache": {
			func(n string) (*metrics.Collector, error) { return metrics.NewKVCacheCollector(n, nil) },
			func(n string) (*metrics.Collector, error) { return metrics.NewKVCacheCollector(n, &kvcache.Cache{}) },
			driver.ErrInvalid,
		},
		"allocator": {
			func(n string) (*metrics.Collector, error) { return metrics.NewAllocatorCollector(n, nil) },
			func(n string) (*metrics.Collector, error) {
				return metrics.NewAllocatorCollector(n, &arena.Allocator{})
			},
			driver.ErrClosed,
		},
		"arena": {
			func(n string) (*metrics.Collector, error) { return metrics.NewArenaCollector(n, nil) },
			func(n string) (*metrics.Collector, error) { return metrics.NewArenaCollector(n, &arena.Arena{}) },
			driver.ErrClosed,
		},
		"sparse range": {
			func(n string) (*metrics.Collector, error) { return metrics.NewSparseCollector(n, nil) },
			func(n string) (*metrics.Collector, error) { return metrics.NewSparseCollector(n, &arena.Sparse{}) },
			driver.ErrInvalid,
		},
		"pool": {
			func(n string) (*metrics.Collector, error) { return metrics.NewPoolCollector(n, nil) },
			func(n string) (*metrics.Collector, error) { return metrics.NewPoolCollector(n, &pool.Pool{}) },
			driver.ErrInvalid,
		},
	}
	for kind, k := range kinds {
		c, err := k.nil("x")
		drivertest.RequireIs(t, err, driver.ErrInvalid, "new "+kind+" collector", `"x"`, "is nil")
		require.Nil(t, c)
		c, err = k.zero("x")
		drivertest.RequireIs(t, err, k.zeroIs, "new "+kind+" collector", `"x"`)
		require.Nil(t, c)
	}

	o := newObjects(t)
	for name, why := range map[string]string{"": "the name is empty", "\xff": "not UTF-8"} {
		for _, mk := range []mk{
			func(n string) (*metrics.Collector, error) { return metrics.NewKVCacheCollector(n, o.cache) },
			func(n string) (*metrics.Collector, error) { return metrics.NewAllocatorCollector(n, o.al) },
			func(n string) (*metrics.Collector, error) { return metrics.NewArenaCollector(n, o.a) },
			func(n string) (*metrics.Collector, error) { return metrics.NewSparseCollector(n, o.s) },
			func(n string) (*metrics.Collector, error) { return metrics.NewPoolCollector(n, o.p) },
		} {
			c, err := mk(name)
			drivertest.RequireIs(t, err, driver.ErrInvalid, why)
			require.Nil(t, c)
		}
	}

	require.NoError(t, o.cache.Close())
	require.NoError(t, o.al.Close())
	require.NoError(t, o.a.Close())
	require.NoError(t, o.s.Close())
	for kind, mk := range map[string]func() (*metrics.Collector, error){
		"cache":     func() (*metrics.Collector, error) { return metrics.NewKVCacheCollector("x", o.cache) },
		"allocator": func() (*metrics.Collector, error) { return metrics.NewAllocatorCollector("x", o.al) },
		"arena":     func() (*metrics.Collector, error) { return metrics.NewArenaCollector("x", o.a) },
		"range":     func() (*metrics.Collector, error) { return metrics.NewSparseCollector("x", o.s) },
	} {
		c, err := mk()
		drivertest.RequireIs(t, err, driver.ErrClosed, "the "+kind+" is closed")
		require.Nil(t, c)
	}
}

// TestClosedObjectsSendNothing: objects closed after their collectors
// were made drop out of the scrape, which goes on without an error; their
// Stats, which a scrape racing with the close may still call, do not
// panic either. A destroyed pool reads no memory.
func TestClosedObjectsSendNothing(t *testing.T) {
	o := newObjects(t)
	cs := o.collectors(t, "x")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, cs...))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 38+22+17+6+16, n, "every series while the objects are open")

	require.NoError(t, o.cache.Close())
	require.NoError(t, o.al.Close())
	require.NoError(t, o.a.Close())
	require.NoError(t, o.s.Close())
	require.NoError(t, o.p.Destroy())
	require.NotPanics(t, func() {
		o.cache.Stats()
		o.al.Stats()
		o.a.Stats()
		o.s.Stats()
	})
	n, err = testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 6, n, "the destroyed pool's series alone")
	for _, c := range cs[:3] {
		require.Zero(t, testutil.CollectAndCount(c), "%s", c)
	}
	require.Zero(t, scrape(t, cs[3], "x pool")["vmarena_pool_reserved_bytes"])
}

// TestRegister: collectors of every kind under one name go into one
// registry; a second collector of a kind under a name the registry holds
// is refused with an error that says so, and the collectors registered
// before it in the same call are taken back; registering a collector
// twice is an error too, never a panic.
func TestRegister(t *testing.T) {
	o := newObjects(t)
	reg := prometheus.NewPedanticRegistry()
	cs := o.collectors(t, "model-a")
	require.NoError(t, metrics.Register(reg, cs...))

	again, err := metrics.NewKVCacheCollector("model-a", o.cache)
	require.NoError(t, err)
	other, err := metrics.NewAllocatorCollector("model-b", o.al)
	require.NoError(t, err)
	err = metrics.Register(reg, other, again)
	drivertest.RequireIs(t, err, driver.ErrInvalid, `register the kvcache collector "model-a"`, `another kvcache collector named "model-a"`)
	require.True(t, reg.Unregister(cs[0]), "the first is still registered")
	require.False(t, reg.Unregister(other), "other was taken back")
	require.NoError(t, metrics.Register(reg, cs[0]))

	err = metrics.Register(reg, cs[1])
	drivertest.RequireIs(t, err, driver.ErrInvalid, `register the allocator collector "model-a": it is registered already`)

	// A range shares the arena's metrics, so its name too.
	rng, err := metrics.NewSparseCollector("model-a", o.s)
	require.NoError(t, err)
	err = metrics.Register(reg, rng)
	require.ErrorContains(t, err, `register the arena collector "model-a"`)
	require.ErrorContains(t, err, "vmarena_arena_")

	drivertest.RequireIs(t, metrics.Register(nil, cs[0]), driver.ErrInvalid, "the registerer is nil")
	drivertest.RequireIs(t, metrics.Register(reg, other, nil), driver.ErrInvalid, "collector 2 of 2 is nil")
	require.False(t, reg.Unregister(other), "other was taken back")
	drivertest.RequireIs(t, metrics.Register(reg, &metrics.Collector{}), driver.ErrInvalid, "not made by a New function")
	require.Zero(t, testutil.CollectAndCount(&metrics.Collector{}), "a zero Collector sends nothing")

	_, err = reg.Gather()
	require.NoError(t, err)
}

// TestLint: promlint finds nothing wrong with any collector's metrics,
// fresh ones included.
func TestLint(t *testing.T) {
	for _, c := range newObjects(t).collectors(t, "x") {
		lint(t, c)
	}
}

// TestNilCollectorsAndRegistries: a nil *Collector answers every method
// without panicking and is refused by Register, as is a nil registerer of
// either kind (a nil interface, a nil *prometheus.Registry); nothing is
// registered after a refusal.
func TestNilCollectorsAndRegistries(t *testing.T) {
	var c *metrics.Collector
	require.Empty(t, c.Name())
	require.Equal(t, "a nil collector", c.String())
	descs := make(chan *prometheus.Desc, 1)
	c.Describe(descs)
	ms := make(chan prometheus.Metric, 1)
	c.Collect(ms)
	require.Empty(t, descs)
	require.Empty(t, ms)

	reg := prometheus.NewPedanticRegistry()
	drivertest.RequireIs(t, metrics.Register(reg, c), driver.ErrInvalid, "collector 1 of 1 is nil")
	var nilReg *prometheus.Registry
	drivertest.RequireIs(t, metrics.Register(nilReg), driver.ErrInvalid, "the registerer is nil")
	drivertest.RequireIs(t, metrics.Register(nil), driver.ErrInvalid, "the registerer is nil")
	got, err := reg.Gather()
	require.NoError(t, err)
	require.Empty(t, got)
}
