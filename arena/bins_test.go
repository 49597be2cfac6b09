package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/testdrivers"
)

// TestBins: small requests of the default policy share a bin of their
// class, side by side; a bin goes back to the heap with its last slot; and
// a free that names no live slot — inside one, a free one, twice — is
// ErrNotAllocated and changes nothing.
func TestBins(t *testing.T) { onEveryDriver(t, bins1) }

func bins1(t *testing.T, d backend) {
	e := d.env(t, 64*g)
	al := e.fine(t, 32*g, PolicyDefault, func(o *AllocatorOptions) { o.ChunkSize = 4 * g })
	bs := &al.heaps[small].bins
	require.True(t, bs.on, "chunks of four bins, the default policy: bins are on")

	var ps []driver.Addr
	for range 5 {
		p, err := al.Alloc(1000, 0) // 1 KiB slots
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 1; i < len(ps); i++ {
		require.Equal(t, ps[0]+driver.Addr(i*1024), ps[i], "slots of one bin, side by side")
	}
	q, err := al.Alloc(300, 0) // 512 B slots: a bin of its own class
	require.NoError(t, err)
	big, err := al.Alloc(8000, 0) // no bin serves it
	require.NoError(t, err)
	require.Equal(t, 2, bs.n)
	require.Equal(t, 6, bs.live)
	n, err := al.Size(ps[2])
	require.NoError(t, err)
	require.EqualValues(t, 1000, n)
	require.NoError(t, al.Check())
	st := al.Stats()
	require.Equal(t, 7, st.Live)
	require.EqualValues(t, 5*1000+300+8000, st.Allocated)

	before := al.MemoryMap()
	for _, bad := range []driver.Addr{ps[1] + 256, ps[4] + 1024, q + 512, q + 4} {
		require.ErrorIs(t, al.Free(bad), driver.ErrNotAllocated, "free %s", bad)
		_, err := al.Size(bad)
		require.ErrorIs(t, err, driver.ErrNotAllocated)
		require.Equal(t, st, al.Stats(), "a refused free changes nothing")
		require.Equal(t, before, al.MemoryMap())
		require.NoError(t, al.Check())
	}

	require.NoError(t, al.Free(ps[1]))
	require.ErrorIs(t, al.Free(ps[1]), driver.ErrNotAllocated, "freed twice")
	p, err := al.Alloc(1024, 0)
	require.NoError(t, err)
	require.Equal(t, ps[1], p, "the freed slot is the first free one")
	for _, p := range ps {
		require.NoError(t, al.Free(p))
	}
	require.Equal(t, 1, bs.n, "a bin goes back with its last slot")
	require.NoError(t, al.Free(q))
	require.NoError(t, al.Free(big))
	require.Zero(t, bs.n)
	require.Zero(t, bs.live)
	require.NoError(t, al.Check())
	require.NoError(t, al.Trim())
	require.Zero(t, al.Stats().Committed, "no bin holds memory once its slots are free")
}

// TestBinsOff: bins serve only the default policy on chunks of four bins
// or more, and never a shareable allocator (its allocations are
// exported a chunk at a time) or an alignment above a slot's.
func TestBinsOff(t *testing.T) {
	e := backend{testdrivers.Host()}.env(t, 64*g)
	for _, tc := range []struct {
		name string
		opt  func(*AllocatorOptions)
	}{
		{"64 KiB chunks", func(o *AllocatorOptions) {}},
		{"ascend policy", func(o *AllocatorOptions) { o.ChunkSize, o.Policy = 4*g, PolicyAscend }},
		{"shareable", func(o *AllocatorOptions) { o.ChunkSize, o.Shareable = 4*g, true }},
	} {
		al := e.fine(t, 32*g, PolicyDefault, tc.opt)
		require.False(t, al.heaps[small].bins.on, tc.name)
	}
	al := e.fine(t, 32*g, PolicyDefault, func(o *AllocatorOptions) { o.ChunkSize = 4 * g })
	p, err := al.Alloc(1000, 4096)
	require.NoError(t, err)
	require.Zero(t, al.heaps[small].bins.n, "an alignment above 256 B is no slot's")
	require.NoError(t, al.Free(p))
}
