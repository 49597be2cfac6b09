// Package multidev owns arenas whose memory comes from several devices
// behind one contiguous address range, as CUDA's virtual memory management
// allows (cuMemAddressReserve, cuMemCreate on each device, cuMemMap,
// cuMemSetAccess per device and range): one reservation, chunks created on
// whichever device a placement policy names, access granted per device and
// per range instead of all-to-all peer access, and the backing of a range
// moved to another device at the same addresses.
//
// An Arena is the library's growable range (arena.Arena, over the one
// core arena.Sparse) with a placement that spreads its chunks over
// devices. The core commits, rolls back, records grants, moves chunks and
// closes; this package adds the placement policies, reachability — no
// grant or migration that leaves a device holding access to memory it
// cannot reach — and the peer access that grants need. Its chunks are all
// ChunkSize bytes, mapped back to back from the base, so chunk i covers
// [i×ChunkSize, (i+1)×ChunkSize).
//
// # Invariants (checked by Check)
//
//   - the arena's: chunks contiguous from offset 0, Len <= committed <= Max,
//     the page table holding exactly the arena's chunks with the grants
//     recorded for them, in the table and in the driver alike;
//   - a device holds a grant on memory of another device only when the
//     driver reports that it can reach it (CanAccessPeer); Grant enabled
//     peer access for that pair before granting.
//
// # Grants
//
// A fresh chunk is inaccessible to every device, its own included: access
// is given by Grant, per device and per range, and is remembered per chunk.
// Migrate keeps it (the new chunks get the same grants); Trim forgets it
// with the chunks it returns, so memory committed again starts
// inaccessible.
//
// # Locking
//
// grants serialises Grant, Migrate and Close, the calls that check
// reachability against the layout and then change grants or the layout, so
// no chunk moves between the check and the change; it is taken before the
// core's locks. The core orders reads and writes with a migration: writes
// are held off while it copies, reads while it swaps mappings (see
// arena.Sparse).
//
// # What it never does
//
// It never touches memory itself (the driver moves every byte), never maps
// outside its own reservation, never grants a device access to memory the
// driver says it cannot reach, and never enables peer access for a pair no
// grant needs: there is no all-to-all mode. A call that fails changes
// nothing in the arena (peer access Grant or Migrate enabled before failing
// stays enabled: the driver offers no way back, and it grants nothing by
// itself).
package multidev
