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
// NewArena and NewKVCache make arenas and KV caches on the same memory,
// which Close closes too (the latest made first, then the allocator, then
// the layers under them).
//
// It also exports the byte-size units (KiB..TiB, ParseSize, FormatSize),
// the sentinel errors to test with errors.Is, and the address and device
// types, so the common case needs this one import. Everything else — an
// allocator with other options, arenas over several devices, pools,
// sleep and wake, tensors — comes from the packages below it (arena,
// multidev, pool, sleep, tensor), which this package only assembles: it
// owns no memory of its own, never touches memory itself, and closes only
// what it opened or made.
package vmarena
