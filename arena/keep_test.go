package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// keepRun is what the kept-chunks scenario did: the driver calls of the
// give-back phase and of the reuse phase, and the peaks.
type keepRun struct {
	gaveBack, reuse                sim.Calls
	peakCommitted, peakHeld, kept  uint64
	committedAfter, heldAfterGrows uint64
}

// keepScenario: a peak of 128 blocks of 8 MiB (each its own chunk), every
// other one freed (free chunks that no larger request fits), then a
// request of 24 MiB that no free block fits, which commits and gives free
// chunks back down to its budget, then the freed size asked for again
// sixteen times. keepDiv is the allocator's keep divisor (0: none kept).
func keepScenario(t *testing.T, keepDiv uint64) keepRun {
	const mib = units.MiB
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: 8 * units.GiB, Granularity: 2 * mib})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	al, err := NewAllocator(vaspace.New(drv), physical.New(drv), AllocatorOptions{NoStitch: true})
	require.NoError(t, err)
	t.Cleanup(func() { closeAllocator(t, al) })
	al.keepDiv = keepDiv
	calls := func() sim.Calls { return drv.Tally().Devices[0] }
	diff := func(a, b sim.Calls) sim.Calls {
		return sim.Calls{Create: b.Create - a.Create, Map: b.Map - a.Map, SetAccess: b.SetAccess - a.SetAccess,
			Unmap: b.Unmap - a.Unmap, Release: b.Release - a.Release}
	}
	var blocks []driver.Addr
	for range 128 {
		p, err := al.Alloc(8*mib, 0)
		require.NoError(t, err)
		blocks = append(blocks, p)
	}
	var r keepRun
	r.peakHeld = al.held
	for i := 0; i < len(blocks); i += 2 {
		require.NoError(t, al.Free(blocks[i]))
	}
	c0 := calls()
	_, err = al.Alloc(24*mib, 0)
	require.NoError(t, err)
	require.NoError(t, al.Check())
	c1 := calls()
	r.heldAfterGrows = al.held
	r.committedAfter = al.committed()
	r.kept = r.committedAfter - al.held
	for range 16 {
		_, err := al.Alloc(8*mib, 0)
		require.NoError(t, err)
	}
	require.NoError(t, al.Check())
	r.gaveBack, r.reuse = diff(c0, c1), diff(c1, calls())
	r.peakCommitted = al.Stats().PeakCommitted
	return r
}

// TestAllocatorKeepsFreedChunks: after a peak, a commit elsewhere gives
// back free chunks only down to its budget plus a share of the distance to
// the high-water mark, so that requests of a freed size find chunks still
// mapped (no create); with no share kept, the same requests create their
// chunks again. What is kept stays within that share, and the peak is the
// same either way.
func TestAllocatorKeepsFreedChunks(t *testing.T) {
	with, without := keepScenario(t, keepDivisor), keepScenario(t, 0)
	for _, r := range []keepRun{with, without} {
		t.Logf("gave back: %+v; reuse: %+v; kept %s of free memory after the grow", r.gaveBack, r.reuse, units.Bytes(r.kept))
	}
	require.Equal(t, without.peakCommitted, with.peakCommitted, "keeping adds nothing to the peak")
	require.Less(t, with.gaveBack.Release, without.gaveBack.Release, "fewer chunks given back")
	require.Less(t, with.reuse.Create, without.reuse.Create, "requests of a freed size reuse kept chunks")
	// The share: budget + (high − held)/keepDivisor at the grow, with one
	// request's footprint of rounding.
	held := with.heldAfterGrows
	share := max(2*units.MiB, held/256) + (with.peakHeld-held)/keepDivisor
	require.LessOrEqual(t, with.kept, share+24*units.MiB, "kept within the share")
	require.Greater(t, with.kept, without.kept, "more kept than with no share")
}

// TestAllocatorFullDeviceServesFromKept: on a device that is full, free
// chunks kept for reuse (high-water mark above the live set) never make a
// request that they could serve fail: they move, or go back first. With
// stitching on and off, at several sizes up to what the device holds.
func TestAllocatorFullDeviceServesFromKept(t *testing.T) {
	const mib = units.MiB
	for _, noStitch := range []bool{false, true} {
		for _, size := range []uint64{6 * mib, 24 * mib, 31 * mib} {
			t.Run(fmt.Sprintf("nostitch=%v/%s", noStitch, units.Bytes(size)), func(t *testing.T) {
				drv, err := sim.New(sim.Options{Devices: 1, Capacity: 64 * mib, Granularity: 2 * mib})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, drv.Close()) })
				al, err := NewAllocator(vaspace.New(drv), physical.New(drv), AllocatorOptions{NoStitch: noStitch})
				require.NoError(t, err)
				t.Cleanup(func() { closeAllocator(t, al) })
				var blocks []driver.Addr
				for range 16 {
					p, err := al.Alloc(4*mib, 0)
					require.NoError(t, err)
					blocks = append(blocks, p)
				}
				for i := 0; i < len(blocks); i += 2 {
					require.NoError(t, al.Free(blocks[i]))
				}
				require.NoError(t, al.Check())
				require.Greater(t, al.high, al.held, "the peak is past: free chunks are kept")
				// 32 MiB live, 32 MiB free in 4 MiB pieces, the device full.
				p, err := al.Alloc(size, 0)
				require.NoError(t, err, "a request the free chunks can serve")
				require.NoError(t, al.Check())
				// And the rest of the device, in 2 MiB requests.
				for al.held+2*mib <= 64*mib {
					_, err := al.Alloc(2*mib, 0)
					require.NoError(t, err, "%s live of 64 MiB", units.Bytes(al.held))
				}
				require.NoError(t, al.Check())
				require.NoError(t, al.Free(p))
			})
		}
	}
}
