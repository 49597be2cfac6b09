// Package tensor owns typed, shaped views over memory that an arena or an
// allocator hands out (OnArena, Empty, or New over any Buffer): a dtype, a
// shape, strides and an offset laid over the bytes of a buffer, and the
// operations that make new views of the same bytes (Narrow, Slice,
// Reshape, Permute, Transpose), copy between layouts (Copy, Contiguous),
// and read and write elements (At, Set, Data). A Growable is a tensor that
// grows along its first axis inside an arena of its own; its base address
// never moves.
//
// # What a tensor is
//
// A Tensor is immutable metadata over a storage: the []byte its Buffer
// returned when the tensor was created, shared by every view derived from
// it. Element i0, i1, ... of a tensor lives at element offset
//
//	Offset + i0*Strides[0] + i1*Strides[1] + ...
//
// of the storage (offsets and strides count elements, not bytes). Every
// tensor keeps these invariants (checked by Check):
//
//   - len(Shape) == len(Strides); every dim is >= 0, every stride >= 0 and
//     Offset >= 0 (views never reverse an axis);
//   - every element lies inside the storage: when the tensor has elements,
//     (Offset + sum((Shape[d]-1)*Strides[d]) + 1) * Size <= len(storage);
//   - the storage starts at a multiple of the element size, so every element
//     is naturally aligned and Data can hand out a []T;
//   - no two indices of one tensor name the same element: the view
//     operations only select, reorder and regroup elements, never repeat
//     them (so a Copy into a tensor writes each element once).
//
// # Lifetimes
//
// A tensor's bytes are valid while its buffer is live: for OnArena, until
// the tensor's Release (the arena view ends, the arena may then shrink and
// unmap the memory); for Empty, until the tensor's Release (the allocation
// is freed); for a Growable, until the Growable's Release; for New, for as
// long as the caller keeps its buffer live. Views derived from a
// tensor share its storage and its lifetime: after the owner's Release
// every tensor over that storage refuses to touch memory (ErrClosed) rather
// than fault. Only the tensor that owns the storage releases it.
//
// While a tensor's memory is live nothing in the library unmaps, moves or
// write-protects it under the tensor: the arena view of an OnArena tensor
// or a Growable pins its chunks (the arena's Decommit, Move, SetAccess and
// Grant that would take them away are refused, ErrBusy), and the
// allocation of an Empty tensor is owned by the tensor
// (arena.Allocator.AllocOwned): al.Free(t.Addr()) is refused (ErrBusy),
// the allocator will not take write access from it, and only the tensor's
// Release frees it. Memory no device may write is refused when the tensor
// is made (ErrAccessDenied), so At and Set never fault.
//
// Access runs a function with a contiguous tensor's bytes while holding
// its memory as At, Set and Copy do for one element or one copy: the
// owner's Release and a lease's Revoke wait for it (neither may be
// called from inside it), and a released or revoked tensor answers
// ErrClosed without running it. It is how a long access (a transfer
// moving the bytes to or from a socket, package transfer) stays atomic
// with respect to the owner taking the memory back. Mapped reports
// whether a tensor's memory is a driver's mapping (it has a device
// address) rather than Go memory, the only kind handed to C for
// asynchronous use.
//
// A device tensor lies over memory the process cannot address (OnArena
// or Empty over a CUDA or AscendCL device, or the sim driver): it has a
// device address and a length, and no bytes. Its metadata and views work
// as for any tensor; At, Set, Data, Copy and Access refuse it
// (ErrUnsupported) rather than touch host memory that is not its own;
// AccessDevice holds it as Access does and hands out its device address
// and length, for the driver's copies (which the driver checks against
// its mappings and access). Addressable tells the two kinds apart.
//
// Metadata calls (Shape, Strides, Narrow, ...) are safe from any goroutine.
// Element reads and writes are plain memory accesses: concurrent writes to
// the same elements race exactly as they would on a Go slice.
//
// # Errors
//
// Every refusal is marked with one sentinel of the driver package and its
// message starts with "tensor: ", says what was asked and why it failed:
// ErrInvalid for a shape, index, dim, step, dtype or value no call could
// accept (out-of-range indices included: nothing is unmapped there, the
// index is simply not one of the tensor's); ErrMisaligned for a buffer
// that does not start at a multiple of the element size; ErrClosed for a
// released storage (or a revoked lease); ErrAccessDenied for a write to
// bytes its owner made read-only (NewLeasedReadOnly). Errors from the arena or allocator keep their own
// sentinel; At, Set, Data, Copy and Access refuse a device tensor with
// ErrUnsupported. A call that fails
// changes nothing: no view is made, no byte is written, no arena grows.
//
// # What it never does
//
// It never makes system calls and never maps, unmaps or protects memory: it
// only reads and writes bytes of buffers the arena or allocator hand out,
// and reaches them only through arena views (which keep the memory mapped
// while they are live). It never grows an arena it was not asked to, and it
// never reads or writes outside the elements of the tensor named in a call.
package tensor
