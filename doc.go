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
// It also exports the byte-size units (KiB..TiB, ParseSize, FormatSize),
// the sentinel errors to test with errors.Is, and the address and device
// types, so the common case needs this one import. Everything else — an
// allocator with other options, several arenas over several devices,
// pools, sleep and wake, KV caches of other shapes — is built from the
// packages below it (arena, multidev, pool, sleep, kvcache, tensor), which
// this package only assembles: it owns no memory of its own, and a
// Memory's Close closes only what the Memory made.
package vmarena
