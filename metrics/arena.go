package metrics

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
)

// NewArenaCollector makes the collector of the arena a, whose series carry
// the label name="name": vmarena_arena_*, the figures of arena.Stats. A
// nil arena, one not made by arena.New (ErrInvalid) and a closed one
// (ErrClosed) are refused.
func NewArenaCollector(name string, a *arena.Arena) (*Collector, error) {
	what := func() string { return "metrics: new arena collector" }
	if err := checkName(what, name); err != nil {
		return nil, err
	}
	switch {
	case a == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: the arena is nil", what(), name)
	case a.Closed():
		// A zero Arena reports itself closed too.
		return nil, errors.Wrapf(driver.ErrClosed, "%s %q: the arena is closed (or not made by arena.New)", what(), name)
	}
	type st = arena.Stats
	figs := []figure[st]{
		gauge("length_bytes", "The arena's length: [base, base+length) is usable.",
			func(s *st) float64 { return float64(s.Len) }),
	}
	for _, sf := range sparseFigures(float64(a.Max())) {
		figs = append(figs, embedded(sf, func(s *st) *arena.SparseStats { return &s.SparseStats }))
	}
	return newCollector("arena", name, figs, a.Closed, always(a.Stats))
}

// NewSparseCollector makes the collector of the range s: the metrics of
// an arena's range (vmarena_arena_*, without length_bytes), of which an
// arena is one used as a prefix; names are shared with arenas. A nil range,
// one not made by arena.NewSparse (ErrInvalid) and a closed one
// (ErrClosed) are refused.
func NewSparseCollector(name string, s *arena.Sparse) (*Collector, error) {
	what := func() string { return "metrics: new sparse range collector" }
	if err := checkName(what, name); err != nil {
		return nil, err
	}
	switch {
	case s == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: the range is nil", what(), name)
	case s.Max() == 0:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: not a range made by arena.NewSparse", what(), name)
	case s.Closed():
		return nil, errors.Wrapf(driver.ErrClosed, "%s %q: the range is closed", what(), name)
	}
	return newCollector("arena", name, sparseFigures(float64(s.Max())), s.Closed, always(s.Stats))
}

// sparseFigures are the metrics of a range of limit bytes, an arena's or a
// bare one.
func sparseFigures(limit float64) []figure[arena.SparseStats] {
	type st = arena.SparseStats
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	return []figure[st]{
		gauge("max_bytes", "The range's size: the most it can commit.",
			func(*st) float64 { return limit }),
		gauge("committed_bytes", "Memory of the chunks the range owns.",
			func(s *st) float64 { return b(s.Committed) }),
		gauge("peak_committed_bytes", "The most committed_bytes has been.",
			func(s *st) float64 { return b(s.PeakCommitted) }),
		gauge("borrowed_bytes", "Memory of chunks mapped here that other ranges own.",
			func(s *st) float64 { return b(s.Borrowed) }),
		gauge("chunks", "Chunks mapped now, owned or borrowed.",
			func(s *st) float64 { return f(s.Chunks) }),
		gauge("views", "Live views, each pinning what it covers.",
			func(s *st) float64 { return f(s.Views) }),
		counter("map_events_total", "Contiguous ranges mapped at once (PyTorch's segment_map).",
			func(s *st) float64 { return f(s.MapEvents) }),
		counter("unmap_events_total", "Contiguous ranges unmapped at once (PyTorch's segment_unmap).",
			func(s *st) float64 { return f(s.UnmapEvents) }),
		counter("chunk_maps_total", "Driver map calls, one a chunk.",
			func(s *st) float64 { return f(s.ChunkMaps) }),
		counter("chunk_unmaps_total", "Driver unmap calls, one a chunk.",
			func(s *st) float64 { return f(s.ChunkUnmaps) }),
		counter("chunk_creates_total", "Chunks created.",
			func(s *st) float64 { return f(s.Creates) }),
		counter("chunk_releases_total", "Chunks released.",
			func(s *st) float64 { return f(s.Releases) }),
		counter("decommits_total", "Decommits that gave memory back.",
			func(s *st) float64 { return f(s.Decommits) }),
		counter("decommitted_bytes_total", "Memory decommits gave back.",
			func(s *st) float64 { return b(s.DecommittedBytes) }),
		counter("moves_total", "Migrations of chunks to another device.",
			func(s *st) float64 { return f(s.Moves) }),
		counter("moved_bytes_total", "Memory those migrations moved.",
			func(s *st) float64 { return b(s.MovedBytes) }),
	}
}

// embedded is the figure f of a part of the figures T.
func embedded[T, P any](f figure[P], part func(*T) *P) figure[T] {
	out := figure[T]{name: f.name, help: f.help, typ: f.typ, split: f.split}
	for _, s := range f.series {
		out.series = append(out.series, series[T]{label: s.label, value: func(t *T) float64 { return s.value(part(t)) }})
	}
	return out
}

// NewAllocatorCollector makes the collector of the allocator al, whose
// series carry the label name="name": vmarena_allocator_*, the figures of
// arena.AllocStats. A nil allocator (ErrInvalid) and a closed one, or one
// not made by arena.NewAllocator (ErrClosed), are refused.
func NewAllocatorCollector(name string, al *arena.Allocator) (*Collector, error) {
	what := func() string { return "metrics: new allocator collector" }
	if err := checkName(what, name); err != nil {
		return nil, err
	}
	switch {
	case al == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: the allocator is nil", what(), name)
	case al.Closed():
		// A zero Allocator reports itself closed too.
		return nil, errors.Wrapf(driver.ErrClosed, "%s %q: the allocator is closed (or not made by arena.NewAllocator)", what(), name)
	}
	limit := float64(al.Max())
	type st = arena.AllocStats
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	figs := []figure[st]{
		gauge("max_bytes", "The most memory the allocator may hold committed at once.",
			func(*st) float64 { return limit }),
		gauge("allocated_bytes", "The sum of the sizes live allocations asked for.",
			func(s *st) float64 { return b(s.Allocated) }),
		gauge("peak_allocated_bytes", "The most allocated_bytes has been.",
			func(s *st) float64 { return b(s.PeakAllocated) }),
		gauge("committed_bytes", "Memory behind the allocator (a stitched chunk counted once).",
			func(s *st) float64 { return b(s.Committed) }),
		gauge("peak_committed_bytes", "The most committed_bytes has been.",
			func(s *st) float64 { return b(s.PeakCommitted) }),
		gauge("largest_free_block_bytes", "The largest free committed block.",
			func(s *st) float64 { return b(s.LargestFree) }),
		gauge("live_allocations", "Live allocations.",
			func(s *st) float64 { return f(s.Live) }),
		counter("map_events_total", "Contiguous ranges mapped at once: a commit of several chunks, a stitch (PyTorch's segment_map).",
			func(s *st) float64 { return f(s.MapEvents) }),
		counter("unmap_events_total", "Contiguous ranges unmapped at once (PyTorch's segment_unmap).",
			func(s *st) float64 { return f(s.UnmapEvents) }),
		counter("chunk_maps_total", "Driver map calls, one a chunk.",
			func(s *st) float64 { return f(s.ChunkMaps) }),
		counter("chunk_unmaps_total", "Driver unmap calls, one a chunk.",
			func(s *st) float64 { return f(s.ChunkUnmaps) }),
		counter("decommits_total", "Times free memory was given back.",
			func(s *st) float64 { return f(s.Decommits) }),
		counter("decommitted_bytes_total", "Memory given back.",
			func(s *st) float64 { return b(s.DecommittedBytes) }),
		counter("grows_total", "Commits of new memory.",
			func(s *st) float64 { return f(s.Grows) }),
		counter("stitches_total", "Requests served by stitching free chunks together.",
			func(s *st) float64 { return f(s.Stitches) }),
		counter("relocations_total", "Times whole free chunks were moved to where a request needed them, instead of creating new ones.",
			func(s *st) float64 { return f(s.Relocations) }),
		counter("relocated_bytes_total", "Memory moved by relocations.",
			func(s *st) float64 { return b(s.RelocatedBytes) }),
		counter("splits_total", "Requests whose commit was recut so as not to pin a whole free chunk.",
			func(s *st) float64 { return f(s.Splits) }),
		counter("chunk_creates_total", "Driver create calls, one a chunk.",
			func(s *st) float64 { return f(s.Creates) }),
		counter("chunk_releases_total", "Driver release calls, one a chunk.",
			func(s *st) float64 { return f(s.Releases) }),
		counter("access_grants_total", "Driver access grants of new mappings, one a device and commit.",
			func(s *st) float64 { return f(s.Grants) }),
		counter("oom_retries_total", "Allocations retried after giving memory back because the device, or the allocator's maximum, was full.",
			func(s *st) float64 { return f(s.OOMRetries) }),
	}
	return newCollector("allocator", name, figs, al.Closed, always(al.Stats))
}
