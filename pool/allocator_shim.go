package pool

import (
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// This file is the pool's only contact with the allocator: the calls the
// pool makes, each with what it relies on. Every function is called with
// the pool's lock held (Pool.mu before the allocator's own locks) or before
// the pool is shared.

// allocator is the allocator type the pool owns.
type allocator = arena.Allocator

// newAllocator makes the pool's allocator: at most max bytes committed on
// dev, in chunkSize chunks (0: the device's recommended granularity),
// shareable chunks when shareable. A shareable allocator keeps one range
// and does not stitch: an allocation another process imports is then
// always one run of that range's chunks.
func newAllocator(space *vaspace.Space, mem *physical.Memory, dev driver.DeviceID, max, chunkSize uint64, shareable bool) (*allocator, error) {
	return arena.NewAllocator(space, mem, arena.AllocatorOptions{Device: dev, Max: max, ChunkSize: chunkSize,
		Shareable: shareable, NoStitch: shareable})
}

// alAlloc allocates with the policy's default alignment.
func alAlloc(al *allocator, size uint64) (driver.Addr, error) { return al.Alloc(size, 0) }

// alFree frees a live allocation.
func alFree(al *allocator, p driver.Addr) error { return al.Free(p) }

// alSize is the size asked for by the live allocation at p.
func alSize(al *allocator, p driver.Addr) (uint64, error) { return al.Size(p) }

// alBytes is the live allocation at p as a slice, on drivers whose memory
// the process addresses.
func alBytes(al *allocator, p driver.Addr) ([]byte, error) { return al.Bytes(p) }

// alTrimTo gives free memory back while more than keep bytes are
// committed, never memory behind a live allocation.
func alTrimTo(al *allocator, keep uint64) error { return al.TrimTo(keep) }

// alSetAccess sets dev's access to all the allocator's memory, now and
// later.
func alSetAccess(al *allocator, dev driver.DeviceID, acc driver.Access) error {
	return al.SetAccess(dev, acc)
}

// alAccess is dev's access to the allocator's memory.
func alAccess(al *allocator, dev driver.DeviceID) driver.Access { return al.Access(dev) }

// alCommitted is the memory behind the allocator.
func alCommitted(al *allocator) uint64 { return al.Stats().Committed }

// alLive is the number of live allocations.
func alLive(al *allocator) int { return al.Stats().Live }

// alChunkSize is the unit memory is committed in.
func alChunkSize(al *allocator) uint64 { return al.ChunkSize() }

// alBase is where offsets count from: the first of the allocator's ranges
// (a shareable allocator's only one).
func alBase(al *allocator) driver.Addr { return al.Ranges()[0].Base }

// alMax is the size of that range: what an importer reserves to map the
// pool's chunks at the same offsets.
func alMax(al *allocator) uint64 { return al.Ranges()[0].Size }

// alClose closes the allocator; it refuses while allocations are live.
func alClose(al *allocator) error { return al.Close() }

// alCheck checks the allocator.
func alCheck(al *allocator) error { return al.Check() }

// alExport exports and describes the chunks under the live allocation at p
// of a shareable allocator.
func alExport(al *allocator, p driver.Addr) (arena.Exported, error) { return al.Export(p) }

// alRanges lists every address range the allocator owns. They are reserved
// at creation, never move, and every address the allocator hands out lies
// in one of them.
func alRanges(al *allocator) []vaspace.Range { return al.Ranges() }
