package cuda

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestABILayout asserts the Go mirrors of the CUDA structs against the
// sizes, alignments and offsets in shared/CUDA_ABI.md (checked there
// against CUDA 12.6's cuda.h on x86-64 Linux). A wrong mirror makes CUDA
// read a field at the wrong place: a silent misbehaviour, never an error.
func TestABILayout(t *testing.T) {
	type field struct {
		name         string
		offset, size uintptr
	}
	check := func(t *testing.T, size, align uintptr, wantSize, wantAlign uintptr, fields []field, got []field) {
		t.Helper()
		require.Equal(t, wantSize, size, "size")
		require.Equal(t, wantAlign, align, "alignment")
		require.Equal(t, fields, got)
	}

	var loc memLocation
	check(t, unsafe.Sizeof(loc), unsafe.Alignof(loc), 8, 4,
		[]field{{"type", 0, 4}, {"id", 4, 4}},
		[]field{{"type", unsafe.Offsetof(loc.typ), unsafe.Sizeof(loc.typ)}, {"id", unsafe.Offsetof(loc.id), unsafe.Sizeof(loc.id)}})

	var p memAllocationProp
	check(t, unsafe.Sizeof(p), unsafe.Alignof(p), 32, 8,
		[]field{{"type", 0, 4}, {"requestedHandleTypes", 4, 4}, {"location", 8, 8}, {"win32HandleMetaData", 16, 8}, {"allocFlags", 24, 8}},
		[]field{
			{"type", unsafe.Offsetof(p.typ), unsafe.Sizeof(p.typ)},
			{"requestedHandleTypes", unsafe.Offsetof(p.requestedHandleTypes), unsafe.Sizeof(p.requestedHandleTypes)},
			{"location", unsafe.Offsetof(p.location), unsafe.Sizeof(p.location)},
			{"win32HandleMetaData", unsafe.Offsetof(p.win32HandleMetaData), unsafe.Sizeof(p.win32HandleMetaData)},
			{"allocFlags", unsafe.Offsetof(p.allocFlags), unsafe.Sizeof(p.allocFlags)},
		})
	f := p.allocFlags
	base := unsafe.Offsetof(p.allocFlags)
	require.Equal(t,
		[]field{{"compressionType", 24, 1}, {"gpuDirectRDMACapable", 25, 1}, {"usage", 26, 2}, {"reserved", 28, 4}},
		[]field{
			{"compressionType", base + unsafe.Offsetof(f.compressionType), unsafe.Sizeof(f.compressionType)},
			{"gpuDirectRDMACapable", base + unsafe.Offsetof(f.gpuDirectRDMACapable), unsafe.Sizeof(f.gpuDirectRDMACapable)},
			{"usage", base + unsafe.Offsetof(f.usage), unsafe.Sizeof(f.usage)},
			{"reserved", base + unsafe.Offsetof(f.reserved), unsafe.Sizeof(f.reserved)},
		})

	var a memAccessDesc
	check(t, unsafe.Sizeof(a), unsafe.Alignof(a), 12, 4,
		[]field{{"location", 0, 8}, {"flags", 8, 4}},
		[]field{{"location", unsafe.Offsetof(a.location), unsafe.Sizeof(a.location)}, {"flags", unsafe.Offsetof(a.flags), unsafe.Sizeof(a.flags)}})
	var arr [2]memAccessDesc
	require.Equal(t, uintptr(12), uintptr(unsafe.Pointer(&arr[1]))-uintptr(unsafe.Pointer(&arr[0])), "arrays of CUmemAccessDesc are packed at a 12-byte stride")

	// The scalars.
	require.Equal(t, uintptr(4), unsafe.Sizeof(cuResult(0)), "CUresult")
	require.Equal(t, uintptr(4), unsafe.Sizeof(cuDevice(0)), "CUdevice")
	require.Equal(t, uintptr(8), unsafe.Sizeof(cuDeviceptr(0)), "CUdeviceptr")
	require.Equal(t, uintptr(8), unsafe.Sizeof(cuHandle(0)), "CUmemGenericAllocationHandle")
	require.Equal(t, uintptr(8), unsafe.Sizeof(cuContext(0)), "CUcontext")
}

// TestEnumValues pins the enum values the driver passes to those of
// CUDA_ABI.md.
func TestEnumValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"CU_MEM_HANDLE_TYPE_NONE", handleTypeNone, 0},
		{"CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", handleTypePOSIXFD, 1},
		{"CU_MEM_LOCATION_TYPE_DEVICE", locationTypeDevice, 1},
		{"CU_MEM_ALLOCATION_TYPE_PINNED", allocationPinned, 1},
		{"CU_MEM_ALLOC_GRANULARITY_MINIMUM", granularityMinimum, 0},
		{"CU_MEM_ALLOC_GRANULARITY_RECOMMENDED", granularityRecommended, 1},
		{"CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", attrVMMSupported, 102},
		{"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", attrPOSIXFDSupported, 103},
		{"CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", attrPoolsSupported, 115},
	} {
		require.Equal(t, c.want, c.got, c.name)
	}
}
