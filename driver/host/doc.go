// Package host is the driver on this machine's own memory: real virtual
// memory, real commits, real faults, no accelerator needed. It is the
// embedded default and the driver the layers above are tested on.
//
// Its devices are logical. Each has a heap — a memfd committed range by
// range with fallocate — and a capacity, so out of memory, placement and
// ranges spanning devices are real and testable on one machine.
//
// Out of memory is an error, never the OOM killer (memory_linux.go):
// fallocate of shmem does not refuse what the machine lacks, the kernel
// reclaims and then kills a process to find it. So New refuses capacities
// that together exceed MemTotal + SwapTotal (or the memory limit of the
// process's cgroup, when lower), and Create refuses, before fallocate, a
// chunk larger than what is available now (MemAvailable + SwapFree, and
// the cgroup's room under its limit), both with ErrOutOfMemory naming the
// figures. Memory another process takes between that reading and the
// commit is beyond any check here.
//
//	operation   system calls
//	----------  ------------------------------------------------------------------
//	Reserve     mmap(hint or NULL, size+align, PROT_NONE,
//	            MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), trimmed with munmap to
//	            the alignment; a hint is tried first with MAP_FIXED_NOREPLACE
//	Create      sysinfo(2), or /proc/meminfo when that is short (above); a
//	            first-fit range of the device's memfd heap, committed with
//	            fallocate; a shareable chunk gets a memfd of its own, so an
//	            export never exposes the heap, sealed with F_ADD_SEALS
//	            (shrink, grow, seal) so no process that holds it can resize it
//	Import      fstat, F_GET_SEALS and F_GETFL: a memfd of the chunk's size,
//	            committed throughout, sealed so, open read-write, or
//	            ErrInvalid; the chunk keeps a duplicate (F_DUPFD_CLOEXEC)
//	Map         mmap(addr, size, PROT_NONE, MAP_SHARED|MAP_FIXED, fd, off) —
//	            only ever inside a reservation this driver owns
//	SetAccess   mprotect with the widest access any device has; per-device
//	            rights are the library's to check. When a granule first becomes
//	            accessible its page tables are filled with
//	            madvise(MADV_POPULATE_READ/WRITE) unless Options.NoPopulate
//	Unmap       mmap(addr, size, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|
//	            MAP_NORESERVE|MAP_FIXED): back to reserved, the range stays ours
//	Release     fallocate(PUNCH_HOLE) of the heap range, or close of the
//	            chunk's own memfd — once the handle is released and its last
//	            mapping is gone
//	Unreserve   munmap
//	Read/Write  a copy under runtime/debug.SetPanicOnFault, after the ledger
//	            checked the range is mapped and accessible: a fault that still
//	            happens is ErrAccessDenied, never a crash
//
// Why populate at the grant and not at Map: the kernel does not populate a
// PROT_NONE mapping (MAP_POPULATE on one leaves every page to fault later;
// measured here: 515 faults for 2 MiB), and a mapping may only be touched
// once access is granted. Populating at the grant costs about as much as
// MAP_POPULATE on a readable mapping and removes the first-touch faults,
// which on these machines cost about 10 ms per 2 MiB.
//
// Kernel mappings are a limited resource (vm.max_map_count, 65,530 per
// process). Heap ranges are taken first-fit from the lowest offset, so
// chunks created one after another lie side by side in the heap; mapped
// side by side in a reservation with the same access, the kernel merges
// them into one mapping.
//
// NUMA: New reads the nodes from /sys/devices/system/node (directories
// node<N> with a cpulist, those listed in has_memory) and, on a machine
// with several, assigns logical devices round robin — device i to the
// (i mod nodes)-th node — and binds each heap there: the memfd is mapped
// PROT_NONE a window at a time, mbind(MPOL_BIND) sets the file's shared
// policy, and the window is unmapped before anything is committed. shmem
// keeps that policy on the file by offset, so every later fallocate of the
// heap (and of a punched range committed again) takes pages from the node,
// with no system call added to Create; a shareable chunk's own memfd is
// bound the same way when it is created. mbind was chosen over
// set_mempolicy around fallocate because it binds once per heap and needs
// no locked OS thread. Device.NUMANode reports the node; a heap that
// cannot be bound reports -1, or fails New under Options.RequireNUMA. With
// one node nothing is bound and NUMANode is -1 (RequireNUMA binds to it
// anyway). MPOL_BIND does not fall back to other nodes: a device's
// capacity should fit in its node's share of memory.
//
// The driver needs Linux. Elsewhere the package compiles, with the same
// types and methods, and New answers driver.ErrUnsupported (host_other.go).
//
// The host driver never maps, unmaps or protects memory outside the
// reservations it made, and never hands the heap's file descriptor out.
package host
