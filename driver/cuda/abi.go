package cuda

import "structs"

// The C types of the CUDA driver API this package passes, mirrored from
// the facts checked against CUDA 12.6's cuda.h on x86-64 Linux (LP64; the
// layouts are the same on aarch64). abi_test.go asserts every size and
// offset; cudah_test.go (build tag cudah) checks them against an installed
// cuda.h. Every struct is zeroed before it is filled: reserved fields must
// be 0.

// cuResult is CUresult.
type cuResult int32

// Scalars: CUdevice is an int, CUdeviceptr and CUmemGenericAllocationHandle
// are 64-bit unsigned, CUcontext, CUstream and CUevent are pointers. The
// bindings in lib.go are written with these names, so each argument's
// width is the one CUDA_ABI.md gives (abi_test.go).
type (
	cuDevice    = int32
	cuDeviceptr = uint64
	cuHandle    = uint64 // CUmemGenericAllocationHandle
	cuContext   = uintptr
	cuStream    = uintptr
	cuEvent     = uintptr
)

// memLocation is CUmemLocation: 8 bytes, align 4.
type memLocation struct {
	_   structs.HostLayout
	typ int32 // CUmemLocationType
	id  int32
}

// allocFlags is the allocFlags member of CUmemAllocationProp: 8 bytes.
type allocFlags struct {
	_                    structs.HostLayout
	compressionType      uint8
	gpuDirectRDMACapable uint8
	usage                uint16
	reserved             [4]uint8
}

// memAllocationProp is CUmemAllocationProp: 32 bytes, align 8.
type memAllocationProp struct {
	_                    structs.HostLayout
	typ                  int32 // CUmemAllocationType
	requestedHandleTypes int32 // CUmemAllocationHandleType
	location             memLocation
	win32HandleMetaData  uintptr // void*
	allocFlags           allocFlags
}

// memAccessDesc is CUmemAccessDesc: 12 bytes, align 4 (arrays are packed at
// a 12-byte stride).
type memAccessDesc struct {
	_        structs.HostLayout
	location memLocation
	flags    int32 // CUmemAccess_flags
}

// Enum values.
const (
	handleTypeNone    = 0 // CU_MEM_HANDLE_TYPE_NONE
	handleTypePOSIXFD = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

	locationTypeDevice = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	allocationPinned   = 1 // CU_MEM_ALLOCATION_TYPE_PINNED

	granularityMinimum     = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	granularityRecommended = 1 // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED

	attrVMMSupported     = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrPOSIXFDSupported = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
	attrPoolsSupported   = 115 // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED

	streamNonBlocking  = 1 // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy default stream
	eventDisableTiming = 2 // CU_EVENT_DISABLE_TIMING
)
