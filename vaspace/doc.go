// Package vaspace owns the address space a driver hands out: it reserves
// large virtual ranges up front ([Space.Reserve]), carves sub-ranges out of
// them for the layers above ([Reservation.Carve]), tracks who still uses each
// range ([Occupant]), and gives the ranges back to the driver
// ([Reservation.Free], [Space.Close]).
//
// # States
//
// A reservation is live from Reserve until Free (or Close of its Space)
// succeeds, and freed after; a freed reservation refuses every call with
// driver.ErrClosed but still reports its Base, Size and Range. Inside a live
// reservation every granule is either free or carved; carving is bookkeeping
// only — it says which part of the range a layer above has claimed, not
// whether memory is mapped there (the driver and the mapping layer know that).
//
// A reservation made by [Space.ReserveFor] is kept by an [Owner] (an arena
// range, an imported pool): only the owner frees it ([Reservation.FreeFor]);
// [Reservation.Free] refuses it with driver.ErrBusy naming the owner, and
// [Space.Close] refuses while one is live, so nothing reached through the
// Space takes a range from under the layer that keeps it.
//
// # Invariants (checked by [Space.Check])
//
//   - A Space's live reservations are sorted by base and do not overlap.
//   - A reservation's carved ranges are sorted, do not overlap, lie inside
//     the reservation, and start and end on the driver's granularity; the
//     free extents are exactly the gaps between them.
//   - A reservation is freed only when none of its occupants reports a use
//     and the driver agreed to unreserve it, and one an owner keeps only by
//     that owner; a failed call changes nothing.
//   - Every live reservation is reserved in the driver too: Check asks the
//     driver's own record (driver.Books: one reservation of the same base
//     and size) or, for a driver without one, its Access at the range's
//     ends, and reports a range unreserved behind the space's back.
//
// # Locking
//
// Every type is safe for concurrent use. The lock order is: a reservation's
// hold lock ([Reservation.Hold]), then the Space's lock, then the
// reservation's own lock. Occupants are asked for their uses with no lock of
// this package held, so an occupant may call back into its reservation.
//
// # What it never does
//
// It never makes a system call and never touches memory: only drivers do.
// It never maps or unmaps (that is the mapping layer's job), and it never
// frees a range that an occupant reports in use.
package vaspace
