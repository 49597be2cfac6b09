package driver

import "fmt"

// Addr is a virtual address in the address space a driver manages: a process
// address for the host driver, a CUdeviceptr for CUDA. It is a number, not a
// pointer — holding one keeps nothing alive — and only a driver turns one
// into a memory access.
type Addr uint64

func (a Addr) String() string { return fmt.Sprintf("%#x", uint64(a)) }

// DeviceID names a device of one driver. IDs run from 0 to len(Devices())-1.
type DeviceID int32

// MaxDevices is the most devices one driver may report. Access rights of all
// devices over a granule fit in one 64-bit word (2 bits each); 32 is twice
// the largest single-host accelerator count in service today.
const MaxDevices = 32

// Kind says what stands behind a device.
type Kind uint8

const (
	KindHost   Kind = iota + 1 // a logical device on this machine's own memory
	KindSim                    // bookkeeping only: no memory behind it
	KindCUDA                   // an NVIDIA GPU through the CUDA driver API
	KindAscend                 // a Huawei Ascend NPU through AscendCL
)

func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindSim:
		return "sim"
	case KindCUDA:
		return "cuda"
	case KindAscend:
		return "ascend"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Device describes one device of a driver.
type Device struct {
	ID   DeviceID
	Name string
	Kind Kind
	// Capacity is how many bytes of chunks the device can hold at once.
	Capacity uint64
	// MinGranularity is the unit of chunk sizes, mapping addresses and
	// access ranges on this device: a power of two, at least the OS page.
	MinGranularity uint64
	// RecommendedGranularity is the chunk size the backend handles best
	// (2 MiB on current GPUs): a multiple of MinGranularity.
	RecommendedGranularity uint64
	// NUMANode is the host NUMA node the device's memory is bound to, or -1
	// when there is none or it is not known.
	NUMANode int
	// CopyAlign is the alignment asynchronous copies need for both
	// addresses (64 on AscendCL; 1 where there is no requirement).
	CopyAlign uint64
}

// Handle names a physical chunk inside one driver. Zero is never a valid
// handle, so a zero value is always caught.
type Handle uint64

// Access is what one device may do with a mapped range. The values are
// CUDA's CU_MEM_ACCESS_FLAGS (AscendCL uses the same numbers).
type Access uint8

const (
	AccessNone      Access = 0
	AccessRead      Access = 1
	AccessReadWrite Access = 3
)

// Valid reports whether a is one of the three defined access values.
func (a Access) Valid() bool {
	return a == AccessNone || a == AccessRead || a == AccessReadWrite
}

// Allows reports whether access a permits what want asks for.
func (a Access) Allows(want Access) bool { return a&want == want }

func (a Access) String() string {
	switch a {
	case AccessNone:
		return "none"
	case AccessRead:
		return "read"
	case AccessReadWrite:
		return "read-write"
	}
	return fmt.Sprintf("access(%d)", uint8(a))
}

// ChunkOptions are the properties of a physical chunk fixed at Create.
type ChunkOptions struct {
	// Shareable asks for a chunk that can later be exported to another
	// process (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). The host driver
	// gives such a chunk a memfd of its own so an export never exposes the
	// device heap.
	Shareable bool
}

// Feature names an optional part of the contract.
type Feature uint8

const (
	// FeatureHostAccess: Read and Write move bytes between Go memory and
	// accessible device memory. The sim driver lacks it.
	FeatureHostAccess Feature = iota + 1
	// FeatureShareable: Create honours ChunkOptions.Shareable.
	FeatureShareable
)

func (f Feature) String() string {
	switch f {
	case FeatureHostAccess:
		return "host-access"
	case FeatureShareable:
		return "shareable"
	case FeatureStreams:
		return "streams"
	}
	return fmt.Sprintf("feature(%d)", uint8(f))
}

// Driver is a memory backend. Every method is safe for concurrent use. A
// call that returns an error has changed nothing. The package doc lists the
// rules every implementation honours and the CUDA and AscendCL calls behind
// each method.
type Driver interface {
	// Name is a short name for messages and tables ("host", "sim", "cuda").
	Name() string
	// Devices lists the devices, Devices()[i].ID == i. The slice is a copy.
	Devices() []Device
	// Granularity is the unit of reservation sizes and addresses: the
	// largest MinGranularity of the devices.
	Granularity() uint64
	// Supports reports whether the driver implements an optional feature.
	Supports(Feature) bool

	// Reserve holds size bytes of address space aligned to align (0 means
	// Granularity()). hint, when not 0, is an address the caller would
	// like; the driver may place the range elsewhere.
	Reserve(size, align uint64, hint Addr) (Addr, error)
	// Unreserve returns a range Reserve gave, passed exactly as it was
	// returned; it refuses while anything inside is mapped.
	Unreserve(base Addr, size uint64) error

	// Create commits size bytes of physical memory on a device.
	Create(dev DeviceID, size uint64, opts ChunkOptions) (Handle, error)
	// Release gives up the handle. The memory returns to the device once
	// the chunk's last mapping is gone too.
	Release(h Handle) error

	// Map places the whole chunk at addr inside a reservation,
	// inaccessible to every device.
	Map(addr Addr, h Handle) error
	// Unmap removes the mapping that starts at addr and is size bytes
	// long, returning the range to the reserved state.
	Unmap(addr Addr, size uint64) error
	// SetAccess sets what dev may do over [addr, addr+size), which must be
	// mapped throughout (it may span several mappings).
	SetAccess(addr Addr, size uint64, dev DeviceID, a Access) error
	// Access reports what dev may do at the mapped address addr.
	Access(addr Addr, dev DeviceID) (Access, error)

	// Read copies len(p) bytes at addr into p; the range must be readable
	// by the host. Drivers without FeatureHostAccess return ErrUnsupported.
	Read(addr Addr, p []byte) error
	// Write copies p to addr; the range must be writable by the host.
	Write(addr Addr, p []byte) error

	// Close releases every chunk, unreserves every reservation and frees
	// the driver's own resources; later calls return ErrClosed. While
	// anything is mapped, or a pinned host buffer (HostAlloc) is live, it
	// refuses with ErrBusy naming what is live and changes nothing: memory
	// a slice or tensor still reaches must never be unmapped under it.
	// Unmapped chunks and empty reservations do not hold it open.
	Close() error
}

// HostMapper is implemented by drivers whose memory this process addresses
// directly (the host driver). It is what lets an arena hand out byte
// slices and tensors over device memory.
type HostMapper interface {
	// HostBytes returns [addr, addr+size) as a slice aliasing the memory.
	// The range must be mapped and readable by the host now. The slice is
	// valid only while it stays mapped: the caller (an arena view) must keep
	// it so; a touch after that faults.
	HostBytes(addr Addr, size uint64) ([]byte, error)
}

// HandleType is the kind of shareable handle a chunk is exported as. The
// values are CUDA's CUmemAllocationHandleType.
type HandleType uint8

const (
	// HandlePOSIXFD: a file descriptor, moved between processes over a Unix
	// socket (CUDA's CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; the host
	// driver's memfds).
	HandlePOSIXFD HandleType = 1
	// HandleToken: a 64-bit token the driver resolves itself (AscendCL's
	// aclrtMemExportToShareableHandle).
	HandleToken HandleType = 16
)

// Shareable is a chunk exported for another process.
type Shareable struct {
	Type HandleType
	// FD is the descriptor (HandlePOSIXFD); the holder closes it.
	FD int
	// Token is the token (HandleToken).
	Token uint64
	// Size is the chunk's size in bytes.
	Size uint64
}

// Sharing is implemented by drivers whose chunks can cross processes.
//
//	Sharing method  CUDA driver API                      AscendCL runtime
//	--------------  -----------------------------------  --------------------------------------
//	Export          cuMemExportToShareableHandle(POSIX)  aclrtMemExportToShareableHandle,
//	                                                     aclrtMemSetPidToShareableHandle
//	Import          cuMemImportFromShareableHandle       aclrtMemImportFromShareableHandle
//
// A chunk is exported at most once per process (aclrtMemExportToShareableHandle:
// one handle, one shareable handle); its memory goes back only when every process that
// holds it has released it and unmapped it.
//
// A descriptor (HandlePOSIXFD) gives its holder every file operation it
// allows, so an exported one must not allow resizing: a holder that shrank
// it would take the memory from under every other process's mappings
// (their data gone, a direct touch a SIGBUS). The host driver seals its
// memfds against shrinking and growing, and against further seals
// (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL), before the first export. Import
// refuses with ErrInvalid — the handle is well formed but no call could
// accept it — a descriptor that could be resized, one of another size than
// Shareable.Size, and one that is no memory at all, naming what is wrong;
// it keeps nothing, and the caller's descriptor stays open for the caller
// to close. drivertest checks these rules ("Sharing").
type Sharing interface {
	// Export returns a shareable handle for h, which was created with
	// ChunkOptions.Shareable. A second export of the same chunk is ErrBusy.
	Export(h Handle) (Shareable, error)
	// Import makes a chunk of this process from a shareable handle, on
	// dev; the caller keeps (and closes) its descriptor.
	Import(s Shareable, dev DeviceID) (Handle, error)
}

// AllowList is implemented by drivers whose shareable handles carry an
// importer allow-list that the vendor runtime enforces itself (AscendCL's
// aclrtMemSetPidToShareableHandle: a process not on the list cannot
// import the token, whoever sends it). physical.Chunk.Export and
// SetAllowedPIDs hand their list to it; drivers whose handles are
// descriptors (host, CUDA) leave the list to the process that sends them.
type AllowList interface {
	// AllowPIDs adds processes to those allowed to import chunk h, which
	// was exported. The runtime's list only grows: a process taken off the
	// caller's list is refused by the sender (physical's list), not by the
	// runtime.
	AllowPIDs(h Handle, pids []int) error
}
