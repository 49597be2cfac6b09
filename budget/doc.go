// Package budget is one device's memory budget shared by several
// processes: each member holds part of a fixed capacity, between a floor
// and a ceiling it was given, and one that needs more than is free takes
// what the others hold idle by asking them to give it back.
//
// # The design: books in a shared file, no broker
//
// The books live in one small file (a few pages, best on a tmpfs such as
// /dev/shm or $XDG_RUNTIME_DIR) that every member maps shared: the
// capacity, and for each of at most MaxMembers members its name, process
// ID, floor, ceiling, hold (what it has committed) and idle (the part of
// its hold it could give back: cached prefix pages, free chunks, sleeping
// tags). A broker was the other choice; it was not taken because a broker
// is a process whose death takes every member's books with it (someone
// must notice, start another and rebuild the books from the members),
// and it adds a socket round trip to every commit. Shared books have no
// single process whose death matters, and a commit costs one uncontended
// file lock and a copy of a few kilobytes.
//
//   - The lock. An open-file-description lock (F_OFD_SETLK) on the file's
//     first byte, taken by a Book's descriptor behind an in-process mutex.
//     The kernel lets it go when the holder's descriptor closes, so a
//     member killed while holding it blocks nobody; one stopped while it
//     holds it (or something that is not a member holding the byte)
//     leaves a caller with ErrBusy after 5 s of trying, not blocked.
//   - A member killed mid-update. The state is written twice over, to
//     alternating copies, each with a generation and a CRC-32C: a write
//     goes to the copy not read, so one torn by a kill fails its CRC and
//     the reader takes the other, one generation older, which is exactly
//     the books before the write that never finished.
//   - A member that dies. Each member holds a lock of its own, on byte
//     liveBase+slot, through a descriptor only it has. The kernel releases
//     it when the process dies or the member closes: liveness is a lock
//     the kernel keeps, with no process ID to be reused (a pidfd opened
//     from a recorded ID could name a later process). A member whose lock
//     is free is dead; whoever finds it so (a join, an ask that falls
//     short, a listing) clears its record and its hold returns to the
//     budget. Until then its hold still counts: a dead member can delay
//     memory, never over-commit it.
//   - Asking for memory back. Beside the books each member has a mailbox:
//     a request counter, the bytes asked, and an acknowledgement counter,
//     all futex words in the shared mapping. An asker posts a request and
//     wakes the member's futex; the member's goroutine calls the GiveBack
//     callback it registered at Join (which frees what it can and calls
//     Release), then acknowledges. The asker trusts no acknowledgement:
//     it reads the books again. A member that does not answer within
//     Options.GiveBackWait leaves the asker with ErrOutOfMemory naming
//     every member, what each holds and which did not give back.
//   - Garbage. Every value read from the file is bounded and checked
//     before use: a copy whose CRC fails is taken as torn; a copy
//     whose CRC holds but whose values break an invariant (a hold above
//     its ceiling, holds summing over the capacity, a name that is not
//     UTF-8, a generation past 2^62 that would outrank every later
//     write, a capacity other than the one Open read) is a corrupt book,
//     an ErrInvalid error naming the first broken rule, and every call
//     refuses until it is repaired: never a crash, never an over-commit.
//     Mailbox values are clamped to the capacity. A file cut short under
//     the mapping makes the next access fault; that is an ErrInvalid
//     error too (the fault is recovered, not the SIGBUS that would end
//     the process), and a file replaced at the book's path is refused to
//     a join, whose liveness lock would otherwise land on the new file.
//     A free slot whose liveness lock something holds is passed over.
//     The file's permissions decide who may join; a member that
//     writes well-formed lies within the rules (taking a hold it does not
//     use) is beyond what shared books can refuse, as it is beyond a
//     driver's: the books guarantee consistency, not honesty.
//
// # The invariants
//
// For every member floor ≤ ceiling ≤ capacity, idle ≤ hold ≤ ceiling, and
// over all members Σ max(hold, floor) ≤ capacity: the floors are
// guaranteed (nobody can take memory a member could not get back up to
// its floor) and the device is never over-committed. Acquire and
// SetLimits keep them or fail with nothing changed; the decoder refuses books
// that break them.
//
// It owns the books and the asking, nothing else: it never commits or
// frees device memory (the members do, after Acquire and before
// Release), and it imports only driver and internal packages. A
// kvcache.Cache joins through package budget/kvmember, whose give-back
// lowers the cache's budget by what it can spare; a driver's device
// through NewDevice, whose chunks are acquired from a member as they are
// created and given back as their memory returns to the device, so that
// processes each with a driver of their own never over-commit the device
// they share. Linux only: elsewhere Open answers ErrUnsupported.
package budget
