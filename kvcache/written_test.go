package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// TestUnwrittenNeverServed: a sequence admitted and appended, then ended
// (Free, Preempt Drop or Swap, a budget cut) before its keys and values
// were written and marked, publishes nothing: the next request with its
// prompt matches no token and computes its own. (Before MarkWritten, its
// prompt units were published at Free or Preempt, and the next request
// matched whole units of zeros.)
func TestUnwrittenNeverServed(t *testing.T) {
	ends := map[string]func(t *testing.T, c *Cache, s *Seq){
		"Free":         func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Free()) },
		"Preempt Drop": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Drop)) },
		"Preempt Swap": func(t *testing.T, c *Cache, s *Seq) { require.NoError(t, s.Preempt(Swap)) },
		"SetBudget": func(t *testing.T, c *Cache, s *Seq) {
			pre, err := c.SetBudget(page, Drop)
			require.NoError(t, err)
			require.Equal(t, []*Seq{s}, pre)
			_, err = c.SetBudget(64*units.MiB, Drop)
			require.NoError(t, err)
		},
	}
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		for name, end := range ends {
			t.Run(layout.String()+"/"+name, func(t *testing.T) {
				e := hostEnv(t, 64*units.MiB)
				c := e.cache(t, microConfig(layout, 4096, 4))
				unit := c.TokensPerGroup()
				if layout == PerLayer {
					unit = 1024
				}
				prompt := seqTokens(2*unit+40, 2*unit+40, 0)
				a, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				_, err = a.Append(prompt) // rows handed out, never written
				require.NoError(t, err)
				end(t, c, a)

				b, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				require.Zero(t, b.Matched(), "no unwritten unit is served")
				require.Zero(t, b.Len())
				require.Zero(t, c.Stats().PrefixHits)
				require.NoError(t, c.Check())
			})
		}
	}
}

// TestMarkWritten: only the whole prompt units below what MarkWritten
// said are published, as soon as it says so; a sequence that wrote part
// of its prompt shares that part; MarkWritten refuses what it cannot
// mean, changing nothing.
func TestMarkWritten(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, microConfig(layout, 4096, 4))
			unit := c.TokensPerGroup()
			if layout == PerLayer {
				unit = 1024
			}
			prompt := seqTokens(3*unit+40, 3*unit+40, 0)
			a, err := c.Admit(prompt, 7)
			require.NoError(t, err)
			step, err := a.Append(prompt)
			require.NoError(t, err)
			writeStep(t, step, prompt, 7)
			require.Zero(t, a.Written())

			// Refusals change nothing.
			before := c.Stats()
			for _, n := range []int{-1, len(prompt) + 1} {
				drivertest.RequireIs(t, a.MarkWritten(n), driver.ErrInvalid, "the sequence holds")
			}
			require.Zero(t, a.Written())
			require.Equal(t, before, c.Stats())

			// Two units and a bit: two units published, not the third.
			require.NoError(t, a.MarkWritten(2*unit+5))
			require.Equal(t, 2*unit+5, a.Written())
			drivertest.RequireIs(t, a.MarkWritten(unit), driver.ErrInvalid, "only grows")
			require.Equal(t, 2*unit+5, a.Written())
			b, err := c.Admit(prompt, 7)
			require.NoError(t, err)
			require.Equal(t, 2*unit, b.Matched(), "the two written units")
			checkSeq(t, b, prompt, 7, 0, 2*unit)
			require.NoError(t, b.Free())

			require.NoError(t, a.MarkWritten(len(prompt)))
			b, err = c.Admit(prompt, 7)
			require.NoError(t, err)
			require.Equal(t, 3*unit, b.Matched(), "all three")
			checkSeq(t, b, prompt, 7, 0, 3*unit)
			require.NoError(t, c.Check())

			// A preempted sequence marks nothing; a freed one neither.
			require.NoError(t, b.Preempt(Drop))
			require.Zero(t, b.Written(), "dropped: its rows are gone")
			drivertest.RequireIs(t, b.MarkWritten(3*unit), driver.ErrInvalid, "preempted")
			_, err = b.Resume()
			require.NoError(t, err)
			require.Equal(t, b.Matched(), b.Written(), "resumed: the rows matched again")
			require.Less(t, b.Matched(), 3*unit, "the last token is left to compute")
			require.NoError(t, b.Free())
			drivertest.RequireIs(t, b.MarkWritten(3*unit), driver.ErrClosed, "freed")
			var zero Seq
			drivertest.RequireIs(t, zero.MarkWritten(0), driver.ErrInvalid)
			require.Zero(t, zero.Written())
			require.NoError(t, a.Free())
			require.NoError(t, c.Check())
		})
	}
}

// TestSharedPrefixReadOnly: a sequence that maps another's prompt units
// from the prefix store cannot change them: a Set or Copy through its K
// or V below Matched is refused, the owner's bytes and the books are
// unchanged. Rows past the shared units stay writable. Under the tensors
// the shared units are mapped read-only at the sharer's addresses, on the
// host driver too (TestSharedPrefixReadOnlyOnEveryDriver checks the
// mapping on every driver). (Before, a sharer's write below Matched
// changed what every holder read, and Check passed.)
func TestSharedPrefixReadOnly(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, microConfig(layout, 4096, 4))
			unit := c.TokensPerGroup()
			if layout == PerLayer {
				unit = 1024
			}
			prompt := seqTokens(2*unit+40, 2*unit+40, 0)
			a := prefill(t, c, prompt, 7)
			bTokens := seqTokens(2*unit+90, 2*unit+40, 5000)
			b, err := c.Admit(bTokens, 7)
			require.NoError(t, err)
			require.Equal(t, 2*unit, b.Matched())
			step, err := b.Append(bTokens[b.Len():])
			require.NoError(t, err)
			writeStep(t, step, bTokens, 7)

			at := func(p int) []int { // position p, head 0, dim 3 of K
				if layout == TokenMajor {
					return []int{p / unit, p % unit, 0, 3}
				}
				return []int{p, 0, 3}
			}
			kb, err := b.K(1)
			require.NoError(t, err)
			ka, err := a.K(1)
			require.NoError(t, err)
			before := c.Stats()
			for _, p := range []int{0, unit + 5, 2*unit - 1} {
				was, err := ka.At(at(p)...)
				require.NoError(t, err)
				drivertest.RequireIs(t, kb.Set(was+1, at(p)...), driver.ErrAccessDenied, "read-only")
				got, err := ka.At(at(p)...)
				require.NoError(t, err)
				require.Equal(t, was, got, "the owner's bytes are unchanged")
			}
			// A Copy into the shared rows: refused, nothing written.
			row, err := kb.Narrow(0, at(unit + 5)[0], 1)
			require.NoError(t, err)
			src := newFloats(t, row.Shape()...)
			drivertest.RequireIs(t, tensor.Copy(row, src), driver.ErrAccessDenied, "read-only")
			checkSeq(t, a, prompt, 7, 0, len(prompt))
			checkSeq(t, b, bTokens, 7, 0, len(bTokens))
			require.Equal(t, before, c.Stats())
			require.NoError(t, c.Check())

			// Past the shared units, b's rows are its own: writable.
			p := len(bTokens) - 1
			was, err := kb.At(at(p)...)
			require.NoError(t, err)
			require.NoError(t, kb.Set(was+1, at(p)...))
			require.NoError(t, kb.Set(was, at(p)...))

			require.True(t, c.protects, "the cache's views are read-only: the host driver's pages can be")
			require.Equal(t, 2, b.sl.shared)
			requireShared(t, c, b, 2)

			// Preempted and resumed, b maps them read-only again; freed,
			// its slot shares nothing.
			require.NoError(t, b.Preempt(Swap))
			require.Zero(t, b.sl.shared)
			_, err = b.Resume()
			require.NoError(t, err)
			require.Equal(t, 2, b.sl.shared)
			requireShared(t, c, b, 2)
			checkSeq(t, b, bTokens, 7, 0, len(bTokens))
			kb, err = b.K(1)
			require.NoError(t, err)
			drivertest.RequireIs(t, kb.Set(1, at(5)...), driver.ErrAccessDenied)
			require.NoError(t, c.Check())
			require.NoError(t, b.Free())
			require.NoError(t, a.Free())
			require.NoError(t, c.Check())
		})
	}
}

// newFloats is a float32 tensor of shape in Go memory.
func newFloats(t *testing.T, shape ...int) *tensor.Tensor {
	n := 4
	for _, d := range shape {
		n *= d
	}
	x, err := tensor.New(goBuffer(make([]byte, n)), tensor.Float32, shape...)
	require.NoError(t, err)
	return x
}

// goBuffer is a tensor.Buffer over Go memory.
type goBuffer []byte

func (b goBuffer) Bytes() ([]byte, error) { return b, nil }

// TestSharedPrefixReadOnlyOnEveryDriver: on the host driver and on the
// CUDA and AscendCL drivers over their stand-ins (no HostMapper: bytes
// move with the driver's Read and Write), a sequence's shared units are
// the owner's memory at the sharer's addresses, mapped read-only there: a
// write there through the driver (as a kernel's would be) is refused and
// the owner's bytes stay. On the host driver the kernel's own protection
// of the sharer's pages is read-only (/proc/self/maps; never tested by a
// store, which would kill the test) while the owner's stay writable, and
// the sharer's tensors — over the cache's read-only views — read the
// owner's bytes and refuse a Set there. Check agrees on every driver.
// (Before, on the host driver the cache's views kept the shared pages
// writable: a store through a tensor's slice changed the owner's keys.)
func TestSharedPrefixReadOnlyOnEveryDriver(t *testing.T) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		drv := b.Open(t, testdrivers.Machine{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		c, err := New(vaspace.New(drv), physical.New(drv), microConfig(TokenMajor, 4096, 2))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		unit := c.TokensPerGroup()
		prompt := seqTokens(2*unit+40, 2*unit+40, 0)
		a, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		_, err = a.Append(prompt)
		require.NoError(t, err)
		aAddr := c.Base() + driver.Addr(c.slotOff(a.sl, 0, 1))
		want := []byte("the owner's keys")
		require.NoError(t, drv.Write(aAddr, want))
		require.NoError(t, a.MarkWritten(a.Len()))
		s, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		require.Equal(t, 2*unit, s.Matched())
		require.NoError(t, c.Check())

		sAddr := c.Base() + driver.Addr(c.slotOff(s.sl, 0, 1))
		got := make([]byte, len(want))
		require.NoError(t, drv.Read(sAddr, got))
		require.Equal(t, want, got, "the same memory at the sharer's addresses")
		require.True(t, c.protects)
		requireShared(t, c, s, 2)
		drivertest.RequireIs(t, drv.Write(sAddr, []byte("a sharer's write")), driver.ErrAccessDenied)
		if b.Name == "host" {
			_, err := s.Append(prompt[s.Len():])
			require.NoError(t, err)
			ks, err := s.K(0)
			require.NoError(t, err, "tensors over read-only pages")
			before := c.Stats()
			at := []int{1, 0, 0, 0} // unit 1, token 0: the bytes written at aAddr
			x, err := ks.At(at...)
			require.NoError(t, err)
			drivertest.RequireIs(t, ks.Set(x+1, at...), driver.ErrAccessDenied, "read-only")
			y, err := ks.At(at...)
			require.NoError(t, err)
			require.Equal(t, x, y)
			require.Equal(t, before, c.Stats())
			requireShared(t, c, s, 2)
		}
		require.NoError(t, drv.Read(aAddr, got))
		require.Equal(t, want, got, "the owner's bytes stay")
		require.NoError(t, c.Check())
		require.NoError(t, s.Free())
		require.NoError(t, a.Free())
		require.NoError(t, c.Check())
		require.NoError(t, c.Close())
	})
}

// requireShared checks that the first n units of s's slot are mapped
// read-only at its addresses in every region, in the cache's books, the
// driver's and — on the host driver — the kernel's, and that the unit
// after them is not.
func requireShared(t *testing.T, c *Cache, s *Seq, n int) {
	t.Helper()
	drv := c.slots.Driver()
	_, host := drv.(driver.HostMapper)
	var maps []procmaps.Entry
	if host {
		var err error
		maps, err = procmaps.Read()
		require.NoError(t, err)
	}
	for r := 0; r < c.g.regions; r++ {
		for u := 0; u <= n && u < c.g.unitsFor(s.Len()); u++ {
			want := driver.AccessReadWrite
			if u < n {
				want = driver.AccessRead
			}
			off := c.slotOff(s.sl, r, u)
			acc, err := c.slots.AccessAt(c.cfg.Device, off)
			require.NoError(t, err)
			require.Equal(t, want, acc, "region %d, unit %d: the arena's access", r, u)
			acc, err = drv.Access(c.Base()+driver.Addr(off), c.cfg.Device)
			require.NoError(t, err)
			require.Equal(t, want, acc, "region %d, unit %d: the driver's access", r, u)
			if host {
				for _, at := range []uint64{off, off + c.g.unitBytes - 1} {
					m, ok := procmaps.Find(maps, uint64(c.Base())+at)
					require.True(t, ok, "region %d, unit %d: no mapping", r, u)
					require.True(t, m.Readable(), "region %d, unit %d: %s", r, u, m.Perms)
					require.Equal(t, u >= n, m.Writable(), "region %d, unit %d: the kernel's protection is %s", r, u, m.Perms)
				}
			}
		}
	}
}
