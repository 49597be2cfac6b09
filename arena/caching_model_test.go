package arena

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// cachingModel is a model of PyTorch's CUDA caching allocator as it runs
// by default (c10/cuda/CUDACachingAllocator.cpp: one stream, no
// expandable segments, no max_split_size, no rounding to powers of two):
// the baseline a synthetic workload's ratio is held to, run on the same
// events in the same process. Its rules:
//
//   - a request is rounded up to a multiple of 512 B (at least 512 B);
//     one of at most 1 MiB comes from the small pool, any other from the
//     large one;
//   - the smallest free block of the pool that holds it is taken (ties:
//     the oldest segment, then the lowest offset), and split when what
//     is left is at least 512 B (small pool) or more than 1 MiB (large
//     pool): a remainder too small to split stays with the allocation;
//   - with no such block a segment is allocated (cudaMalloc): 2 MiB for
//     the small pool, 20 MiB for a large request under 10 MiB, else the
//     request rounded up to 2 MiB;
//   - a free block merges with the free blocks beside it in its segment;
//     segments are never given back but when an allocation fails for
//     want of device memory, when every segment with no live block is
//     released and the allocation tried once more (its OOM path).
//
// Reserved memory is the segments' sum, what PyTorch's memory snapshots
// call reserved; the ratio of its peak to the peak allocated is the one
// `vmarena replay` prints from a trace's segment events.
type cachingModel struct {
	capacity       uint64
	reserved, peak uint64
	segs           int // segments made, for their order
	small, large   []*cmBlock
	live           map[int]*cmBlock
	// mallocs and releases count segments made and given back, ooms the
	// allocations that found the device full.
	mallocs, releases, ooms int
}

// cmBlock is a block of a segment: free or an allocation's.
type cmBlock struct {
	seg        *cmSeg
	off, size  uint64
	free       bool
	prev, next *cmBlock
}

type cmSeg struct {
	id    int
	size  uint64
	small bool
	first *cmBlock
}

const (
	cmMinBlock    = 512
	cmSmallSize   = units.MiB
	cmSmallBuffer = 2 * units.MiB
	cmLargeBuffer = 20 * units.MiB
	cmMinLarge    = 10 * units.MiB
	cmRoundLarge  = 2 * units.MiB
)

func newCachingModel(capacity uint64) *cachingModel {
	return &cachingModel{capacity: capacity, live: map[int]*cmBlock{}}
}

func cmLess(a, b *cmBlock) int {
	return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.seg.id, b.seg.id), cmp.Compare(a.off, b.off))
}

func (m *cachingModel) pool(small bool) *[]*cmBlock {
	if small {
		return &m.small
	}
	return &m.large
}

func (m *cachingModel) insert(b *cmBlock) {
	p := m.pool(b.seg.small)
	i, _ := slices.BinarySearchFunc(*p, b, cmLess)
	*p = slices.Insert(*p, i, b)
}

func (m *cachingModel) remove(b *cmBlock) {
	p := m.pool(b.seg.small)
	i, ok := slices.BinarySearchFunc(*p, b, cmLess)
	if !ok || (*p)[i] != b {
		panic("caching model: a free block not in its pool")
	}
	*p = slices.Delete(*p, i, i+1)
}

// alloc serves request id of size bytes; false when the device cannot
// hold it even after the segments with nothing live are released.
func (m *cachingModel) alloc(id int, size uint64) bool {
	size = max(cmMinBlock, (size+cmMinBlock-1)/cmMinBlock*cmMinBlock)
	small := size <= cmSmallSize
	p := m.pool(small)
	i, _ := slices.BinarySearchFunc(*p, &cmBlock{seg: &cmSeg{id: -1}, size: size}, cmLess)
	var b *cmBlock
	if i < len(*p) {
		b = (*p)[i]
		m.remove(b)
	} else {
		seg := cmSmallBuffer
		if !small {
			seg = cmLargeBuffer
			if size >= cmMinLarge {
				seg = (size + cmRoundLarge - 1) / cmRoundLarge * cmRoundLarge
			}
		}
		if m.reserved+uint64(seg) > m.capacity {
			m.ooms++
			m.releaseEmpty()
			if m.reserved+uint64(seg) > m.capacity {
				return false
			}
		}
		s := &cmSeg{id: m.segs, size: uint64(seg), small: small}
		m.segs++
		m.mallocs++
		b = &cmBlock{seg: s, size: s.size}
		s.first = b
		m.reserved += s.size
		m.peak = max(m.peak, m.reserved)
	}
	left := b.size - size
	if (small && left >= cmMinBlock) || (!small && left > cmSmallSize) {
		rest := &cmBlock{seg: b.seg, off: b.off + size, size: left, free: true, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rest
		}
		b.next, b.size = rest, size
		m.insert(rest)
	}
	b.free = false
	m.live[id] = b
	return true
}

// free frees request id's block, merging it with free neighbours.
func (m *cachingModel) free(id int) {
	b := m.live[id]
	delete(m.live, id)
	b.free = true
	if n := b.next; n != nil && n.free {
		m.remove(n)
		b.size += n.size
		b.next = n.next
		if n.next != nil {
			n.next.prev = b
		}
	}
	if p := b.prev; p != nil && p.free {
		m.remove(p)
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		}
		b = p
	}
	m.insert(b)
}

// releaseEmpty releases every segment that holds no live block (one free
// block of the segment's size).
func (m *cachingModel) releaseEmpty() {
	for _, small := range []bool{true, false} {
		p := m.pool(small)
		*p = slices.DeleteFunc(*p, func(b *cmBlock) bool {
			if b.off == 0 && b.size == b.seg.size {
				m.reserved -= b.size
				m.releases++
				return true
			}
			return false
		})
	}
}

// cachingRatio replays w through the model on a device of capacity
// bytes: its peak reserved over the workload's peak allocated, or false
// when the model runs out of memory.
func cachingRatio(w workload, capacity uint64) (float64, bool) {
	m := newCachingModel(capacity)
	sizes := map[int]uint64{}
	var allocated, peak uint64
	for _, e := range w.events {
		if e.size == 0 {
			m.free(e.id)
			allocated -= sizes[e.id]
			delete(sizes, e.id)
			continue
		}
		if !m.alloc(e.id, e.size) {
			return 0, false
		}
		sizes[e.id] = e.size
		allocated += e.size
		peak = max(peak, allocated)
	}
	if peak == 0 {
		panic(fmt.Sprintf("caching model: %s allocates nothing", w.name))
	}
	return float64(m.peak) / float64(peak), true
}

// TestCachingModel: the model's rules by hand — a small request packed
// into a 2 MiB segment and split, a large one under 10 MiB splitting a
// 20 MiB segment, a remainder of 1 MiB or less left with a large
// allocation, best fit among free blocks, merging on free, a segment of
// its own rounded to 2 MiB for 10 MiB or more, and the OOM path that
// releases the empty segments and tries again.
func TestCachingModel(t *testing.T) {
	m := newCachingModel(64 * units.MiB)
	require.True(t, m.alloc(1, 100)) // 512 B of a new 2 MiB segment
	require.Equal(t, uint64(2*units.MiB), m.reserved)
	require.Len(t, m.small, 1)
	require.Equal(t, uint64(2*units.MiB-512), m.small[0].size)
	require.True(t, m.alloc(2, 3*units.MiB)) // splits a new 20 MiB segment: 17 MiB free
	require.Equal(t, uint64(22*units.MiB), m.reserved)
	require.Equal(t, []uint64{17 * units.MiB}, cmSizes(m.large))
	require.True(t, m.alloc(3, 16*units.MiB+512)) // best fit: the 17 MiB block, the rest (1 MiB - 512) too small to split
	require.Equal(t, uint64(17*units.MiB), m.live[3].size)
	require.Empty(t, m.large)
	m.free(2)
	m.free(3) // merges with 2's block: the segment free whole
	require.Equal(t, []uint64{20 * units.MiB}, cmSizes(m.large))
	require.True(t, m.alloc(4, 11*units.MiB)) // the free 20 MiB block, split: 9 MiB left
	require.Equal(t, uint64(22*units.MiB), m.reserved)
	require.Equal(t, []uint64{9 * units.MiB}, cmSizes(m.large))
	require.True(t, m.alloc(5, 21*units.MiB+1)) // no block holds it: a segment of 22 MiB
	require.Equal(t, uint64(44*units.MiB), m.reserved)
	require.Equal(t, uint64(44*units.MiB), m.peak)
	m.free(5)
	// 30 MiB more does not fit beside the 44 reserved: the empty 22 MiB
	// segment goes back and it fits.
	require.True(t, m.alloc(6, 30*units.MiB))
	require.Equal(t, 1, m.ooms)
	require.Equal(t, 1, m.releases)
	require.Equal(t, uint64(52*units.MiB), m.reserved)
	require.False(t, m.alloc(7, 20*units.MiB), "nothing empty to release: out of memory")
	require.Equal(t, 4, m.mallocs)
}

func cmSizes(bs []*cmBlock) []uint64 {
	out := []uint64{}
	for _, b := range bs {
		out = append(out, b.size)
	}
	return out
}

// TestCachingModelMatchesPyTorch: replayed through the model, the
// allocations of the bundled traces that start with nothing live reserve
// what PyTorch reserved (their segment_alloc events; none returns a
// segment): kkaitlyn's and silmont's peak exactly, in the same number of
// segments, select_n's within 0.5% (its segments are 16 MiB, not 20).
// cranberrii's and the other traces start mid-run and are left out.
func TestCachingModelMatchesPyTorch(t *testing.T) {
	for _, tc := range []struct {
		file  string
		exact bool
	}{
		{"cs336_kkaitlyn111_memory_ctx128_fullstep.csv", true},
		{"silmont2000_mem_snapshot.csv", true},
		{"select_n_snapshot_v1f2f548.csv", false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			w, reserved, segs := traceWorkload(t, filepath.Join("..", "testdata", "alloc-traces", tc.file))
			m := newCachingModel(80 * units.GiB)
			for _, e := range w.events {
				if e.size == 0 {
					m.free(e.id)
				} else {
					require.True(t, m.alloc(e.id, e.size))
				}
			}
			t.Logf("reserved at the peak: PyTorch %d in %d segments, the model %d in %d", reserved, segs, m.peak, m.mallocs)
			if tc.exact {
				require.Equal(t, reserved, m.peak)
				require.Equal(t, segs, m.mallocs)
			} else {
				require.InEpsilon(t, float64(reserved), float64(m.peak), 0.005)
			}
		})
	}
}

// traceWorkload reads a trace of testdata/alloc-traces (one device, one
// stream): its allocations and completed frees as a workload, and the
// bytes and number of its segment_alloc events.
func traceWorkload(t *testing.T, path string) (workload, uint64, int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	w := workload{name: filepath.Base(path)}
	var reserved uint64
	var segs int
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n")[1:] {
		f := strings.Split(line, ",")
		require.GreaterOrEqual(t, len(f), 7, "line %d", i+2)
		require.Equal(t, "0", f[1], "line %d: one device", i+2)
		require.Equal(t, "0", f[6], "line %d: one stream", i+2)
		size, err := strconv.ParseUint(f[3], 10, 64)
		require.NoError(t, err, "line %d", i+2)
		id, err := strconv.Atoi(f[5])
		require.NoError(t, err, "line %d", i+2)
		switch f[2] {
		case "alloc":
			w.events = append(w.events, wlEvent{id + 1, size})
		case "free_completed":
			w.events = append(w.events, wlEvent{id + 1, 0})
		case "segment_alloc":
			reserved += size
			segs++
		case "free_requested":
		default:
			t.Fatalf("line %d: op %q", i+2, f[2])
		}
	}
	return w, reserved, segs
}
