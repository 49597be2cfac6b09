// Package physical owns the physical memory of one driver's devices: it
// creates chunks ([Memory.Create]), counts per device how much memory they
// hold ([Memory.Usage]), and returns that memory when a chunk is both
// released and unmapped everywhere.
//
// # Chunk states
//
//	live      created; the handle is valid and the chunk may be mapped.
//	released  Release gave up the handle; the chunk can no longer be mapped,
//	          but its memory stays committed while mappings of it remain.
//	returned  released and its last mapping dropped: the memory is back on
//	          the device, and the chunk is no longer counted or listed.
//
// The mapping layer brackets every mapping of a chunk with an acquire
// (before the driver maps it) and a drop (after the driver unmapped it), so
// that Used agrees with the driver, which returns the memory at the same
// moment: when the handle is released and the last mapping is gone. That
// count is not part of the public API: mapping reaches it through
// internal/mapref, so no caller can drop a reference it never took and make
// a device's usage lie.
//
// # Invariants (checked by [Memory.Check])
//
//   - Every chunk not yet returned is listed once, under its handle; a
//     listed chunk is live, or released with at least one mapping.
//   - A device's Used is the sum of the sizes of its listed chunks, never
//     above its Capacity nor above its Peak; Chunks counts them.
//   - A failed call changes nothing, but for one case: Release of a chunk
//     whose handle the driver no longer holds (released through the driver
//     behind this package's back) lets the chunk go, since the driver has.
//   - Every listed chunk is held by the driver, so a device's Used is never
//     above what the driver reports (Check compares them where the driver
//     reports its Used; the four drivers of this module do), and every
//     listed chunk not released is a live handle of that device and size
//     in the driver's own record (driver.Books, which the four drivers
//     keep): a chunk released through the driver is reported even while a
//     mapping keeps its memory.
//
// # Locking
//
// A Memory and all its chunks share one mutex; every method is safe for
// concurrent use. The driver is called with that mutex held (drivers never
// call back).
//
// # What it never does
//
// It never makes a system call and never touches memory: only drivers do.
// It never maps or unmaps (the mapping layer does, through the driver), and
// it never rounds a size up: a size that is not a multiple of the device's
// granularity is an error.
package physical
