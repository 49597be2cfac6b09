package kvcache

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/attention"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// ringConfig is a ring cache of window w over the tiny preset's shape,
// heads KV heads of dim elements (float32).
func ringConfig(heads, dim, w, maxCtx int) Config {
	cfg := tinyConfig(PerLayer, maxCtx, 2)
	cfg.KVHeads, cfg.HeadDim = heads, dim
	cfg.Window, cfg.Ring, cfg.NoPrefixSharing = w, true, true
	return cfg
}

// TestRingAttention: decode attention over a ring's contiguous window
// slice (K and V as the cache hands them out, no copy) equals, bit for
// bit, attention over a copy of the last Window tokens' keys and values,
// at every position across ten wraps of the ring (two under the race
// detector), in every layer — with
// rows that divide the page and rows that straddle the ring's end into
// its mirror. The slice's address is the ring's base plus (p*row) mod
// (R*page) for its first position p.
func TestRingAttention(t *testing.T) {
	for _, shape := range []struct{ heads, dim, w int }{{8, 64, 40}, {3, 40, 150}} {
		t.Run(fmt.Sprintf("%dx%d/window-%d", shape.heads, shape.dim, shape.w), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := ringConfig(shape.heads, shape.dim, shape.w, 1<<14)
			c := e.cache(t, cfg)
			g := c.g
			ringBytes := uint64(g.ring) * g.page
			wraps := 10
			if race.Enabled {
				// One goroutine's arithmetic, where the detector finds
				// nothing and costs ten times over: two wraps cross the
				// mirror under it, scripts/test's run without -race does ten.
				wraps = 2
			}
			total := wraps*g.ringCap + g.ringCap/2
			require.LessOrEqual(t, total, cfg.MaxContext)
			tokens := make([]int, total)
			for i := range tokens {
				tokens[i] = 3 + i%1000
			}
			s, err := c.Admit(tokens[:20], 0)
			require.NoError(t, err)
			sh := attention.Shape{Heads: 2 * shape.heads, KVHeads: shape.heads, HeadDim: shape.dim}
			q := make([]float32, sh.Heads*sh.HeadDim)
			out, want := make([]float32, len(q)), make([]float32, len(q))
			scores := make([]float32, sh.ScoresLen(cfg.Window))
			kCopy := make([]float32, cfg.Window*sh.RowLen())
			vCopy := make([]float32, len(kCopy))
			pre := prefixes(tokens, 0)
			first := c.Stats()
			for n := 0; n < total; {
				cnt := 1
				if n == 0 {
					cnt = 20 // the prompt, in one Append
				}
				st, err := s.Append(tokens[n : n+cnt])
				require.NoError(t, err)
				writeStep(t, st, tokens, 0)
				n += cnt
				if n == cnt {
					first = c.Stats()
				}
				from := max(n-cfg.Window, 0)
				require.Equal(t, from, s.WindowStart(), "after a one-token Append the window is the last Window tokens")
				w := n - from
				for l := 0; l < cfg.Layers; l++ {
					k, err := s.K(l)
					require.NoError(t, err)
					v, err := s.V(l)
					require.NoError(t, err)
					require.Equal(t, []int{w, shape.heads, shape.dim}, k.Shape())
					base := c.Base() + driver.Addr(c.slotOff(s.sl, 2*l, 0))
					require.Equal(t, base+driver.Addr(uint64(from)*g.row%ringBytes), k.Addr()+driver.Addr(k.Offset()*4), "position %d's row", from)
					kd, err := tensor.Data[float32](k)
					require.NoError(t, err)
					vd, err := tensor.Data[float32](v)
					require.NoError(t, err)
					// The copy: the rows writeStep wrote, from the reference.
					for p := from; p < n; p++ {
						for h := 0; h < shape.heads; h++ {
							for d := 0; d < shape.dim; d++ {
								i := ((p-from)*shape.heads+h)*shape.dim + d
								kCopy[i], vCopy[i] = value(pre[p], l, 0, h, d), value(pre[p], l, 1, h, d)
							}
						}
					}
					for i := range q {
						q[i] = float32(math.Sin(float64(i*7+n*13+l))) / 4
					}
					require.NoError(t, attention.Contiguous(sh, out, q, kd, vd, w, scores))
					require.NoError(t, attention.Contiguous(sh, want, q, kCopy, vCopy, w, scores))
					if !slicesEqualBits(out, want) {
						require.Equal(t, want, out, "layer %d at %d tokens (window from %d)", l, n, from)
					}
				}
			}
			st := c.Stats()
			t.Logf("%d tokens, %d wraps of a ring of %d pages (%d rows): %d pages committed, %d commits, %d borrows (first Append: %d, %d, %d)",
				total, wraps, g.ring, g.ringCap, st.PagesCommitted, st.Commits, st.Borrows, first.PagesCommitted, first.Commits, first.Borrows)
			require.Equal(t, g.ringPages(), st.RingPages)
			require.Equal(t, g.ringPages(), st.PagesCommitted, "the rings and nothing else")
			require.Equal(t, first.Commits, st.Commits, "no page committed after the first Append")
			require.Equal(t, first.Borrows, st.Borrows, "no map after the first Append")
			require.Equal(t, 2*g.regions, st.Borrows, "each ring mapped twice")
			require.NoError(t, c.Check())
			require.NoError(t, s.Free())
			require.Zero(t, c.Stats().PagesCommitted, "a ring is given back with its sequence")
			require.NoError(t, c.Check())
		})
	}
}

func slicesEqualBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestRingRefusals: a ring in a layout other than PerLayer, or with
// prefix sharing, is ErrUnsupported at New; on a ring cache, the calls
// rings have not (Preempt, UnitBytes, Fork) refuse with nothing
// changed (Reserve, whose rings are committed, reserves every token),
// and an Append or Step that would overwrite what its first token
// attends to is ErrInvalid.
func TestRingRefusals(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	for _, l := range []Layout{TokenMajor, Contiguous} {
		cfg := ringConfig(8, 64, 40, 256)
		cfg.Layout = l
		_, err := New(e.space, e.mem, cfg)
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "PerLayer")
	}
	cfg := ringConfig(8, 64, 40, 256)
	cfg.NoPrefixSharing = false
	_, err := New(e.space, e.mem, cfg)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "NoPrefixSharing")
	require.Empty(t, e.space.Reservations())

	cfg = ringConfig(8, 64, 40, 256)
	cfg.Layout = AutoLayout
	c := e.cache(t, cfg)
	require.Equal(t, PerLayer, c.Config().Layout, "AutoLayout picks PerLayer for a ring")
	s, err := c.Admit([]int{1, 2, 3}, 0)
	require.NoError(t, err)
	st, err := s.Append([]int{1, 2, 3})
	require.NoError(t, err)
	writeStep(t, st, []int{1, 2, 3}, 0)
	require.NoError(t, s.MarkWritten(3))
	before := snapBooks(t, c, e)
	most := c.g.ringCap - cfg.Window + 1
	_, err = s.Append(make([]int, most+1))
	drivertest.RequireIs(t, err, driver.ErrInvalid, fmt.Sprintf("at most %d tokens", most))
	drivertest.RequireIs(t, s.Preempt(Drop), driver.ErrUnsupported, "ring")
	drivertest.RequireIs(t, s.Preempt(Swap), driver.ErrUnsupported, "ring")
	_, err = c.Step([]StepRequest{{Seq: s, Tokens: make([]int, most+1)}}, nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid, fmt.Sprintf("at most %d tokens", most))
	got, err := s.Reserve(4)
	require.NoError(t, err)
	require.Equal(t, 4, got, "the rings hold every token's rows")
	_, err = s.UnitBytes(0)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "ring")
	_, err = s.Fork()
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "ring")
	for _, err := range []error{s.Preempt(Drop), err} {
		require.Contains(t, errors.FlattenHints(err), "writes over as it wraps", "the hint says why")
	}
	require.Equal(t, before, snapBooks(t, c, e))
	require.Equal(t, 3, s.Len())
	checkWindow(t, s, []int{1, 2, 3}, 0)
	_, err = s.Append(make([]int, most))
	require.NoError(t, err, "the most an Append takes")
	require.NoError(t, c.Check())
}

// TestRingOnEveryDriver: on the host driver and the CUDA and AscendCL
// drivers over their stand-ins, a ring's pages are one memory mapped at
// two addresses: bytes written at ring offset x of every region read back
// at x + R*page, the mirror, and a write across the ring's end (a row
// that straddles it) lands at the ring's start. Check agrees; Free gives
// the pages back.
func TestRingOnEveryDriver(t *testing.T) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		drv := b.Open(t, testdrivers.Machine{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		cfg := ringConfig(8, 64, 40, 256)
		c, err := New(vaspace.New(drv), physical.New(drv), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		s, err := c.Admit([]int{1, 2}, 0)
		require.NoError(t, err)
		_, err = s.Append([]int{1, 2})
		require.NoError(t, err)
		require.NoError(t, c.Check())
		g := c.g
		ringBytes := uint64(g.ring) * g.page
		for r := 0; r < g.regions; r++ {
			base := c.Base() + driver.Addr(c.slotOff(s.sl, r, 0))
			want := []byte(fmt.Sprintf("region %d's row", r))
			x := driver.Addr(uint64(r)*g.row + 100)
			require.NoError(t, drv.Write(base+x, want))
			got := make([]byte, len(want))
			require.NoError(t, drv.Read(base+driver.Addr(ringBytes)+x, got))
			require.Equal(t, want, got, "region %d: the mirror reads the ring", r)
			// Across the ring's end: the bytes past it are the ring's first.
			end := base + driver.Addr(ringBytes) - 4
			require.NoError(t, drv.Write(end, []byte("wrapped!")))
			require.NoError(t, drv.Read(base, got[:4]))
			require.Equal(t, []byte("ped!"), got[:4])
		}
		require.Equal(t, g.ringPages(), c.Stats().RingPages)
		require.NoError(t, s.Free())
		require.Zero(t, c.Stats().PagesCommitted)
		require.NoError(t, c.Check())
		require.NoError(t, c.Close())
	})
}

// TestRingReserve: Reserve before a ring sequence's first Append commits
// its rings (within the budget's free pages, or nothing), and the Append
// then commits nothing; a bad count is refused with nothing changed.
func TestRingReserve(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	c := e.cache(t, ringConfig(8, 64, 40, 256))
	s, err := c.Admit([]int{1, 2, 3}, 0)
	require.NoError(t, err)
	before := snapBooks(t, c, e)
	_, err = s.Reserve(-1)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	require.Equal(t, before, snapBooks(t, c, e))
	got, err := s.Reserve(0)
	require.NoError(t, err)
	require.Zero(t, got)
	require.Equal(t, before, snapBooks(t, c, e))
	pages := c.Stats().PagesCommitted
	got, err = s.Reserve(10)
	require.NoError(t, err)
	require.Equal(t, 10, got)
	require.Equal(t, pages+c.g.ringPages(), c.Stats().PagesCommitted, "the rings, committed ahead")
	commits := c.Stats().Commits
	st, err := s.Append([]int{1, 2, 3})
	require.NoError(t, err)
	require.Equal(t, commits, c.Stats().Commits, "the Append commits nothing")
	writeStep(t, st, []int{1, 2, 3}, 0)
	require.NoError(t, s.MarkWritten(3))
	checkWindow(t, s, []int{1, 2, 3}, 0)
	require.NoError(t, c.Check())
	require.NoError(t, s.Free())
	require.NoError(t, c.Check())
}

// TestRingHugeBlockTokens: a ring's pages hold Window + BlockTokens rows;
// a BlockTokens near math.MaxInt, whose sum with the window overflows, is
// refused at New (ErrInvalid, saying the ring overflows) rather than
// sized from a sum that wrapped — a ring of one page, short of the rows
// an Append of BlockTokens+1 tokens needs, or no slot at all — and
// reserves nothing; a BlockTokens that fits still makes a cache.
func TestRingHugeBlockTokens(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	for _, bt := range []int{math.MaxInt, math.MaxInt - 39, math.MaxInt / 2} {
		cfg := ringConfig(8, 64, 40, 256)
		cfg.BlockTokens = bt
		_, err := New(e.space, e.mem, cfg)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "kvcache: new cache: a ring of", "overflows")
		require.Empty(t, e.space.Reservations())
	}
	cfg := ringConfig(8, 64, 40, 256)
	cfg.BlockTokens = 32
	c := e.cache(t, cfg)
	require.GreaterOrEqual(t, c.g.ringCap, 40+32)
	s, err := c.Admit(family(0, 33), 0)
	require.NoError(t, err)
	_, err = s.Append(family(0, 33))
	require.NoError(t, err)
	require.NoError(t, c.Check())
}
