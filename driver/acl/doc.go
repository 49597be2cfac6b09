// Package acl is the driver for Huawei Ascend NPUs: the driver contract
// over AscendCL's physical-memory API, with libascendcl.so loaded at run
// time (github.com/ebitengine/purego): no cgo and no CANN toolkit to
// build, and on a machine without the runtime Open says so ("no Ascend
// runtime found").
//
// It owns the binding — symbols looked up once per library (a missing
// group makes its feature unsupported), struct mirrors asserted against
// shared/ACL_ABI.md, the table marking every aclError with a sentinel and
// its name ("aclrtMallocPhysical: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)",
// with the runtime's own message from aclGetRecentErrMsg in the details),
// and a context per NPU (aclrtSetDevice, aclrtCreateContext), made current
// on the calling OS thread for every call, the caller's current context
// set back after it (aclrtGetCurrentContext; Open and Close too: a thread
// with none keeps the driver's, as AscendCL cannot unset one) — and
// absorbs the ways AscendCL
// differs from the contract, so the layers above never see them:
//
//   - aclrtReserveMemAddress takes no alignment and no hint: a range that
//     must be aligned is reserved larger and its aligned part used; the
//     hint is ignored (the contract allows it).
//   - aclrtUnmapMem and aclrtReleaseMemAddress take no size: the record
//     checks the size, the driver passes the start.
//   - Export gives a 64-bit token with an allow-list of importing
//     processes enforced by the runtime (aclrtMemSetPidToShareableHandle):
//     the driver implements driver.AllowList, and physical.Chunk.Export
//     hands it the chunk's list.
//   - A process cannot import a token it exported (one handle, one
//     shareable handle per process): such an Import gives a second chunk
//     over the same memory handle, freed when both are released.
//   - aclrtMapMem maps a handle whole, so an import is proved to hold the
//     size it claims by one scratch map.
//   - aclrtMapMem's mapping is accessible to the handle's NPU at once: the
//     driver maps with aclrtMemMapNoAccess, or, with a CANN that lacks it,
//     with aclrtMapMem and an aclrtMemSetAccess taking the access back
//     before the record is unlocked (a refusal undoes the map).
//   - aclrtMemSetAccess takes exactly one whole mapping (aclrtMapMem's
//     virPtr and size): the record keeps each NPU's access per granule and
//     the driver's copies obey it, while each mapping's hardware access
//     for an NPU is the widest the NPU has anywhere in the mapping.
//   - A reservation is bound to the memory of one NPU, local or imported,
//     never both (aclrtMapMem's rule): Map refuses the rest with
//     ErrUnsupported (ReservationsBindOneDevice), so a range over several
//     NPUs needs a reservation per NPU.
//   - Allow-lists hold host process IDs (aclrtDeviceGetBareTgid): an
//     importer learns its own with HostPID and sends it to the exporter;
//     inside a container getpid and SO_PEERCRED give other IDs, which
//     AscendCL refuses.
//   - Async copies need 64-byte aligned addresses: Devices report
//     CopyAlign 64 and the contract's check refuses the rest at once.
//
// The calls behind each part of the contract:
//
//	contract           AscendCL
//	-----------------  --------------------------------------------------------
//	Open, Devices      aclInit, aclrtGetDeviceCount, aclrtSetDevice,
//	                   aclrtCreateContext, aclrtGetMemInfo(ACL_HBM_MEM),
//	                   aclrtMemGetAllocationGranularity, aclrtGetSocName
//	Reserve/Unreserve  aclrtReserveMemAddress(size+align, 0, NULL) /
//	                   aclrtReleaseMemAddress(start)
//	Create/Release     aclrtMallocPhysical(PINNED, HBM huge pages, DEVICE id) /
//	                   aclrtFreePhysical
//	Map/Unmap          aclrtMemMapNoAccess(addr, size, 0, handle), or aclrtMapMem
//	                   and aclrtMemSetAccess(none) / aclrtUnmapMem(addr)
//	SetAccess          aclrtMemSetAccess({flags, DEVICE id}, 1) over each whole
//	                   mapping whose widest access changes
//	Read/Write         aclrtMemcpy(DEVICE_TO_HOST / HOST_TO_DEVICE)
//	Export/Import      aclrtMemExportToShareableHandle, aclrtMemSetPidToShareableHandle,
//	                   aclrtMemImportFromShareableHandle; HostPID
//	                   aclrtDeviceGetBareTgid
//	streams            aclrtCreateStream, aclrtDestroyStream, aclrtMemcpyAsync,
//	                   aclrtMemsetAsync, waited for with aclrtRecordEvent and
//	                   aclrtSynchronizeEvent, or aclrtSynchronizeStream
//	peers              aclrtDeviceCanAccessPeer, aclrtDeviceEnablePeerAccess
//	SyncDevice         the driver's own streams drained, then
//	                   aclrtSynchronizeDevice in dev's context: every stream of
//	                   the NPU, torch_npu's too (sleep.DeviceSyncer); a library
//	                   without it: ErrUnsupported
//	HostAlloc/HostFree aclrtMallocHost / aclrtFreeHost
//	Close              aclrtDestroyContext, aclrtResetDevice (aclFinalize is
//	                   never called: no aclInit would work after it)
//
// What is proven where: the tests run against a C stand-in of
// libascendcl.so built by the tests (driver/internal/standin). No NPU has
// run this code yet; TestHardware* run wherever one is.
package acl
