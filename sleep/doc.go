// Package sleep gives a model's accelerator memory back and takes it again
// at the same addresses, as vLLM's sleep mode and SGLang's
// torch_memory_saver do: allocations are made under a tag ("weights",
// "kv_cache"); Sleep copies a tag's live allocations to host memory or a
// file (or discards them), then unmaps and releases all its physical
// memory while keeping its address space; Wake commits memory again, maps
// it at the same addresses with the same access and restores the bytes,
// so raw pointers and captured CUDA graphs stay valid.
//
// # How
//
// Each tag has an arena.Allocator of its own (the one that gives memory
// back from anywhere) over its own reserved ranges, so a woken tag's
// memory is exactly what it had. Under the allocator sits a driver of the
// tag's (tagDriver) that passes every call to the real driver and records
// each chunk, mapping and access grant. Sleep gives the real memory back
// beneath the allocator's unchanged books; Wake makes it again from the
// records. Sleep backs up only live allocations, then trims the free
// chunks, so Wake commits only chunks that hold them.
//
// # Guarantees
//
//   - Sleep synchronizes the device (a driver that is a DeviceSyncer:
//     every driver of this module is; cuda and acl wait for every stream
//     of the device, streams this library never made included) and the
//     streams named with AddStream before it copies or unmaps anything.
//   - Sleep gives back every byte of the tag's memory: the real driver's
//     used bytes drop by the tag's AwakeBytes.
//   - Sleep and Wake are idempotent: a second call is a no-op.
//   - A Wake that fails part-way (out of memory, a refused map or grant, a
//     restore that fails) undoes what it did and leaves the tag asleep
//     with its backup whole; nothing leaks.
//   - Host backups are the driver's pinned host buffers where it has
//     streams (cuMemHostAlloc), for allocations of 1 MiB or more, and Go
//     memory for smaller ones; all are freed at Wake, unless
//     Options.HostCache lets the Manager keep pinned ones, up to that many
//     bytes, for the next sleep of the same sizes (pinning is what a
//     sleep costs most on a GPU; Close gives them back). A File backup is
//     one file in Options.BackupDir, removed at Wake and Close; the
//     CRC-32C of every 64 MiB of each allocation is kept as it is
//     written, and Wake restores a piece only once it reads back the
//     same: a file changed or cut short since is ErrInvalid naming it,
//     and the tag sleeps on.
//   - Free in a sleeping tag drops that allocation's backup and releases
//     nothing: the tag's memory went back once, at Sleep.
//   - Memory a tag frees stays committed in it for its next allocations,
//     but never holds another tag out: an Alloc or Wake that finds the
//     device out of memory gives back the free chunks of every other tag
//     it may touch (not one a Sleep or Wake is busy with) and tries once
//     more. Trim gives a tag's free chunks back on demand.
//   - A Wake that restored a tag whole succeeds: a File backup removed
//     from its directory meanwhile is read from the file held open; a
//     backup that cannot be given back afterwards is an error that says
//     the tag is awake with its contents.
//   - Alloc in a sleeping tag is refused (ErrBusy naming the tag).
//   - Memory handed out as a tensor (Tensor: a uint8 tensor over one
//     allocation, under a tensor.Lease the Manager holds) is never
//     touched through it once it may go: Sleep of its tag, before it
//     backs up or unmaps anything, Free of the allocation, before it
//     goes, and Close revoke the lease, waiting for the accesses in
//     flight (a transfer moving bytes into it, which transfer.Register
//     makes hold the tensor's access); afterwards the tensor answers
//     ErrClosed. A woken tag hands out new tensors; the old stay closed.
//   - A Sleep or Wake holds the Manager's lock only to claim its tags
//     and to record each one's new state: while it copies, unmaps and
//     commits, calls on other tags (Alloc, Free, Stats, Check, another
//     Sleep or Wake) go on, and calls on its own tags wait for it to
//     return, as they did when the lock was held throughout.
//
// # What it never does
//
// It never touches device memory but through the driver's Read and Write
// (so Host and File modes need driver.FeatureHostAccess; the sim driver
// sleeps in Discard mode only) — Tensor hands the caller the mapped bytes
// themselves (driver.HostMapper), under a lease — never closes the driver
// it was given, and never changes an address a caller holds.
//
// Under the invariants build tag every change runs Check and panics at the
// first broken invariant.
package sleep
