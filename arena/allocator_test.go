package arena

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// fine is an allocator whose chunks are one granule each, so stitching has
// whole chunks to work with, and which grows by exactly what it needs.
func (e *env) fine(t testing.TB, max uint64, policy Policy) *Allocator {
	t.Helper()
	al, err := NewAllocator(e.space, e.mem, AllocatorOptions{
		Arena:  Options{Max: max, ChunkSize: g, MaxChunk: g},
		Policy: policy, MinGrow: 1, GrowDivisor: 1 << 62,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = al.Close() })
	return al
}

func TestPolicies(t *testing.T) {
	require.Equal(t, uint64(160), PolicyAscend.Footprint(100), "ALIGN_UP(100,32)+32")
	require.Equal(t, uint64(64), PolicyAscend.Footprint(32))
	require.Equal(t, uint64(256), PolicyDefault.Footprint(1))
	require.Equal(t, uint64(512), PolicyDefault.Footprint(257))
	e := newEnv(t, 16*g)
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

func TestAlignmentAndCoalescing(t *testing.T) {
	e := newEnv(t, 16*g)
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

// TestStitch fragments an arena and then allocates through a stitch: no
// contiguous free range fits, but whole free chunks do; they are mapped side
// by side in a fresh range — no copy, no growth — and the bytes written
// there are the chunks' own bytes.
func TestStitch(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	var ps []driver.Addr
	for i := 0; i < 8; i++ {
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
	require.Equal(t, before.MapCalls+3, after.MapCalls, "three chunks stitched")
	require.False(t, al.Arena().res.Range().Contains(big), "served from the stitch range")
	require.NoError(t, al.Check())

	// Write through the stitched range; read the lent chunks in the arena.
	b, err := al.Bytes(big)
	require.NoError(t, err)
	require.Len(t, b, int(3*g))
	for k := uint64(0); k < 3; k++ {
		b[k*g] = byte(0xA0 + k)
	}
	var seen []byte
	for i := 0; i < 8; i += 2 {
		v, err := al.Arena().View(uint64(ps[i]-al.Arena().Base()), 1)
		require.NoError(t, err)
		vb, err := v.Bytes()
		require.NoError(t, err)
		seen = append(seen, vb[0])
		require.NoError(t, v.Release())
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	require.Equal(t, []byte{0, 0xA0, 0xA1, 0xA2}, seen, "three lent chunks hold the stitched bytes; one was not needed")

	drivertest.RequireIs(t, al.Free(big+driver.Addr(g)), driver.ErrNotAllocated, "inside the stitched allocation")
	drivertest.RequireIs(t, al.Free(ps[0]), driver.ErrNotAllocated, "lent to the stitched allocation")
	require.NoError(t, al.Free(big))
	st := al.Stats()
	require.Equal(t, before.UnmapCalls+3, st.UnmapCalls)
	require.Equal(t, before.LargestFree, st.LargestFree, "the chunks are free in the arena again")
	require.NoError(t, al.Check())
	drivertest.RequireIs(t, al.Free(big), driver.ErrNotAllocated, "freed twice")
}

// TestHybridStitch: whole free chunks cover part of a request; the arena
// grows by the rest as a fresh chunk and all are stitched, committing less
// than growing the tail would.
func TestHybridStitch(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	var ps []driver.Addr
	for i := 0; i < 5; i++ {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	require.NoError(t, al.Free(ps[0]))
	require.NoError(t, al.Free(ps[2]))
	before := al.Stats()
	_, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	after := al.Stats()
	require.Equal(t, before.Stitches+1, after.Stitches)
	require.Equal(t, before.Committed+g, after.Committed, "one new chunk, not three")
	require.NoError(t, al.Check())
}

// TestGrowAheadFallsBack: growing ahead is only a preference; on a nearly
// full device the allocator grows by exactly what it needs.
func TestGrowAheadFallsBack(t *testing.T) {
	e := newEnv(t, 4*g)
	al, err := NewAllocator(e.space, e.mem, AllocatorOptions{Arena: Options{Max: 64 * g, ChunkSize: g}, MinGrow: 16 * g})
	require.NoError(t, err)
	p, err := al.Alloc(3*g, 0)
	require.NoError(t, err)
	require.Equal(t, 3*g, al.Stats().Committed)
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Check())
}

func TestTrim(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 16*g, PolicyDefault)
	a, err := al.Alloc(g, 0)
	require.NoError(t, err)
	b, err := al.Alloc(6*g, 0)
	require.NoError(t, err)
	require.Equal(t, 7*g, al.Stats().Committed)
	require.NoError(t, al.Free(b))
	require.NoError(t, al.Trim())
	require.Equal(t, g, al.Stats().Committed, "the free tail went back")
	require.Equal(t, g, e.used(t, 0))
	require.NoError(t, al.Check())
	_, err = al.Alloc(2*g, 0)
	require.NoError(t, err, "and the arena grows again")
	require.NoError(t, al.Free(a))
	require.NoError(t, al.Check())
}

// TestAllocatorBadInput: each refusal checks its sentinel and that the
// allocator — its figures, its live allocations, its invariants — is as it
// was.
func TestAllocatorBadInput(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 12*g, PolicyDefault)
	live, err := al.Alloc(1000, 0)
	require.NoError(t, err)
	other, err := al.Alloc(100, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(other))
	hog, err := e.mem.Create(0, 10*g, driver.ChunkOptions{}) // leaves the device 5 granules
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
		{"larger than the arena", func() error { _, err := al.Alloc(13*g, 0); return err }, driver.ErrOutOfMemory, "maximum"},
		{"past the arena's maximum", func() error { _, err := al.Alloc(12*g, 0); return err }, driver.ErrOutOfMemory, "maximum"},
		{"out of device memory", func() error { _, err := al.Alloc(8*g, 0); return err }, driver.ErrOutOfMemory, "device 0 had"},
		{"double free", func() error { return al.Free(other) }, driver.ErrNotAllocated, "freed twice"},
		{"interior pointer", func() error { return al.Free(live + 256) }, driver.ErrNotAllocated, "inside the allocation"},
		{"foreign pointer", func() error { return al.Free(0x1000) }, driver.ErrNotAllocated, "not in this allocator's memory"},
		{"size of a freed pointer", func() error { _, err := al.Size(other); return err }, driver.ErrNotAllocated, ""},
		{"bytes of a freed pointer", func() error { _, err := al.Bytes(other); return err }, driver.ErrNotAllocated, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s0, n0 := state()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			s1, n1 := state()
			require.Equal(t, s0, s1)
			require.Equal(t, n0, n1)
		})
	}
	s0, n0 := state()
	drivertest.RequireIs(t, al.Close(), driver.ErrBusy, "1 allocation(s) still live, 1000 B in all")
	s1, n1 := state()
	require.Equal(t, s0, s1)
	require.Equal(t, n0, n1)
	require.NoError(t, al.Free(live))
	require.NoError(t, al.Close())
	for _, call := range []func() error{
		func() error { _, err := al.Alloc(1, 0); return err }, func() error { return al.Free(live) },
		al.Trim, al.Close, func() error { _, err := al.Size(live); return err },
	} {
		drivertest.RequireIs(t, call(), driver.ErrClosed, "closed allocator")
	}
}

// TestAllocatorModel: random alloc/free/trim sequences against a model of
// the live allocations. After every step: no two live allocations overlap,
// each lies inside the allocator's memory with its policy alignment, each
// still holds the bytes written at its ends (so every live byte checked is
// mapped and accessible), the figures match the model, and the invariants
// hold.
func TestAllocatorModel(t *testing.T) {
	stitches := 0
	for seed := uint64(0); seed < 10; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := runAllocatorModel(t, arenaOps(rand.New(rand.NewPCG(seed, 11)), 300))
			require.Greater(t, r.allocs, 30, "successful allocations")
			stitches += r.stitches
		})
	}
	require.Greater(t, stitches, 3, "the sequences reach stitched allocations")
}

type allocRun struct{ allocs, stitches int }

func runAllocatorModel(t *testing.T, data []byte) allocRun {
	e := newEnv(t, 24*g)
	policy := Policy(0)
	if len(data) > 0 {
		policy = Policy(data[0] % 3)
	}
	al := e.fine(t, 20*g, policy)
	type live struct {
		size uint64
		tag  byte
	}
	model := map[driver.Addr]live{}
	var allocated, peak uint64
	var r allocRun
	for i := 1; i+3 <= len(data) && i < 3*250; i += 3 {
		op, x, y := data[i]%8, uint64(data[i+1]), uint64(data[i+2])
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
				drivertest.RequireIs(t, err, driver.ErrOutOfMemory)
				break
			}
			q := max(align, policy.Quantum())
			require.Zero(t, uint64(p)%q, "alignment %d", q)
			b, err := al.Bytes(p)
			require.NoError(t, err)
			tag := byte(i)
			b[0], b[len(b)-1] = tag, tag
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
			require.NoError(t, al.Free(p))
			allocated -= model[p].size
			delete(model, p)
		default:
			require.NoError(t, al.Trim())
		}
		// Compare.
		st := al.Stats()
		require.Equal(t, allocated, st.Allocated, "step %d", i/3)
		require.Equal(t, peak, st.PeakAllocated)
		require.Equal(t, len(model), st.Live)
		type iv struct{ lo, hi driver.Addr }
		var ivs []iv
		for p, l := range model {
			b, err := al.Bytes(p)
			require.NoError(t, err)
			require.Equal(t, l.size, uint64(len(b)))
			require.Equal(t, l.tag, b[0], "first byte of %s", p)
			require.Equal(t, l.tag, b[len(b)-1], "last byte of %s", p)
			ivs = append(ivs, iv{p, p + driver.Addr(l.size)})
		}
		sort.Slice(ivs, func(a, b int) bool { return ivs[a].lo < ivs[b].lo })
		for k := 1; k < len(ivs); k++ {
			require.LessOrEqual(t, ivs[k-1].hi, ivs[k].lo, "live allocations overlap")
		}
		require.NoError(t, al.Check(), "step %d", i/3)
		r.stitches = st.Stitches
	}
	for p := range model {
		require.NoError(t, al.Free(p))
	}
	require.NoError(t, al.Trim())
	require.NoError(t, al.Check())
	require.NoError(t, al.Close())
	require.Zero(t, e.used(t, 0))
	return r
}

// FuzzAllocatorModel fuzzes the allocator model's operation decoder.
func FuzzAllocatorModel(f *testing.F) {
	f.Add(arenaOps(rand.New(rand.NewPCG(2, 2)), 60))
	f.Fuzz(func(t *testing.T, data []byte) { _ = runAllocatorModel(t, data) })
}

// TestAllocatorConcurrent: goroutines allocating, writing, checking and
// freeing at once (run with -race).
func TestAllocatorConcurrent(t *testing.T) {
	// Eight random walks of up to 64 KiB allocations can hold ~5 MiB at
	// once: room for 16.
	e := newEnv(t, 256*g)
	al := e.fine(t, 256*g, PolicyDefault)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			var mine []driver.Addr
			for i := 0; i < 300; i++ {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					k := rng.IntN(len(mine))
					if err := al.Free(mine[k]); err != nil {
						errs <- err
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
					continue
				}
				p, err := al.Alloc(uint64(rng.IntN(int(g))+1), 0)
				if err != nil {
					errs <- err
					return
				}
				b, err := al.Bytes(p)
				if err != nil {
					errs <- err
					return
				}
				b[0] = byte(w)
				if b[0] != byte(w) {
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
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, al.Check())
	require.Zero(t, al.Stats().Allocated)
	_ = units.KiB
}
