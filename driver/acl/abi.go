package acl

import "structs"

// The C types of the AscendCL runtime this package passes, mirrored from
// the facts checked against the public CANN header acl_rt.h (ACL 1.17.0)
// on x86-64 Linux; Ascend hosts are usually aarch64, where these LP64
// layouts are the same. abi_test.go asserts every size and offset. Every
// struct is zeroed before it is filled: padding and reserved fields must
// be 0.

// aclError is the return of every call: 0 is success.
type aclError int32

// memLocation is aclrtMemLocation: 8 bytes, align 4 — id first, the
// reverse of CUDA's CUmemLocation.
type memLocation struct {
	_   structs.HostLayout
	id  uint32
	typ int32 // aclrtMemLocationType
}

// physicalMemProp is aclrtPhysicalMemProp: 32 bytes, align 8.
type physicalMemProp struct {
	_              structs.HostLayout
	handleType     int32 // aclrtMemHandleType
	allocationType int32 // aclrtMemAllocationType
	memAttr        int32 // aclrtMemAttr
	location       memLocation
	_              [4]byte // padding before reserve
	reserve        uint64
}

// memAccessDesc is aclrtMemAccessDesc: 24 bytes, align 4 — flags first.
type memAccessDesc struct {
	_        structs.HostLayout
	flags    int32 // aclrtMemAccessFlags
	location memLocation
	rsv      [12]byte
}

// Enum values.
const (
	locationTypeDevice = 1 // ACL_MEM_LOCATION_TYPE_DEVICE
	allocationPinned   = 0 // ACL_MEM_ALLOCATION_TYPE_PINNED
	handleTypeNone     = 0 // ACL_MEM_HANDLE_TYPE_NONE: export takes no other

	memAttrHBMHuge = 4 // ACL_HBM_MEM_HUGE: device memory in 2 MiB pages
	memAttrHBM     = 1 // ACL_HBM_MEM, the aclrtMemAttr aclrtGetMemInfo reports device memory for

	granularityMinimum     = 0 // ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM
	granularityRecommended = 1 // ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED

	// aclrtMemcpyKind.
	memcpyHostToDevice   = 1
	memcpyDeviceToHost   = 2
	memcpyDeviceToDevice = 3

	// exportPIDValidation is the export flag that keeps the importer
	// allow-list on (0; ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION 1
	// would let any process import the token).
	exportPIDValidation = 0

	// copyAlign is the alignment AscendCL's async copies need for both
	// addresses.
	copyAlign = 64
)
