// Package driver is the contract between vmarena and a memory backend: the
// few operations a device must offer so that address space and physical
// memory can be managed separately, as CUDA's virtual memory management and
// AscendCL's physical-memory APIs do.
//
// It owns the vocabulary every layer shares — [Addr], [DeviceID], [Device],
// [Handle], [Access] — the [Driver] interface, the sentinel errors every
// backend reports failures with, and the argument checks that make those
// errors the same whichever backend runs. It never touches memory itself:
// only the packages below it (driver/host, driver/sim, and later driver/cuda
// and driver/acl) make memory system calls or accelerator driver calls.
//
// # Memory states
//
// Every granule of a reservation is in exactly one state:
//
//	reserved    address space held, nothing behind it; any access faults.
//	            Reached by Reserve, and by Unmap.
//	mapped      a physical chunk backs it, but no device may touch it.
//	            Reached by Map, and by SetAccess(..., AccessNone) for the
//	            last device that had access.
//	accessible  mapped, and readable or read-write for an explicit set of
//	            devices. Reached by SetAccess.
//
// Physical chunks live apart from mappings: one chunk may be mapped at several
// addresses at once (aliasing), and its memory is returned only when its
// handle is released and its last mapping is gone.
//
// # Rules every driver honours
//
//   - Chunk sizes, mapping addresses and access ranges are multiples of the
//     device's minimum granularity; a wrong one is [ErrMisaligned] naming the
//     granularity, never a silent round-up. Reservation sizes and addresses
//     are multiples of the driver's [Granularity] (the largest minimum
//     granularity of its devices), so any device's chunk fits anywhere.
//   - Create commits memory: running out is [ErrOutOfMemory] at Create,
//     never a fault later, and it changes nothing.
//   - A chunk is mapped whole at one address (CUDA requires offset 0,
//     AscendCL requires the whole handle) and unmapped whole: the mapping is
//     the unit of Unmap, and Unmap of part of one is [ErrPartial].
//   - Map never overwrites: over a mapped granule it is [ErrOverlap], outside
//     a reservation [ErrNotReserved], with a released chunk [ErrBadHandle].
//   - A new mapping is inaccessible to every device until SetAccess grants
//     access, and only the device named gets it.
//   - Unreserve takes exactly a range that Reserve returned and refuses
//     ([ErrBusy]) while anything inside it is mapped.
//   - Every call after Close is [ErrClosed]. A failed call changes nothing.
//   - A driver that keeps a record of its own answers from it ([Books]:
//     every driver of this module), so that the layers' Checks compare
//     their books with the driver's and report what a caller did through
//     the driver behind their backs.
//
// # How the contract maps onto the accelerator APIs
//
//	Driver method        CUDA driver API                          AscendCL runtime
//	-------------------  ---------------------------------------  ------------------------------------
//	Devices              cuDeviceGetCount, cuDeviceGetName,       aclrtGetDeviceCount, aclrtGetMemInfo,
//	                     cuDeviceTotalMem,                        aclrtMemGetAllocationGranularity
//	                     cuMemGetAllocationGranularity
//	                     (MINIMUM 0, RECOMMENDED 1)               (MINIMUM 0, RECOMMENDED 1)
//	Reserve              cuMemAddressReserve(size, align, hint)   aclrtReserveMemAddress(size, 0, NULL)
//	                                                              (alignment must be 0: the driver
//	                                                              over-reserves and trims to align)
//	Unreserve            cuMemAddressFree(ptr, size)              aclrtReleaseMemAddress(ptr)
//	Create               cuMemCreate(size, prop{PINNED, DEVICE    aclrtMallocPhysical(size, prop{DEVICE
//	                     id, POSIX_FD when shareable})            id, PINNED, HBM_MEM_HUGE})
//	Release              cuMemRelease                             aclrtFreePhysical
//	Map                  cuMemMap(ptr, size, 0, handle)           aclrtMemMapNoAccess(ptr, size, 0, handle)
//	                                                              (or aclrtMapMem, then access revoked;
//	                                                              one NPU's memory per reservation)
//	Unmap                cuMemUnmap(ptr, size)                    aclrtUnmapMem(ptr)
//	SetAccess            cuMemSetAccess(ptr, size,                aclrtMemSetAccess(ptr, size,
//	                     {DEVICE id, flags}, 1)                   {flags, DEVICE id}, 1), whole mappings
//	Access               cuMemGetAccess(&flags, {DEVICE id}, ptr) aclrtMemGetAccess(ptr, {id, DEVICE})
//	Read, Write          cuMemcpyDtoH_v2, cuMemcpyHtoD_v2         aclrtMemcpy(DEVICE_TO_HOST / HOST_TO_DEVICE)
//	Close                cuMemUnmap, cuMemRelease,                aclrtUnmapMem, aclrtFreePhysical,
//	                     cuMemAddressFree of what is left         aclrtReleaseMemAddress of what is left
//
// Access values are CUDA's own (none 0, read 1, read-write 3), which AscendCL
// shares. The host driver implements the same table with mmap, memfd,
// fallocate and mprotect; its package doc has its own table.
package driver
