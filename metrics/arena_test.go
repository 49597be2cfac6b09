package metrics_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
)

// sparseWant is what an arena's or a range's collector sends for st, of
// size max.
func sparseWant(st arena.SparseStats, max uint64) map[string]float64 {
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	return map[string]float64{
		"vmarena_arena_max_bytes":               b(max),
		"vmarena_arena_committed_bytes":         b(st.Committed),
		"vmarena_arena_peak_committed_bytes":    b(st.PeakCommitted),
		"vmarena_arena_borrowed_bytes":          b(st.Borrowed),
		"vmarena_arena_chunks":                  f(st.Chunks),
		"vmarena_arena_views":                   f(st.Views),
		"vmarena_arena_map_events_total":        f(st.MapEvents),
		"vmarena_arena_unmap_events_total":      f(st.UnmapEvents),
		"vmarena_arena_chunk_maps_total":        f(st.ChunkMaps),
		"vmarena_arena_chunk_unmaps_total":      f(st.ChunkUnmaps),
		"vmarena_arena_chunk_creates_total":     f(st.Creates),
		"vmarena_arena_chunk_releases_total":    f(st.Releases),
		"vmarena_arena_decommits_total":         f(st.Decommits),
		"vmarena_arena_decommitted_bytes_total": b(st.DecommittedBytes),
		"vmarena_arena_moves_total":             f(st.Moves),
		"vmarena_arena_moved_bytes_total":       b(st.MovedBytes),
	}
}

// TestArenaCollector: an arena grown, viewed, shrunk and trimmed on the
// sim driver; its collector sends its Stats.
func TestArenaCollector(t *testing.T) {
	e := simEnv(t)
	a, err := arena.New(e.space, e.mem, arena.Options{Max: 64 * units.MiB, ChunkSize: 2 * units.MiB, MaxChunk: 2 * units.MiB})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	col, err := metrics.NewArenaCollector("activations", a)
	require.NoError(t, err)

	require.NoError(t, a.Grow(9*units.MiB))
	v, err := a.View(0, units.MiB)
	require.NoError(t, err)
	defer func() { require.NoError(t, v.Release()) }()
	require.NoError(t, a.Shrink(4*units.MiB))
	require.NoError(t, a.Trim())

	st := a.Stats()
	require.Equal(t, 6*units.MiB, st.Committed)
	require.Equal(t, 10*units.MiB, st.PeakCommitted)
	require.Equal(t, 1, st.Views)
	want := sparseWant(st.SparseStats, 64*units.MiB)
	want["vmarena_arena_length_bytes"] = float64(5 * units.MiB)
	require.Equal(t, want, scrape(t, col, "activations"))
	lint(t, col)
}

// TestSparseCollector: a bare range committed and decommitted in the
// middle; its collector sends the arena's metrics but the length.
func TestSparseCollector(t *testing.T) {
	e := simEnv(t)
	s, err := arena.NewSparse(e.space, e.mem, arena.SparseOptions{Max: 64 * units.MiB, ChunkSize: 2 * units.MiB})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	col, err := metrics.NewSparseCollector("scratch", s)
	require.NoError(t, err)

	require.NoError(t, s.Commit(0, 8*units.MiB))
	require.NoError(t, s.Decommit(2*units.MiB, 4*units.MiB))

	st := s.Stats()
	require.Equal(t, 4*units.MiB, st.Committed)
	require.Equal(t, 1, st.Decommits)
	require.Equal(t, sparseWant(st, 64*units.MiB), scrape(t, col, "scratch"))
	lint(t, col)
}

// TestAllocatorCollector: allocations made and freed on the sim driver,
// some memory given back; the collector sends the allocator's Stats.
func TestAllocatorCollector(t *testing.T) {
	e := simEnv(t)
	al, err := arena.NewAllocator(e.space, e.mem, arena.AllocatorOptions{Max: units.GiB, ChunkSize: 2 * units.MiB})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, al.Close()) })
	col, err := metrics.NewAllocatorCollector("weights", al)
	require.NoError(t, err)

	var live []driver.Addr
	for _, n := range []uint64{3 * units.MiB, 100 * units.KiB, 40 * units.MiB, 7 * units.KiB} {
		p, err := al.Alloc(n, 0)
		require.NoError(t, err)
		live = append(live, p)
	}
	p, err := al.Alloc(20*units.MiB, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Trim())

	st := al.Stats()
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	want := map[string]float64{
		"vmarena_allocator_max_bytes":                b(units.GiB),
		"vmarena_allocator_allocated_bytes":          b(st.Allocated),
		"vmarena_allocator_peak_allocated_bytes":     b(st.PeakAllocated),
		"vmarena_allocator_committed_bytes":          b(st.Committed),
		"vmarena_allocator_peak_committed_bytes":     b(st.PeakCommitted),
		"vmarena_allocator_largest_free_block_bytes": b(st.LargestFree),
		"vmarena_allocator_live_allocations":         4,
		"vmarena_allocator_map_events_total":         f(st.MapEvents),
		"vmarena_allocator_unmap_events_total":       f(st.UnmapEvents),
		"vmarena_allocator_chunk_maps_total":         f(st.ChunkMaps),
		"vmarena_allocator_chunk_unmaps_total":       f(st.ChunkUnmaps),
		"vmarena_allocator_decommits_total":          f(st.Decommits),
		"vmarena_allocator_decommitted_bytes_total":  b(st.DecommittedBytes),
		"vmarena_allocator_grows_total":              f(st.Grows),
		"vmarena_allocator_stitches_total":           f(st.Stitches),
		"vmarena_allocator_relocations_total":        f(st.Relocations),
		"vmarena_allocator_relocated_bytes_total":    b(st.RelocatedBytes),
		"vmarena_allocator_splits_total":             f(st.Splits),
		"vmarena_allocator_chunk_creates_total":      f(st.Creates),
		"vmarena_allocator_chunk_releases_total":     f(st.Releases),
		"vmarena_allocator_access_grants_total":      f(st.Grants),
		"vmarena_allocator_oom_retries_total":        f(st.OOMRetries),
	}
	require.Equal(t, want, scrape(t, col, "weights"))
	require.Equal(t, b(3*units.MiB+100*units.KiB+40*units.MiB+7*units.KiB), want["vmarena_allocator_allocated_bytes"])
	lint(t, col)
	for _, p := range live {
		require.NoError(t, al.Free(p))
	}
}

// TestPoolCollector: stream-ordered allocations on the sim driver; the
// collector sends the pool's memory attributes.
func TestPoolCollector(t *testing.T) {
	e := simEnv(t)
	s, err := stream.New(e.drv, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Destroy()) })
	p, err := pool.New(e.space, e.mem, pool.Props{MaxSize: 64 * units.MiB, ChunkSize: 2 * units.MiB})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Destroy()) })
	col, err := metrics.NewPoolCollector("requests", p)
	require.NoError(t, err)
	require.NoError(t, p.SetAttribute(pool.ReleaseThreshold, 4*units.MiB))

	a, err := p.MallocAsync(5*units.MiB, s)
	require.NoError(t, err)
	b, err := p.MallocAsync(units.MiB, s)
	require.NoError(t, err)
	require.NoError(t, p.FreeAsync(a, s))
	require.NoError(t, s.Synchronize())

	attr := func(a pool.Attr) float64 {
		v, err := p.Attribute(a)
		require.NoError(t, err)
		return float64(v)
	}
	want := map[string]float64{
		"vmarena_pool_max_bytes":               float64(64 * units.MiB),
		"vmarena_pool_reserved_bytes":          attr(pool.ReservedMemCurrent),
		"vmarena_pool_peak_reserved_bytes":     attr(pool.ReservedMemHigh),
		"vmarena_pool_used_bytes":              float64(units.MiB),
		"vmarena_pool_peak_used_bytes":         float64(6 * units.MiB),
		"vmarena_pool_release_threshold_bytes": float64(4 * units.MiB),
	}
	require.Positive(t, want["vmarena_pool_reserved_bytes"])
	require.Equal(t, want, scrape(t, col, "requests"))
	lint(t, col)
	require.NoError(t, p.FreeAsync(b, s))
	require.NoError(t, s.Synchronize())
}
