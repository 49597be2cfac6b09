package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestMemoryMap: the map of TestStitch's layout while the stitched
// allocation lives. Each range is tiled from 0 to its end; the large heap
// holds the four live chunks, the three lent to the stitch and the one
// free; the stitch range holds the stitched allocation at its start; the
// small heap is all uncommitted; the committed blocks add up to what the
// allocator says it has committed. The map is a copy: changing it changes
// nothing, and a closed allocator has none.
func TestMemoryMap(t *testing.T) { onEveryDriver(t, memoryMap) }

// TestMemoryMapOfNoAllocator: a nil or zero Allocator has no map, and
// asking does not panic.
func TestMemoryMapOfNoAllocator(t *testing.T) {
	var al *Allocator
	require.Nil(t, al.MemoryMap())
	require.Nil(t, new(Allocator).MemoryMap())
}

func memoryMap(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	al, err := NewAllocator(e.space, e.mem, AllocatorOptions{Max: 8 * g, AddressSpace: 8 * g, ChunkSize: g, ReleaseThreshold: 1})
	require.NoError(t, err)
	var ps []driver.Addr
	for range 8 {
		p, err := al.Alloc(g-100, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	big, err := al.Alloc(3*g, 0)
	require.NoError(t, err)

	m := al.MemoryMap()
	rs := al.Ranges()
	require.Len(t, rs, 3)
	sizes := map[BlockKind]uint64{}
	count := map[BlockKind]int{}
	var requested uint64
	for r := range rs {
		at := uint64(0)
		for _, b := range m {
			if b.Range != r {
				continue
			}
			require.Equal(t, at, b.Offset, "range %d is tiled without gaps", r)
			require.NotZero(t, b.Size)
			at += b.Size
			if r == 0 {
				require.Equal(t, BlockUncommitted, b.Kind, "nothing small was allocated")
			}
			if r < 2 {
				require.NotEqual(t, BlockStitched, b.Kind, "stitched allocations live in the stitch range")
			} else {
				require.Contains(t, []BlockKind{BlockStitched, BlockUncommitted}, b.Kind)
			}
			sizes[b.Kind] += b.Size
			count[b.Kind]++
			requested += b.Requested
		}
		require.Equal(t, uint64(rs[r].Size), at, "range %d is tiled to its end", r)
	}
	require.Equal(t, 4, count[BlockUsed])
	require.Equal(t, 4*g, sizes[BlockUsed])
	require.Equal(t, 3*g, sizes[BlockLent])
	require.Equal(t, g, sizes[BlockFree])
	require.Equal(t, 1, count[BlockStitched])
	require.Equal(t, 3*g, sizes[BlockStitched])
	require.Equal(t, al.Stats().Allocated, requested, "what the blocks asked for is what is allocated")
	require.Equal(t, al.Stats().Committed, sizes[BlockUsed]+sizes[BlockFree]+sizes[BlockLent])
	for _, b := range m {
		if b.Kind == BlockStitched {
			require.Equal(t, big, rs[2].Base+driver.Addr(b.Offset))
		}
	}

	m[0].Kind, m[0].Size = BlockUsed, 1
	require.Equal(t, BlockUncommitted, al.MemoryMap()[0].Kind, "the map is a copy")

	require.NoError(t, al.Free(big))
	for _, b := range al.MemoryMap() {
		require.NotEqual(t, BlockLent, b.Kind, "the stitch gave its chunks back")
		require.NotEqual(t, BlockStitched, b.Kind)
	}
	for i := 1; i < 8; i += 2 {
		require.NoError(t, al.Free(ps[i]))
	}
	require.NoError(t, al.Close())
	require.Nil(t, al.MemoryMap())
	require.Equal(t, "lent", BlockLent.String())
}
