// Package vmarena is the one-call way in: Open opens a driver (the host
// driver by default: this machine's memory, no GPU needed; or sim, cuda,
// acl) with its address space and physical memory, and an allocator on one
// of its devices, with the defaults the layers below choose; one Close
// closes all of it, and whatever was made from it, in order.
//
//	m, err := vmarena.Open(vmarena.Options{Capacity: 256 * vmarena.MiB})
//	...
//	defer m.Close()
//	p, err := m.Allocator().Alloc(64*vmarena.MiB, 0)
//
// The same memory makes the rest of the common paths, each closed by
// Close in turn (the latest made first, then the allocator, then the
// layers under them): NewArena (a growable range at a fixed base),
// NewKVCache, NewPool (stream-ordered allocation), NewMultiDeviceArena
// (chunks placed over several devices), NewSleep (tags that sleep and
// wake at the same addresses) and NewTransfer (an engine that puts and
// gets registered tensors to and from peers). Usage reads each device's
// used bytes and capacity from the driver's books (driver.Books), on any
// driver.
//
// It also exports the byte-size units (KiB..TiB, ParseSize, FormatSize),
// the sentinel errors to test with errors.Is, and the address and device
// types, so the common case needs this one import. What it does not cover
// — an allocator with other options, tensors, IPC, a KV cache's own
// knobs — comes from the packages below it (arena, tensor, ipc, kvcache),
// which this package only assembles: it owns no memory of its own, never
// touches memory itself, and closes only what it opened or made.
package vmarena
