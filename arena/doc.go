// Package arena owns the library's growable memory: address ranges
// reserved up front in which physical chunks are committed and given back
// on demand, at addresses that never move.
//
// # One core
//
// Sparse is the one core under everything that grows. It reserves Max
// bytes of address space and lets any chunk-aligned sub-range be committed
// (chunks created on the devices a Placement chooses, mapped, access
// granted in one call a device) or decommitted (unmapped, released), in
// any order. Inside the package a commit may cut its piece into chunks of
// any multiple of ChunkSize, and whole chunks may move from one range to
// another (an unmap and a map, no new memory: the allocator's relocation).
// Its books edit in O(log n) whatever is committed. A commit of
// several chunks that fails part-way is rolled back whole; views pin what
// they cover; access is granted per device, for the whole range (SetAccess)
// or for a range of chunks (Grant); Move replaces the chunks under a range
// by chunks on another device at the same addresses; and a range may
// borrow chunks another range owns (Borrow, or BorrowEach for chunks
// that are not side by side there; stitching, migration, the KV cache's
// shared prefixes), which pins them there. Ranges that share a Pool keep
// the chunks they decommit, unreleased, and commit from them before they
// create any: a map instead of a create, an unmap instead of a release.
// A view also pins its
// chunks against Move and against losing write access (see below). Nothing else in the library reserves, commits or rolls back by
// itself:
//
//   - Arena is Sparse used as a prefix: Grow, Shrink, Resize, Append, Trim,
//     Len; tensors grow in one (package tensor).
//   - Allocator carves two Sparse ranges (small and large requests) into
//     many allocations, commits where blocks are handed out in chunks cut
//     to what they will hold, moves wholly free chunks to where they are
//     needed and gives back the rest from anywhere, with a third range to
//     stitch free chunks into when no hole has room for a request.
//   - Package multidev is an Arena whose Placement spreads it over
//     devices, with reachability checked for grants and migrations.
//
// # The states of a chunk-sized piece of a range
//
//	uncommitted  reserved address space only; any access faults
//	committed    a chunk backs it, mapped, with the access the range
//	             granted (accessible for those devices, mapped only for none)
//
// A committed piece is owned (the range created the chunk and releases it
// when it decommits) or borrowed (another range owns it and cannot
// decommit, move or close it until it is given back).
//
// # What a live view pins
//
// Memory that a live view covers is never unmapped, made unwritable or
// moved out from under it: while a view lives, decommit, shrink, Move and
// a SetAccess or Grant that would leave its chunks writable by no device
// are refused with ErrBusy naming the chunk, and nothing changes. A
// read-only view (ViewReadOnly) pins the same way but lets the access drop
// to read-only. An allocator's live allocations pin the same way, and an
// allocation a handle owns (AllocOwned) is freed only by its Release.
// docs/arena.md has the rules in full.
//
// # Ownership
//
// An owner's range is its own: no type here hands out a Sparse, a page
// table or a chunk of a range it owns, so no caller can grow, shrink,
// decommit, close or place anything in it behind the owner's back. A
// tensor over an allocation goes through the allocation (tensor.Empty).
// Its reservations are kept for it (vaspace.Space.ReserveFor): reached
// through the Space, one can be neither freed nor given a page table of
// another's (mapping.New refuses it). What a caller does through the
// driver itself — a chunk mapped into a range, one of a range's chunks
// released or unmapped — Sparse.Check and Allocator.Check report: their
// page tables compare themselves with the driver's own record
// (driver.Books).
//
// A nil or zero Sparse, Arena, Allocator or View answers ErrInvalid from
// every method that returns an error, whatever the arguments, and a
// harmless zero from accessors.
//
// # What it never does
//
// It never touches memory itself (views hand out the driver's bytes), never
// maps outside its own reservations, never rounds a size silently (chunk
// sizes are checked against the driver's granularity), and a call that
// fails changes nothing — but for memory a failed allocation gave back to
// make room (Allocator.Alloc, as PyTorch does before it reports out of
// memory), and for memory given back before the driver refused to give
// back more (an unmap, a release or a reservation's free refused part-way
// through Decommit, Trim or Close: what is unmapped cannot be mapped back
// with its bytes). Then the books say what was given back, and the same
// call finishes the job once the driver accepts it; a chunk whose release
// was refused is released by the range's next Decommit or Close, and the
// scratch range of a Move the driver would not unmap is closed by the
// range's next Move, Decommit or Close.
//
// Under the invariants build tag every change runs the structure's checks
// and panics at the first broken invariant (internal/invariants).
package arena
