package arena

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// fine is an allocator whose chunks are one granule (64 KiB) each, with at
// most max committed; opts adds what a test needs.
func (e *env) fine(t testing.TB, max uint64, policy Policy, opts ...func(*AllocatorOptions)) *Allocator {
	t.Helper()
	o := AllocatorOptions{Max: max, ChunkSize: g, Policy: policy}
	for _, f := range opts {
		f(&o)
	}
	al, err := NewAllocator(e.space, e.mem, o)
	require.NoError(t, err)
	t.Cleanup(func() { closeAllocator(t, al) })
	return al
}

// full gives the allocator a Max of n chunks and no more address space
// than that: once its chunks are committed, no hole has room for a request
// that needs more, and whole free chunks can only be stitched, not moved.
func full(n uint64) func(*AllocatorOptions) {
	return func(o *AllocatorOptions) { o.Max, o.AddressSpace = n*g, n*g }
}

// strict keeps nothing committed beyond the live set when committing more
// (a release threshold of one byte): every grow first gives back or
// stitches what is free.
func strict(o *AllocatorOptions) { o.ReleaseThreshold = 1 }

func TestPolicies(t *testing.T) { onEveryDriver(t, policies) }

func policies(t *testing.T, d backend) {
	require.Equal(t, uint64(160), PolicyAscend.Footprint(100), "ALIGN_UP(100,32)+32")
	require.Equal(t, uint64(64), PolicyAscend.Footprint(32))
	require.Equal(t, uint64(256), PolicyDefault.Footprint(1))
	require.Equal(t, uint64(512), PolicyDefault.Footprint(257))
	require.Equal(t, ^uint64(0), PolicyAscend.Footprint(^uint64(0)-10), "saturates instead of wrapping")
	e := d.env(t, 16*g)
	for _, c := range []struct {
		policy        Policy
		size, stride  uint64
		startAligned  uint64
		allocatedWant uint64
	}{
		{PolicyDefault, 1, 256, 256, 1},
		{PolicyDefault, 300, 512, 256, 300},
		{PolicyAscend, 100, 192, 64, 100},       // 160 bytes, kept 64-byte aligned
		{PolicyAscend, 32, 64, 64, 32},          // 64 bytes exactly
		{PolicyAscendMedia, 100, 256, 128, 100}, // 160 bytes, kept 128-byte aligned
	} {
		t.Run(fmt.Sprintf("%s/%d", c.policy, c.size), func(t *testing.T) {
			al := e.fine(t, 4*g, c.policy)
			p1, err := al.Alloc(c.size, 0)
			require.NoError(t, err)
			p2, err := al.Alloc(c.size, 0)
			require.NoError(t, err)
			require.Equal(t, c.stride, uint64(p2-p1), "consecutive pieces")
			require.Zero(t, uint64(p1)%c.startAligned)
			require.Zero(t, uint64(p2)%c.startAligned)
			require.Equal(t, 2*c.allocatedWant, al.Stats().Allocated)
			require.NoError(t, al.Check())
		})
	}
}

func TestAlignmentAndCoalescing(t *testing.T) { onEveryDriver(t, alignmentAndCoalescing) }

func alignmentAndCoalescing(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	a, err := al.Alloc(100, 0)
	require.NoError(t, err)
	b, err := al.Alloc(100, 4096)
	require.NoError(t, err)
	require.Zero(t, uint64(b)%4096)
	c, err := al.Alloc(300, 0)
	require.NoError(t, err)
	require.Equal(t, a+256, c, "the gap in front of the aligned piece is reused")
	require.NoError(t, al.Free(b))
	require.NoError(t, al.Free(a))
	require.NoError(t, al.Free(c))
	require.NoError(t, al.Check())
	st := al.Stats()
	require.Equal(t, g, st.LargestFree, "everything coalesced into one free block")
	require.Zero(t, st.Allocated)
	require.Equal(t, uint64(300+100+100), st.PeakAllocated)
}

// TestSmallAndLargeApart: requests of at most half a chunk share chunks of
// their own; larger ones never land in those chunks.
func TestSmallAndLargeApart(t *testing.T) { onEveryDriver(t, smallAndLargeApart) }

func smallAndLargeApart(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	s1, err := al.Alloc(g/2, 0)
	require.NoError(t, err)
	l1, err := al.Alloc(g/2+1, 0)
	require.NoError(t, err)
	s2, err := al.Alloc(1000, 0)
	require.NoError(t, err)
	rs := al.Ranges()
	require.True(t, rs[small].Contains(s1) && rs[small].Contains(s2))
	require.True(t, rs[large].Contains(l1))
	require.Equal(t, 2*g, al.Stats().Committed, "one chunk for the small pieces, one for the large")
	for _, p := range []uint64{uint64(s1), uint64(l1), uint64(s2)} {
		require.NoError(t, al.Free(driver.Addr(p)))
	}
	require.NoError(t, al.Check())
}

// TestOneSmallAllocationOneChunk: growing ahead scales with the live set,
// from one chunk: a lone 4 KiB allocation commits one chunk, not a step of
// several.
func TestOneSmallAllocationOneChunk(t *testing.T) { onEveryDriver(t, oneSmallAllocationOneChunk) }

func oneSmallAllocationOneChunk(t *testing.T, d backend) {
	e := d.env(t, 64*g)
	al := e.fine(t, 64*g, PolicyDefault)
	p, err := al.Alloc(4*units.KiB, 0)
	require.NoError(t, err)
	require.Equal(t, g, al.Stats().Committed)
	require.Equal(t, 1, al.Stats().MapEvents)
	require.NoError(t, al.Free(p))
}

// TestDecommitAnywhere: wholly free chunks in the middle of the allocator go
// back (Trim), the live ones around them keep their bytes, and a block that
// spans given-back chunks is committed again when handed out.
func TestDecommitAnywhere(t *testing.T) { onEveryDriver(t, decommitAnywhere) }

func decommitAnywhere(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	var ps []driver.Addr
	for i := range 6 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		e.setByte(t, al, p, 0, byte(i+1))
		ps = append(ps, p)
	}
	require.Equal(t, 6*g, al.Stats().Committed)
	require.NoError(t, al.Free(ps[1]))
	require.NoError(t, al.Free(ps[2]))
	require.NoError(t, al.Free(ps[4]))
	require.Equal(t, 6*g, al.Stats().Committed, "free keeps the memory")
	require.NoError(t, al.Trim())
	st := al.Stats()
	require.Equal(t, 3*g, st.Committed, "three chunks back from the middle, none from a tail")
	require.Equal(t, 3*g, e.used(t, 0))
	require.Equal(t, 3*g, st.DecommittedBytes)
	require.Equal(t, 2, st.UnmapEvents, "two runs: chunks 1-2 and chunk 4")
	for _, i := range []int{0, 3, 5} {
		require.Equal(t, byte(i+1), e.byteAt(t, al, ps[i], 0), "live allocation %d kept its byte", i)
	}
	p, err := al.Alloc(2*g, 0)
	require.NoError(t, err)
	require.Equal(t, ps[1], p, "the lowest place that needs no more memory than any other: where chunks 1-2 were")
	require.Equal(t, 5*g, al.Stats().Committed)
	e.setByte(t, al, p, 2*g-1, 9) // every byte of it is mapped and writable
	require.NoError(t, al.Check())
	for _, q := range []driver.Addr{ps[0], ps[3], ps[5], p} {
		require.NoError(t, al.Free(q))
	}
	require.NoError(t, al.Trim())
	require.Zero(t, al.Stats().Committed)
	require.Zero(t, e.used(t, 0))
}

// TestReleaseThreshold: when the allocator must commit more, it first gives
// back free chunks so that no more than the threshold stays committed
// beyond the live set; without one it keeps at most a chunk or 1/256.
func TestReleaseThreshold(t *testing.T) { onEveryDriver(t, releaseThreshold) }

func releaseThreshold(t *testing.T, d backend) {
	e := d.env(t, 32*g)
	al := e.fine(t, 32*g, PolicyDefault, func(o *AllocatorOptions) { o.ReleaseThreshold = 2 * g; o.NoStitch = true })
	var ps []driver.Addr
	for range 8 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	require.Equal(t, 9*g, al.Stats().Committed, "8 chunks and one ahead of need: 4 live, 5 free, kept until more is needed")
	before := al.Stats()
	p, err := al.Alloc(3*g, 0) // fits no free block: 3 chunks more
	require.NoError(t, err)
	st := al.Stats()
	held := 7 * g
	require.LessOrEqual(t, st.Committed, held+2*g, "within the threshold of the live set")
	require.Equal(t, 9*g, st.Committed, "two of the four free chunks moved beside the free tail: nothing created, nothing given back")
	require.Equal(t, before.Creates, st.Creates)
	require.Zero(t, st.DecommittedBytes)
	require.Equal(t, 1, st.Relocations)
	require.Equal(t, 2*g, st.RelocatedBytes)
	require.NoError(t, al.Check())

	al.SetReleaseThreshold(NoRelease)
	q, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.Zero(t, al.Stats().DecommittedBytes, "NoRelease gives nothing back to grow")
	require.Equal(t, 2, al.Stats().Relocations, "the last two free chunks moved too")
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Free(q))
	require.NoError(t, al.Check())
}

// TestFullDeviceRelocates: the device is full and the request fits no free
// block, but free chunks sit committed elsewhere in the allocator: they
// move to where the request goes — no memory needed — and a request that
// neither moving nor the device can serve is refused, nothing live
// changed.
func TestFullDeviceRelocates(t *testing.T) { onEveryDriver(t, fullDeviceRelocates) }

func fullDeviceRelocates(t *testing.T, d backend) {
	e := d.env(t, 10*g)
	al := e.fine(t, 10*g, PolicyDefault, func(o *AllocatorOptions) { o.ReleaseThreshold = NoRelease; o.NoStitch = true })
	var ps []driver.Addr
	for range 10 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 0; i < 10; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	// Five free chunks, none adjacent; the device is full. A request of 4
	// needs four contiguous chunks: four of the free ones move.
	before := al.Stats()
	p, err := al.Alloc(4*g, 0)
	require.NoError(t, err)
	st := al.Stats()
	require.Zero(t, st.OOMRetries)
	require.Equal(t, before.Relocations+1, st.Relocations)
	require.Equal(t, 4*g, st.RelocatedBytes)
	require.Equal(t, before.Creates, st.Creates)
	require.Equal(t, 10*g, st.Committed)
	require.NoError(t, al.Check())
	before = al.Stats()
	_, err = al.Alloc(2*g, 0)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "alloc 128 KiB")
	after := al.Stats()
	require.Equal(t, before.Live, after.Live)
	require.Equal(t, before.Allocated, after.Allocated)
	require.Equal(t, before.Committed, after.Committed)
	require.NoError(t, al.Check())
	require.NoError(t, al.Free(p))
	for i := 1; i < 10; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
}

// TestOutOfMemoryRetry: the device cannot hold a grow while a free chunk
// too large to move sits committed elsewhere in the allocator (a large
// allocation's, freed whole); the allocator gives it back and retries
// before reporting out of memory — as PyTorch does — and reports it only
// when that is not enough either, with nothing live changed.
func TestOutOfMemoryRetry(t *testing.T) { onEveryDriver(t, outOfMemoryRetry) }

func outOfMemoryRetry(t *testing.T, d backend) {
	e := d.env(t, 4*g)
	al := e.fine(t, 4*g, PolicyDefault, func(o *AllocatorOptions) { o.ReleaseThreshold = NoRelease })
	a, err := al.Alloc(3*g, 0) // one chunk of three, and one ahead
	require.NoError(t, err)
	b, err := al.Alloc(g, 0) // in the chunk ahead
	require.NoError(t, err)
	require.Equal(t, 4*g, al.Stats().Committed)
	require.NoError(t, al.Free(a))
	// The device is full; a small request needs a chunk of its own heap,
	// and the free one is too large to move there.
	p, err := al.Alloc(100, 0)
	require.NoError(t, err)
	st := al.Stats()
	require.Equal(t, 1, st.OOMRetries)
	require.Equal(t, 2*g, st.Committed)
	require.Equal(t, 3*g, st.DecommittedBytes)
	require.NoError(t, al.Check())
	before := al.Stats()
	_, err = al.Alloc(3*g, 0)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "alloc 192 KiB")
	after := al.Stats()
	require.Equal(t, before.Live, after.Live)
	require.Equal(t, before.Allocated, after.Allocated)
	require.NoError(t, al.Check())
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Free(b))
}

// TestRelocate: no free block fits and committing more would pass the
// budget, but whole free chunks elsewhere hold the request: they are
// unmapped where they lie and mapped side by side where the request goes
// — no new memory, no copy, one map event — and the bytes they held come
// with them.
func TestRelocate(t *testing.T) { onEveryDriver(t, relocateChunks) }

func relocateChunks(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault, strict)
	var ps []driver.Addr
	for i := range 7 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		e.setByte(t, al, p, 0, byte(0xB0+i))
		ps = append(ps, p)
	}
	for i := 0; i < 6; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	before := al.Stats()
	require.Equal(t, g, before.LargestFree, "fragmented: three single free chunks")

	big, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	after := al.Stats()
	require.Equal(t, before.Relocations+1, after.Relocations)
	require.Zero(t, after.Stitches)
	require.Equal(t, before.Committed, after.Committed, "no new memory")
	require.Equal(t, before.Creates, after.Creates, "nothing created")
	require.Equal(t, before.Releases, after.Releases, "nothing released")
	require.Equal(t, before.MapEvents+1, after.MapEvents, "one contiguous range mapped")
	require.Equal(t, before.ChunkMaps+3, after.ChunkMaps, "of three chunks")
	require.Equal(t, before.ChunkUnmaps+3, after.ChunkUnmaps, "unmapped where they were")
	require.Equal(t, before.Grants+1, after.Grants, "granted in one call")
	require.True(t, al.Ranges()[1].Contains(big), "served from the large heap, not the stitch range")
	require.NoError(t, al.Check())
	if e.hostMapped() {
		var seen []byte
		for k := uint64(0); k < 3; k++ {
			seen = append(seen, e.byteAt(t, al, big, k*g))
		}
		sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
		require.Equal(t, []byte{0xB0, 0xB2, 0xB4}, seen, "the chunks moved, with what they held")
	}
	for _, p := range []driver.Addr{big, ps[1], ps[3], ps[5], ps[6]} {
		require.NoError(t, al.Free(p))
	}
	require.NoError(t, al.Trim())
	require.Zero(t, al.Stats().Committed)
}

// TestStitch: no free block fits, committing more would pass the budget,
// and the allocator's address space is all committed — no hole to move
// free chunks to — but whole free chunks hold the request: they are
// mapped side by side in the stitch range — no copy, no new memory, one
// map event — and the bytes written there are the chunks' own bytes.
func TestStitch(t *testing.T) { onEveryDriver(t, stitch) }

func stitch(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 8*g, PolicyDefault, strict, full(8))
	var ps []driver.Addr
	for range 8 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	before := al.Stats()
	require.Equal(t, g, before.LargestFree, "fragmented: four single free chunks")

	big, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	after := al.Stats()
	require.Equal(t, before.Stitches+1, after.Stitches)
	require.Equal(t, before.Committed, after.Committed, "no new memory")
	require.Equal(t, before.Grows, after.Grows, "no growth")
	require.Equal(t, before.MapEvents+1, after.MapEvents, "one contiguous range mapped")
	require.Equal(t, before.ChunkMaps+3, after.ChunkMaps, "of three chunks")
	rs := al.Ranges()
	require.True(t, rs[2].Contains(big), "served from the stitch range")
	require.NoError(t, al.Check())

	// Write through the stitched range; the lent chunks hold the bytes.
	n, err := al.Size(big)
	require.NoError(t, err)
	require.Equal(t, 3*g, n)
	for k := uint64(0); k < 3; k++ {
		e.setByte(t, al, big, k*g, byte(0xA0+k))
	}
	var seen []byte
	for i := 0; i < 8; i += 2 {
		seen = append(seen, e.peek(t, ps[i], 1)[0])
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	require.Equal(t, []byte{0, 0xA0, 0xA1, 0xA2}, seen, "three lent chunks hold the stitched bytes; one was not needed")

	drivertest.RequireIs(t, al.Free(big+driver.Addr(g)), driver.ErrNotAllocated, "inside the stitched allocation")
	lent := 0
	for i := 0; i < 8; i += 2 {
		err := al.Free(ps[i])
		drivertest.RequireIs(t, err, driver.ErrNotAllocated, "free")
		if strings.Contains(err.Error(), "lent to a stitched allocation") {
			lent++
		}
	}
	require.Equal(t, 3, lent, "three of the four freed chunks are lent to the stitch")
	require.NoError(t, al.Free(big))
	st := al.Stats()
	require.Equal(t, before.UnmapEvents+1, st.UnmapEvents)
	require.Equal(t, before.LargestFree, st.LargestFree, "the chunks are free again")
	require.NoError(t, al.Check())
	drivertest.RequireIs(t, al.Free(big), driver.ErrNotAllocated, "freed twice")
	require.NoError(t, al.Trim(), "no stitch pins a chunk any more")
	require.Equal(t, 4*g, al.Stats().Committed)
}

// TestSplit: a request that would cover a large free chunk in part — one
// allocation's chunk, freed whole — gets chunks of its own instead: the
// large chunk goes back, so no smaller neighbour can strand it, and room
// for one more request like it stays committed after it.
func TestSplit(t *testing.T) { onEveryDriver(t, split) }

func split(t *testing.T, d backend) {
	e := d.env(t, 32*g)
	al := e.fine(t, 32*g, PolicyDefault, strict)
	a, err := al.Alloc(12*g, 0)
	require.NoError(t, err)
	b, err := al.Alloc(g, 0)
	require.NoError(t, err)
	st := al.Stats()
	require.Equal(t, 13*g, st.Committed)
	require.Equal(t, 2, st.Creates, "one chunk each")
	require.NoError(t, al.Free(a))
	p, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.Equal(t, a, p, "where the free chunk was")
	after := al.Stats()
	require.Equal(t, 1, after.Splits)
	require.Equal(t, st.Releases+1, after.Releases, "the large chunk went back")
	require.Equal(t, 7*g, after.Committed, "its own three chunks and room for three more, beside the one live")
	e.setByte(t, al, p, 3*g-1, 7) // every byte of it is mapped and writable
	q, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.Equal(t, p+driver.Addr(3*g), q, "the next like it packs after it")
	require.Equal(t, 7*g, al.Stats().Committed)
	require.NoError(t, al.Check())
	for _, x := range []driver.Addr{p, q, b} {
		require.NoError(t, al.Free(x))
	}
}

// TestStrand: with room in the slack, a request that would cover a large
// free chunk in part strands it instead of splitting it — no driver call,
// the chunk stays committed and serves what comes after — and once the
// stranded chunks would pass the slack, the next splits. A stranded chunk
// wholly free again can go back.
func TestStrand(t *testing.T) { onEveryDriver(t, strand) }

func strand(t *testing.T, d backend) {
	e := d.env(t, 64*g)
	al := e.fine(t, 64*g, PolicyDefault, func(o *AllocatorOptions) { o.ReleaseThreshold = 16 * g })
	a, err := al.Alloc(12*g, 0)
	require.NoError(t, err)
	b, err := al.Alloc(g, 0)
	require.NoError(t, err)
	// What the commits put ahead of need is taken, so that a's chunk is
	// the only free memory once a is freed.
	fill := []driver.Addr{b}
	for n := 0; al.Stats().LargestFree > 0; n++ {
		require.Less(t, n, 64)
		x, err := al.Alloc(al.Stats().LargestFree, 0)
		require.NoError(t, err)
		fill = append(fill, x)
	}
	require.NoError(t, al.Free(a))
	st := al.Stats()
	require.Equal(t, 12*g, st.LargestFree)
	p, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.True(t, p >= a && p+driver.Addr(3*g) <= a+driver.Addr(12*g), "in the free chunk")
	after := al.Stats()
	require.Zero(t, after.Splits)
	require.Equal(t, st.Creates, after.Creates, "no driver call")
	require.Equal(t, st.Releases, after.Releases)
	require.Equal(t, st.Committed, after.Committed)
	require.Positive(t, al.nstrands, "the chunks it covers in part are stranded")
	require.LessOrEqual(t, al.stranded, 16*g, "within the slack")
	stranded := al.stranded
	e.setByte(t, al, p, 3*g-1, 7)
	q, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.True(t, q >= a && q+driver.Addr(3*g) <= a+driver.Addr(12*g), "the next like it goes in the stranded chunk's free rest")
	require.LessOrEqual(t, al.stranded, 16*g, "within the slack")
	require.GreaterOrEqual(t, al.stranded, stranded)
	require.Equal(t, st.Creates, al.Stats().Creates)
	require.NoError(t, al.Check())

	// More requests never strand past the slack of 16 chunks: past it
	// they split.
	var more []driver.Addr
	for range 8 {
		x, err := al.Alloc(5*g, 0)
		require.NoError(t, err)
		more = append(more, x)
		require.LessOrEqual(t, al.stranded, 16*g)
		require.NoError(t, al.Check())
	}

	// Freed, the stranded chunks are whole and free again: they can go
	// back.
	for _, x := range append(append(more, p, q), fill...) {
		require.NoError(t, al.Free(x))
	}
	require.Zero(t, al.nstrands)
	require.Zero(t, al.stranded)
	require.NoError(t, al.Trim())
	require.NoError(t, al.Check())
	require.Zero(t, al.Stats().Committed)
}

// TestFreeTailAndChunksRegression: the old allocator's hybrid stitch
// computed "need := n - have" with n below have (an Alloc of 4352 KiB with
// a 4608 KiB free tail asked to grow by 2^64 - 256 KiB and left the arena
// grown). The same layout now serves the request and keeps its books.
func TestFreeTailAndChunksRegression(t *testing.T) { onEveryDriver(t, freeTailAndChunksRegression) }

func freeTailAndChunksRegression(t *testing.T, d backend) {
	e := d.env(t, 256*g)
	al := e.fine(t, 256*g, PolicyDefault, strict)
	var ps []driver.Addr
	for range 6 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	tail, err := al.Alloc(72*g, 0) // 4608 KiB, then freed: a free tail
	require.NoError(t, err)
	require.NoError(t, al.Free(tail))
	require.NoError(t, al.Free(ps[1]))
	require.NoError(t, al.Free(ps[3]))
	before := al.Stats()
	p, err := al.Alloc(68*g, 0) // 4352 KiB
	require.NoError(t, err)
	after := al.Stats()
	require.Equal(t, before.Committed, after.Committed, "the free tail holds it: nothing committed")
	require.NoError(t, al.Check())
	require.NoError(t, al.Free(p))
}

// TestAllocatorBadInput: each refusal checks its sentinel and that the
// allocator — its figures, its live allocations, its invariants — is as it
// was.
func TestAllocatorBadInput(t *testing.T) { onEveryDriver(t, allocatorBadInput) }

func allocatorBadInput(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	for _, c := range []struct {
		name     string
		opts     AllocatorOptions
		sentinel error
		mentions string
	}{
		{"unknown device", AllocatorOptions{Device: 4, Max: g, ChunkSize: g}, driver.ErrNoDevice, "device 4"},
		{"max below a chunk", AllocatorOptions{Max: g / 2, ChunkSize: g}, driver.ErrInvalid, "below the chunk size"},
		{"default chunk above max", AllocatorOptions{Max: g}, driver.ErrInvalid, "below the chunk size"},
		{"address space below max", AllocatorOptions{Max: 4 * g, AddressSpace: 2 * g, ChunkSize: g}, driver.ErrInvalid, "smaller than Max"},
		{"policy", AllocatorOptions{Max: 4 * g, ChunkSize: g, Policy: 7}, driver.ErrInvalid, "policy"},
		{"odd chunk", AllocatorOptions{Max: 4 * g, ChunkSize: g + 4096}, driver.ErrMisaligned, ""},
	} {
		_, err := NewAllocator(e.space, e.mem, c.opts)
		drivertest.RequireIs(t, err, c.sentinel, c.mentions)
	}
	require.Empty(t, e.space.Reservations(), "failed NewAllocator reserved nothing")

	al := e.fine(t, 12*g, PolicyDefault)
	live, err := al.Alloc(1000, 0)
	require.NoError(t, err)
	other, err := al.Alloc(100, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(other))
	big, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	hog, err := e.mem.Create(0, 10*g, driver.ChunkOptions{}) // leaves the device 2 granules
	require.NoError(t, err)
	defer hog.Release()
	state := func() (AllocStats, uint64) {
		require.NoError(t, al.Check())
		n, err := al.Size(live)
		require.NoError(t, err)
		return al.Stats(), n
	}
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"zero size", func() error { _, err := al.Alloc(0, 0); return err }, driver.ErrInvalid, "zero"},
		{"alignment not a power of two", func() error { _, err := al.Alloc(10, 48); return err }, driver.ErrInvalid, "power of two"},
		{"larger than the maximum", func() error { _, err := al.Alloc(13*g, 0); return err }, driver.ErrOutOfMemory, "maximum"},
		{"size near 2^64", func() error { _, err := al.Alloc(^uint64(0)-10, 0); return err }, driver.ErrOutOfMemory, "maximum"},
		{"alignment above the maximum", func() error { _, err := al.Alloc(1, 1<<40); return err }, driver.ErrOutOfMemory, "maximum"},
		{"past the maximum with what is live", func() error { _, err := al.Alloc(10*g, 0); return err }, driver.ErrOutOfMemory, "maximum 768 KiB"},
		{"out of device memory", func() error { _, err := al.Alloc(6*g, 0); return err }, driver.ErrOutOfMemory, "out of memory"},
		{"double free", func() error { return al.Free(other) }, driver.ErrNotAllocated, "freed twice"},
		{"interior pointer", func() error { return al.Free(live + 256) }, driver.ErrNotAllocated, "inside the allocation"},
		{"interior of a large one", func() error { return al.Free(big + driver.Addr(g)) }, driver.ErrNotAllocated, "inside the allocation"},
		{"foreign pointer", func() error { return al.Free(0x1000) }, driver.ErrNotAllocated, "not in this allocator's memory"},
		{"size of a freed pointer", func() error { _, err := al.Size(other); return err }, driver.ErrNotAllocated, ""},
		{"bytes of a freed pointer", func() error { _, err := al.Bytes(other); return err }, driver.ErrNotAllocated, ""},
		{"export from a non-shareable allocator", func() error { _, err := al.Export(live); return err }, driver.ErrInvalid, "not shareable"},
		{"set access of an unknown device", func() error { return al.SetAccess(6, driver.AccessRead) }, driver.ErrNoDevice, ""},
		{"set access to no access value", func() error { return al.SetAccess(0, driver.Access(2)) }, driver.ErrInvalid, "access value 2 is not"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s0, n0 := state()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			s1, n1 := state()
			require.Equal(t, s0.Live, s1.Live)
			require.Equal(t, s0.Allocated, s1.Allocated)
			require.Equal(t, n0, n1)
			if !strings.Contains(c.name, "memory") {
				require.Equal(t, s0, s1)
			}
		})
	}
	// The refusals a newcomer meets first say what to do.
	for hint, err := range map[string]error{
		"free each allocation once":                      al.Free(other),
		"with the allocator whose Alloc returned it":     al.Free(0x1000),
		"release the tensors that hold theirs":           al.Close(),
		"free allocations, or create the allocator with": func() error { _, err := al.Alloc(10*g, 0); return err }(),
	} {
		require.Contains(t, errors.FlattenHints(err), hint)
	}
	s0, n0 := state()
	drivertest.RequireIs(t, al.Close(), driver.ErrBusy, "2 allocation(s) still live")
	s1, n1 := state()
	require.Equal(t, s0, s1)
	require.Equal(t, n0, n1)
	require.NoError(t, al.Free(live))
	require.NoError(t, al.Free(big))
	require.NoError(t, al.Close())
	for _, call := range []func() error{
		func() error { _, err := al.Alloc(1, 0); return err }, func() error { return al.Free(live) },
		al.Trim, al.Close, func() error { _, err := al.Size(live); return err },
		func() error { return al.SetAccess(1, driver.AccessRead) }, func() error { _, err := al.Export(live); return err },
	} {
		drivertest.RequireIs(t, call(), driver.ErrClosed, "closed allocator")
	}
}

// TestSetAccessRollsBack: when one of the allocator's ranges refuses a
// grant, the ranges already changed are set back (the old allocator left
// its stitches changed).
func TestSetAccessRollsBack(t *testing.T) { onEveryDriver(t, setAccessRollsBack) }

func setAccessRollsBack(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al := e.fine(t, 8*g, PolicyDefault)
	p, err := al.Alloc(2*g, 0)
	require.NoError(t, err)
	q, err := al.Alloc(100, 0)
	require.NoError(t, err)
	require.NoError(t, al.st.Close()) // the last range refuses from now on
	drivertest.RequireIs(t, al.SetAccess(1, driver.AccessRead), driver.ErrClosed)
	for _, h := range al.heaps {
		require.Equal(t, driver.AccessNone, h.s.Access(1))
		for _, ext := range h.s.Layout() {
			acc, err := h.s.AccessAt(1, ext.Offset)
			require.NoError(t, err)
			require.Equal(t, driver.AccessNone, acc, "granted and set back")
		}
	}
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Free(q))
	// The stitch range is gone, so Close would refuse: close the rest here.
	for _, h := range al.distinct() {
		require.NoError(t, h.s.Close())
	}
	al.closed = true
}

// TestAllocatorOwnsItsRanges: nothing the allocator exposes hands out an
// object through which a caller could grow, shrink, decommit, close or
// place anything in its memory (the old Allocator.Arena did).
func TestAllocatorOwnsItsRanges(t *testing.T) {
	forbidden := []string{"*arena.Sparse", "*arena.Arena", "*arena.View", "*mapping.Table", "*physical.Chunk", "*physical.Memory", "*vaspace.Reservation"}
	typ := reflect.TypeOf(&Allocator{})
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		for o := range m.Type.NumOut() {
			out := m.Type.Out(o).String()
			for _, f := range forbidden {
				require.NotContains(t, out, strings.TrimPrefix(f, "*"), "Allocator.%s returns %s", m.Name, out)
			}
		}
	}
	for _, ex := range []any{Exported{}, SharedChunk{}, AllocStats{}} {
		et := reflect.TypeOf(ex)
		for i := range et.NumField() {
			for _, f := range forbidden {
				require.NotEqual(t, f, et.Field(i).Type.String(), "%s.%s", et.Name(), et.Field(i).Name)
			}
		}
	}
}

// TestAllocatorModel: random alloc/free/trim/threshold sequences against a
// model of the live allocations. After every step: no two live
// allocations overlap, each has its policy alignment, each still holds the
// bytes written at its ends (so every live byte checked is mapped and
// accessible), the figures match the model, committed memory stays within
// Max and matches the device's usage, and the invariants hold.
func TestAllocatorModel(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		var stitches, decommits, relocations, splits, strands int
		for seed := range uint64(d.Seeds(10)) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				r := runAllocatorModel(t, d, arenaOps(rand.New(rand.NewPCG(seed, 11)), 300))
				require.Greater(t, r.allocs, 30, "successful allocations")
				stitches += r.stitches
				decommits += r.decommits
				relocations += r.relocations
				splits += r.splits
				strands += r.strands
			})
		}
		// Stitching is the fallback when no hole has room (TestStitch,
		// TestMemoryMap and the fault sweeps reach it); the sequences
		// count it where they reach it.
		t.Logf("stitched %d, moved free chunks %d times, split %d chunks, stranded %d", stitches, relocations, splits, strands)
		require.Positive(t, relocations, "the sequences move free chunks")
		require.Positive(t, splits, "the sequences split large free chunks")
		require.Positive(t, strands, "the sequences strand large free chunks")
		require.Greater(t, decommits, 10, "the sequences give memory back")
	})
}

// TestAllocatorModelFewChunks runs the allocator model with chunks of
// 4g on a machine of few of them, where moving a free chunk to the
// request can fill its hole whole: the request is then served in the
// free block the move made, not refused by a planner that finds no hole.
func TestAllocatorModelFewChunks(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		relocations := 0
		for seed := range uint64(d.Seeds(10)) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				data := arenaOps(rand.New(rand.NewPCG(seed, 11)), 300)
				data[0] = data[0]&0x9f | 0x60
				r := runAllocatorModel(t, d, data)
				require.Greater(t, r.allocs, 30, "successful allocations")
				relocations += r.relocations
			})
		}
		require.Positive(t, relocations, "the sequences move free chunks")
	})
}

type allocRun struct{ allocs, stitches, decommits, relocations, splits, strands, binned, bins int }

// TestAllocatorModelBins runs the allocator model where small requests
// are served from bins (the default policy, chunks of four bins or more):
// random allocs and frees of small sizes among the rest, compared with the
// model after each step, with Check verifying the bins' books.
func TestAllocatorModelBins(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		var binned, bins int
		for seed := range uint64(d.Seeds(10)) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				data := arenaOps(rand.New(rand.NewPCG(seed, 12)), 300)
				data[0] = 0x42 + 3*(data[0]%20) // the default policy, chunks of 4g, not full
				for i := 1; i+3 <= len(data); i += 3 {
					if data[i]%9 < 3 {
						data[i+2] %= 16 // a small alloc: at most 4 KiB, most of them binned
					}
				}
				r := runAllocatorModel(t, d, data)
				binned = max(binned, r.binned)
				bins += r.bins
			})
		}
		t.Logf("at most %d allocations in bins at once; bins live at %d steps", binned, bins)
		require.Greater(t, binned, 10, "the sequences allocate from bins")
	})
}

func runAllocatorModel(t *testing.T, d backend, data []byte) allocRun {
	// Chunks of 4g (when data[0] says so), where small requests of the
	// default policy are served from bins, on a machine of as many chunks
	// or (0x20 too) on the same machine, where five chunks fill Max and
	// two the full allocator's address space: few holes, each a chunk.
	cs, scale := uint64(g), uint64(1)
	if len(data) > 0 && data[0]&0x40 != 0 {
		cs, scale = 4*g, 4
		if data[0]&0x20 != 0 {
			scale = 1
		}
	}
	e := d.env(t, 24*g*scale)
	policy, threshold := Policy(0), uint64(0)
	if len(data) > 0 {
		policy = Policy(data[0] % 3)
		threshold = []uint64{0, 1, 3 * g, NoRelease}[data[0]/3%4]
	}
	full := len(data) > 0 && data[0]&0x80 != 0
	al := e.fine(t, 20*g*scale, policy, func(o *AllocatorOptions) {
		o.ReleaseThreshold, o.ChunkSize = threshold, cs
		if full {
			// A small allocator with no more address space than memory,
			// all of it committed at once and kept: no hole ever has room,
			// and a request no free block fits is stitched.
			o.Max, o.AddressSpace, o.ReleaseThreshold = 8*g*scale, 8*g*scale, NoRelease
		}
	})
	type live struct {
		size uint64
		tag  byte
	}
	model := map[driver.Addr]live{}
	var allocated, peak uint64
	var r allocRun
	for i := 1; i+3 <= len(data) && i < 3*250; i += 3 {
		op, x, y := data[i]%9, uint64(data[i+1]), uint64(data[i+2])
		step := fmt.Sprintf("step %d: op %d", i/3, op)
		switch {
		case op < 4: // alloc: mostly small, sometimes chunk-sized or larger
			size := x*y + 1
			if op == 3 {
				size = (x%4 + 1) * g / uint64(1+y%2)
			}
			align := uint64(0)
			if y%7 == 0 {
				align = 1 << (8 + x%5)
			}
			p, err := al.Alloc(size, align)
			if err != nil {
				requireStep(t, err, driver.ErrOutOfMemory, step)
				if !full && allocated+size+uint64(len(model)+1)*8*units.KiB <= al.Max() {
					// Refused with room for the live set under Max: every free
					// chunk, kept for reuse or not, went back first.
					before := al.Stats().Committed
					require.NoError(t, al.Trim(), step)
					require.Equal(t, before, al.Stats().Committed, "%s: refused while free chunks were kept", step)
				}
				break
			}
			q := max(align, policy.Quantum())
			require.Zero(t, uint64(p)%q, "%s: alignment %d", step, q)
			tag := byte(i)
			e.setByte(t, al, p, 0, tag)
			e.setByte(t, al, p, size-1, tag)
			model[p] = live{size, tag}
			allocated += size
			peak = max(peak, allocated)
			r.allocs++
		case op < 7: // free one
			if len(model) == 0 {
				break
			}
			keys := make([]driver.Addr, 0, len(model))
			for p := range model {
				keys = append(keys, p)
			}
			sort.Slice(keys, func(a, b int) bool { return keys[a] < keys[b] })
			p := keys[int(x)%len(keys)]
			require.NoError(t, al.Free(p), step)
			allocated -= model[p].size
			delete(model, p)
		case op >= 7 && full:
			// Nothing given back: the range stays all committed.
		case op == 7:
			if x%2 == 0 {
				require.NoError(t, al.Trim(), step)
			} else {
				keep := (x % 8) * g
				require.NoError(t, al.TrimTo(keep), step)
				// Whatever stays above keep is behind live memory: a
				// further Trim can give back nothing below what is live.
			}
		default:
			al.SetReleaseThreshold([]uint64{0, 1, 2 * g, NoRelease}[x%4])
		}
		// Compare.
		st := al.Stats()
		require.Equal(t, allocated, st.Allocated, step)
		require.Equal(t, peak, st.PeakAllocated, step)
		require.Equal(t, len(model), st.Live, step)
		require.LessOrEqual(t, st.Committed, al.Max(), step)
		require.Equal(t, st.Committed, e.used(t, 0), "%s: committed is what the device holds", step)
		type iv struct{ lo, hi driver.Addr }
		var ivs []iv
		for p, l := range model {
			n, err := al.Size(p)
			require.NoError(t, err)
			require.Equal(t, l.size, n)
			require.Equal(t, l.tag, e.byteAt(t, al, p, 0), "%s: first byte of %s", step, p)
			require.Equal(t, l.tag, e.byteAt(t, al, p, n-1), "%s: last byte of %s", step, p)
			ivs = append(ivs, iv{p, p + driver.Addr(l.size)})
		}
		sort.Slice(ivs, func(a, b int) bool { return ivs[a].lo < ivs[b].lo })
		for k := 1; k < len(ivs); k++ {
			require.LessOrEqual(t, ivs[k-1].hi, ivs[k].lo, "%s: live allocations overlap", step)
		}
		require.NoError(t, al.Check(), step)
		r.stitches, r.decommits, r.relocations, r.splits, r.strands = st.Stitches, st.Decommits, st.Relocations, st.Splits, st.Strands
		if bs := &al.heaps[small].bins; bs.on {
			r.binned = max(r.binned, bs.live)
			if bs.n > 0 {
				r.bins++ // steps with bins live
			}
		}
	}
	for p := range model {
		require.NoError(t, al.Free(p))
	}
	require.NoError(t, al.Trim())
	require.Zero(t, al.Stats().Committed, "Trim with nothing live gives back everything")
	require.NoError(t, al.Check())
	require.NoError(t, al.Close())
	require.Zero(t, e.used(t, 0))
	return r
}

// FuzzAllocatorModel fuzzes the allocator model's operation decoder.
func FuzzAllocatorModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(arenaOps(rand.New(rand.NewPCG(seed, 2)), 60))
	}
	ds := fuzzDrivers(f, 2, 24*g) // runAllocatorModel's machine
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range ds {
			_ = runAllocatorModel(t, d, data)
		}
	})
}

// TestAllocatorConcurrent: goroutines allocating, writing, checking and
// freeing at once, with trims between (run with -race).
func TestAllocatorConcurrent(t *testing.T) { onEveryDriver(t, allocatorConcurrent) }

func allocatorConcurrent(t *testing.T, d backend) {
	e := d.env(t, 256*g)
	al := e.fine(t, 256*g, PolicyDefault)
	// writeAndRead writes v at p's first byte and reads it back (setByte
	// and byteAt, without failing the test from another goroutine).
	writeAndRead := func(p driver.Addr, v byte) (byte, error) {
		if e.hostMapped() {
			b, err := al.Bytes(p)
			if err != nil {
				return 0, err
			}
			b[0] = v
			return b[0], nil
		}
		buf := []byte{v}
		if err := e.drv.Write(p, buf); err != nil {
			return 0, err
		}
		buf[0] = ^v
		err := e.drv.Read(p, buf)
		return buf[0], err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			var mine []driver.Addr
			for range 300 {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					k := rng.IntN(len(mine))
					if err := al.Free(mine[k]); err != nil {
						errs <- err
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
					continue
				}
				p, err := al.Alloc(uint64(rng.IntN(int(2*g))+1), 0)
				if err != nil {
					errs <- err
					return
				}
				got, err := writeAndRead(p, byte(w))
				if err != nil {
					errs <- err
					return
				}
				if got != byte(w) {
					errs <- fmt.Errorf("worker %d lost its byte", w)
					return
				}
				mine = append(mine, p)
			}
			for _, p := range mine {
				if err := al.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			if err := al.Trim(); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, al.Check())
	require.Zero(t, al.Stats().Allocated)
}

// slackDivisor lets TestSyntheticWorkloads sweep the allocator's
// SlackDivisor: go test ./arena -run TestSyntheticWorkloads -v -args
// -slack-divisor 64. The 1% bound is asserted at the default only.
var slackDivisor = flag.Uint64("slack-divisor", 0, "the allocator's SlackDivisor for TestSyntheticWorkloads (0: its default)")

// TestSyntheticWorkloads: the policy holds on workloads no trace fixed —
// training steps, a growing KV cache, random sizes from 512 B to 4 GiB, and
// random sizes that keep the device all but full — at 2 MiB granularity:
// peak committed within 1% of peak allocated, and never out of memory
// while the live set fits the device. (Figures, not timings: the sim
// driver makes them exact and repeatable.)
func TestSyntheticWorkloads(t *testing.T) {
	if testing.Short() || race.Enabled || invariants.Enabled {
		t.Skip("replays about 400,000 allocator calls on one goroutine, where the race detector finds nothing and takes 40 times as long: scripts/test runs it without -race")
	}
	ws := syntheticWorkloads()
	for seed := uint64(1); seed <= 2; seed++ {
		w := randomWorkload(seed, 2000, 4*units.GiB, 79*units.GiB)
		w.name = fmt.Sprintf("near-full/%d", seed)
		ws = append(ws, w)
	}
	for _, w := range ws {
		t.Run(w.name, func(t *testing.T) {
			r, err := runWorkload(w, AllocatorOptions{SlackDivisor: *slackDivisor}, 0)
			require.NoError(t, err)
			pt, ptCalls, ok := cachingRatio(w, 80*units.GiB)
			c := r.calls
			t.Logf("%-14s %7d events  peak allocated %8.2f MiB  ratio %.4f (PyTorch's caching allocator, modelled: %s)  map events %5d  unmap events %5d  stitches %4d  OOM retries %d  splits %4d  strands %4d  driver calls create/map/set access/unmap/release %d/%d/%d/%d/%d  modelled %.1f ms (A100) %.1f ms (H100); the caching allocator's %d/%d/%d/%d/%d, %.1f ms (A100) %.1f ms (H100)",
				w.name, len(w.events), float64(r.peakAllocated)/float64(units.MiB), r.ratio(), cachingFigure(pt, ok), r.stats.MapEvents, r.stats.UnmapEvents, r.stats.Stitches, r.stats.OOMRetries,
				r.stats.Splits, r.stats.Strands, c.Create, c.Map, c.SetAccess, c.Unmap, c.Release, 1e3*c.Time(sim.A100).Seconds(), 1e3*c.Time(sim.H100).Seconds(),
				ptCalls.Create, ptCalls.Map, ptCalls.SetAccess, ptCalls.Unmap, ptCalls.Release, 1e3*ptCalls.Time(sim.A100).Seconds(), 1e3*ptCalls.Time(sim.H100).Seconds())
			if *slackDivisor != 0 {
				return
			}
			require.LessOrEqual(t, r.ratio(), 1.01)
			if ok {
				require.LessOrEqual(t, r.ratio(), pt, "at most the caching allocator's")
			}
		})
	}
}

// TestRepeatedSteps prints what a training loop pays for each step after
// its first, when every step makes the same allocations in the same order:
// the driver calls of nine steps less those of one, over eight, for this
// allocator and for the model of PyTorch's caching allocator on the same
// events, priced by both tables. The model makes no call after the first
// step (its segments stay); this allocator gives back and creates again
// where a request lands on part of a chunk larger than its ends
// (strand.go), so it pays each step. A figure, not a target: docs/arena.md
// gives it. The ratio is held to 1.01 and to the model's, as everywhere.
func TestRepeatedSteps(t *testing.T) {
	if testing.Short() || race.Enabled || invariants.Enabled {
		t.Skip("a figure of the policy, run once without -race (scripts/test)")
	}
	for seed := uint64(1); seed <= 3; seed++ {
		layers := 24 + 8*int(seed)
		var calls, model [2]sim.Calls
		var ratio, ptRatio [2]float64
		for i, steps := range [2]int{1, 9} {
			w := repeatedTrainingWorkload(seed, layers, steps, 512*units.MiB)
			r, err := runWorkload(w, AllocatorOptions{}, 0)
			require.NoError(t, err)
			pt, ptCalls, ok := cachingRatio(w, 80*units.GiB)
			require.True(t, ok, "the model holds the workload")
			require.LessOrEqual(t, r.ratio(), 1.01)
			require.LessOrEqual(t, r.ratio(), pt, "at most the caching allocator's")
			calls[i], model[i], ratio[i], ptRatio[i] = r.calls, ptCalls, r.ratio(), pt
		}
		step, ptStep := calls[1].Sub(calls[0]), model[1].Sub(model[0])
		require.Zero(t, ptStep.Total(), "the model's segments serve every step after the first")
		per := func(c sim.Calls, costs sim.CallCosts) float64 { return 1e3 * c.Time(costs).Seconds() / 8 }
		t.Logf("training-repeat/%d  ratio %.4f after one step, %.4f after nine (the model's %.4f, %.4f);  first step %.1f ms (A100) %.1f ms (H100), the model's %.1f / %.1f;  each later step: create/map/set access/unmap/release %.1f/%.1f/%.1f/%.1f/%.1f, %.2f ms (A100) %.2f ms (H100), the model's %.2f / %.2f",
			seed, ratio[0], ratio[1], ptRatio[0], ptRatio[1], 1e3*calls[0].Time(sim.A100).Seconds(), 1e3*calls[0].Time(sim.H100).Seconds(), 1e3*model[0].Time(sim.A100).Seconds(), 1e3*model[0].Time(sim.H100).Seconds(),
			float64(step.Create)/8, float64(step.Map)/8, float64(step.SetAccess)/8, float64(step.Unmap)/8, float64(step.Release)/8,
			per(step, sim.A100), per(step, sim.H100), per(ptStep, sim.A100), per(ptStep, sim.H100))
	}
}

// cachingFigure is the model's ratio, or that it ran out of memory.
func cachingFigure(ratio float64, ok bool) string {
	if !ok {
		return "out of memory"
	}
	return fmt.Sprintf("%.4f", ratio)
}

// TestAllocFreePairMakesNoGoAllocations: once its records have grown to
// the live set, an Alloc and a Free that a free block serves make no Go
// heap allocation — the records live in a slab and a flat index, off the
// collector's pointer graph. (The invariants build checks after
// every change, which allocates: skipped there.)
func TestAllocFreePairMakesNoGoAllocations(t *testing.T) {
	if invariants.Enabled {
		t.Skip("the invariants build checks after every change, and checking allocates")
	}
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: units.TiB})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	al, err := NewAllocator(vaspace.New(drv), physical.New(drv), AllocatorOptions{Max: units.TiB})
	require.NoError(t, err)
	t.Cleanup(func() { closeAllocator(t, al) })
	rng := rand.New(rand.NewPCG(5, 6))
	size := func() uint64 { e := 5 + rng.IntN(7); return 1<<e + rng.Uint64N(1<<e) }
	live := make([]driver.Addr, 2000)
	for i := range live {
		live[i], err = al.Alloc(size(), 0)
		require.NoError(t, err)
	}
	pair := func() {
		i := rng.IntN(len(live))
		q, err := al.Alloc(size(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := al.Free(live[i]); err != nil {
			t.Fatal(err)
		}
		live[i] = q
	}
	for range 20000 { // the slab, the index and the committed memory reach their size
		pair()
	}
	// AllocsPerRun divides in integers: 100 pairs a run, so that one
	// allocation in every hundred pairs still counts.
	require.Zero(t, testing.AllocsPerRun(20, func() {
		for range 100 {
			pair()
		}
	}))
}

// TestAlignUpDown: the mask path for powers of two and the division path
// for other sizes (chunk sizes may be any multiple of the granularity)
// agree with the arithmetic, and alignUp saturates at the largest multiple
// instead of wrapping.
func TestAlignUpDown(t *testing.T) {
	const max = ^uint64(0)
	for _, c := range []struct{ x, a, up, down uint64 }{
		{0, 512, 0, 0},
		{1, 512, 512, 0},
		{512, 512, 512, 512},
		{513, 512, 1024, 512},
		{1, 3 << 21, 3 << 21, 0},
		{(3 << 21) + 1, 3 << 21, 6 << 21, 3 << 21},
		{max, 512, max &^ 511, max &^ 511},
		{max - 5, 3, max - 3, max - 6},
		{max - 1, 3 << 21, max / (3 << 21) * (3 << 21), max / (3 << 21) * (3 << 21)},
		{max, 1, max, max},
	} {
		require.Equal(t, c.up, alignUp(c.x, c.a), "alignUp(%d, %d)", c.x, c.a)
		require.Equal(t, c.down, alignDown(c.x, c.a), "alignDown(%d, %d)", c.x, c.a)
	}
}
