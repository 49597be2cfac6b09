package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
)

// TestPoolReuses: two ranges share a pool; what one decommits the other
// commits without a create, the device counting the pool's chunks as
// used, the limit releasing what does not fit, and Close releasing all.
// Bytes written before a decommit are what a reused chunk holds (nothing
// clears them), as a created chunk holds whatever the device had.
func TestPoolReuses(t *testing.T) { onEveryDriver(t, poolReuses) }

func poolReuses(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	p, err := NewPool(e.mem, 3*g)
	require.NoError(t, err)
	a := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	b := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	require.NoError(t, a.Commit(0, 4*g))
	require.NoError(t, a.Decommit(0, 4*g))
	require.Equal(t, 3*g, p.Bytes(), "three kept: the limit")
	require.Equal(t, 3*g, e.used(t, 0), "the pool's chunks are committed memory")
	st := a.Stats()
	require.Equal(t, 4, st.Creates)
	require.Equal(t, 3, st.Pooled)
	require.Equal(t, 1, st.Releases)
	require.NoError(t, b.Commit(2*g, 4*g))
	st = b.Stats()
	require.Equal(t, 3, st.Reused)
	require.Equal(t, 1, st.Creates, "only what the pool did not hold is created")
	require.Zero(t, p.Bytes())
	require.Equal(t, 4*g, e.used(t, 0))
	require.NoError(t, b.Check())
	require.NoError(t, p.Check())
	require.NoError(t, b.Decommit(2*g, 2*g))
	require.Equal(t, 2*g, p.Bytes())
	require.NoError(t, p.Trim(g))
	require.Equal(t, g, p.Bytes())
	require.Equal(t, 3*g, e.used(t, 0))
	require.NoError(t, p.SetLimit(0))
	require.Zero(t, p.Bytes())
	require.NoError(t, p.SetLimit(4*g))
	require.NoError(t, b.Close(), "the range's chunks go to the pool")
	require.Equal(t, 2*g, p.Bytes())
	ps := p.Stats()
	require.Equal(t, PoolStats{Bytes: 2 * g, Chunks: 2, Kept: 7, Reused: 3, Released: 2}, ps)
	require.NoError(t, p.Close())
	require.Zero(t, e.used(t, 0), "closed, the pool released everything")
	drivertest.RequireIs(t, p.Close(), driver.ErrClosed)
	require.NoError(t, a.Commit(0, g), "a closed pool gives nothing")
	require.NoError(t, a.Decommit(0, g), "and keeps nothing")
	require.Zero(t, e.used(t, 0))
}

// TestPoolRefusals: a pool of another memory, a pool with shareable
// chunks, and calls on a nil pool are refused, nothing made.
func TestPoolRefusals(t *testing.T) {
	e := newEnv(t, 8*g)
	_, err := NewPool(nil, g)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	other, err := NewPool(physical.New(e.drv), g)
	require.NoError(t, err)
	_, err = NewSparse(e.space, e.mem, SparseOptions{Max: 4 * g, ChunkSize: g, Pool: other})
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	p, err := NewPool(e.mem, g)
	require.NoError(t, err)
	_, err = NewSparse(e.space, e.mem, SparseOptions{Max: 4 * g, ChunkSize: g, Pool: p, Shareable: true})
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	_, err = NewSparse(e.space, e.mem, SparseOptions{Max: 4 * g, ChunkSize: g, Pool: &Pool{}})
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	require.Zero(t, e.used(t, 0))
	var nilPool *Pool
	drivertest.RequireIs(t, nilPool.Trim(0), driver.ErrInvalid)
	drivertest.RequireIs(t, nilPool.SetLimit(0), driver.ErrInvalid)
	drivertest.RequireIs(t, nilPool.Close(), driver.ErrInvalid)
	drivertest.RequireIs(t, nilPool.Check(), driver.ErrInvalid)
	require.Zero(t, nilPool.Bytes())
	require.Equal(t, PoolStats{}, nilPool.Stats())
	require.NoError(t, p.Close())
	require.NoError(t, other.Close())
}

// TestPoolFullDevice: on a device the pool's chunks fill, a commit of
// what the pool holds succeeds (no new memory), and one past it is
// refused as before, changing nothing.
func TestPoolFullDevice(t *testing.T) { onEveryDriver(t, poolFullDevice) }

func poolFullDevice(t *testing.T, d backend) {
	e := d.env(t, 4*g)
	p, err := NewPool(e.mem, 4*g)
	require.NoError(t, err)
	a := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	b := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	require.NoError(t, a.Commit(0, 4*g))
	require.NoError(t, a.Decommit(0, 4*g))
	require.Equal(t, 4*g, e.used(t, 0), "the device is full of pooled chunks")
	drivertest.RequireIs(t, b.Commit(0, 5*g), driver.ErrOutOfMemory)
	require.Equal(t, 4*g, p.Bytes(), "a refused commit takes nothing")
	require.Zero(t, b.Committed())
	require.NoError(t, b.Commit(0, 4*g))
	require.Equal(t, 4, b.Stats().Reused)
	require.Zero(t, b.Stats().Creates)
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
	require.NoError(t, p.Close())
	require.Zero(t, e.used(t, 0))
}

// TestPoolFill: Fill creates chunks into the pool up to a count and its
// limit, which a commit then maps without a create; a size of 0 and a
// closed pool are refused, changing nothing.
func TestPoolFill(t *testing.T) { onEveryDriver(t, poolFill) }

func poolFill(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	p, err := NewPool(e.mem, 3*g)
	require.NoError(t, err)
	_, err = p.Fill(0, 0, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	require.Zero(t, e.used(t, 0))
	n, err := p.Fill(0, g, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 2*g, p.Bytes())
	require.Equal(t, 2*g, e.used(t, 0), "filled chunks are committed memory")
	n, err = p.Fill(0, g, 5)
	require.NoError(t, err)
	require.Equal(t, 3, n, "the limit")
	a := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	require.NoError(t, a.Commit(0, 2*g))
	st := a.Stats()
	require.Equal(t, 2, st.Reused)
	require.Zero(t, st.Creates, "the commit only maps")
	require.Equal(t, PoolStats{Bytes: g, Chunks: 1, Filled: 3, Reused: 2}, p.Stats())
	require.NoError(t, p.Check())
	require.NoError(t, a.Close())
	require.NoError(t, p.Close())
	before := e.used(t, 0)
	_, err = p.Fill(0, g, 1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.Equal(t, before, e.used(t, 0))
	var zero Pool
	_, err = zero.Fill(0, g, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
}

// TestPoolRoomForOtherSizes: a full device whose memory the pool holds
// in chunks of one size still commits chunks of another: the plan counts
// the pooled chunks as room and the commit releases just enough of them,
// the largest first, before it creates (a KV cache's slots decommit pages
// of one chunk each while its prefix store commits units of two; the
// device filled with the slots' pooled pages refused every store commit).
// A plan the device cannot hold even so releases nothing and changes
// nothing.
func TestPoolRoomForOtherSizes(t *testing.T) { onEveryDriver(t, poolRoomForOtherSizes) }

func poolRoomForOtherSizes(t *testing.T, d backend) {
	e := d.env(t, 8*g)
	p, err := NewPool(e.mem, 8*g)
	require.NoError(t, err)
	small := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Pool: p})
	pairs := e.sparse(t, SparseOptions{Max: 16 * g, ChunkSize: g, MaxChunk: 2 * g, Pool: p})
	require.NoError(t, small.Commit(0, 6*g))
	require.NoError(t, small.Decommit(0, 6*g))
	require.Equal(t, 6*g, p.Bytes(), "six chunks of one granule kept")
	require.NoError(t, pairs.Commit(0, 2*g), "the two free granules hold one pair")
	require.Equal(t, 8*g, e.used(t, 0), "the device is full: six pooled, one pair")

	// Six granules pooled, none free: a pair releases two of them.
	before := p.Stats()
	require.NoError(t, pairs.Commit(2*g, 2*g))
	ps := p.Stats()
	require.Equal(t, before.Released+2, ps.Released, "two pooled granules released for the pair")
	require.Equal(t, 4*g, p.Bytes())
	require.Equal(t, 8*g, e.used(t, 0))
	st := pairs.Stats()
	require.Equal(t, 2, st.Creates)
	require.Equal(t, 4*g, st.Committed)
	require.NoError(t, pairs.Check())
	require.NoError(t, p.Check())

	// Five pairs would need ten granules; the four pooled make room for
	// two: refused, nothing released, nothing committed.
	before, used := p.Stats(), e.used(t, 0)
	drivertest.RequireIs(t, pairs.Commit(4*g, 10*g), driver.ErrOutOfMemory)
	require.Equal(t, before, p.Stats(), "a refused commit released nothing")
	require.Equal(t, used, e.used(t, 0))
	require.Equal(t, 4*g, pairs.Stats().Committed)
	require.NoError(t, pairs.Check())
	require.NoError(t, pairs.Commit(4*g, 4*g), "two pairs: the four pooled granules released")
	require.Zero(t, p.Bytes())
	require.Equal(t, before.Released+4, p.Stats().Released)

	// A pair back in the pool, and a granule to commit: the pair is
	// released (more than the granule needs; the rest is free memory).
	require.NoError(t, pairs.Decommit(6*g, 2*g))
	require.Equal(t, 2*g, p.Bytes(), "the pair kept as one chunk")
	require.NoError(t, small.Commit(0, g))
	require.Zero(t, p.Bytes())
	require.Equal(t, 7*g, e.used(t, 0))
	require.NoError(t, small.Check())
	require.NoError(t, pairs.Check())
	require.NoError(t, p.Check())
	require.NoError(t, small.Close())
	require.NoError(t, pairs.Close())
	require.NoError(t, p.Close())
	require.Zero(t, e.used(t, 0))
}
