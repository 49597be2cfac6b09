// Package multidev owns arenas whose memory comes from several devices
// behind one contiguous address range, as CUDA's virtual memory management
// allows (seed 004, §E.4 and §E.7): one reservation, chunks created on
// whichever device a placement policy names, access granted per device and
// per range instead of all-to-all peer access, and the backing of a range
// moved to another device at the same addresses.
//
// An Arena owns its reservation, the page table over it and every chunk
// mapped in it. Its chunks are all ChunkSize bytes, mapped back to back from
// the base, so chunk i covers [i×ChunkSize, (i+1)×ChunkSize).
//
// # Invariants (checked by Check)
//
//   - chunks are contiguous from offset 0; committed is the end of the last;
//     Len <= committed <= Max;
//   - the page table holds exactly the arena's chunks, each at its offset,
//     each chunk on the device the arena records for it (Layout);
//   - what each device may do at every granule is the grant recorded for
//     its chunk, in the table and in the driver alike;
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
// Four locks, always taken in this order: ops serialises the calls that
// change the arena's shape or grants (Grow, Shrink, Trim, Grant, Migrate,
// Close); writing and moving are read-write locks that Write (writing and
// moving) and Read (moving) take for reading, and that Migrate takes for
// writing — writing while it copies the bytes, so no write is lost, and
// moving while it swaps the mappings, so no read sees a range half moved;
// mu guards the arena's books and is held only briefly, so queries and the
// start of reads are not held up while a migration copies.
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
