package acl

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestABILayout asserts the Go mirrors of the AscendCL structs against
// the sizes, alignments and offsets in shared/ACL_ABI.md (checked there
// against acl_rt.h). A wrong mirror makes the runtime read a field at the
// wrong place: a silent misbehaviour, never an error.
func TestABILayout(t *testing.T) {
	type field struct {
		name         string
		offset, size uintptr
	}
	var loc memLocation
	require.Equal(t, uintptr(8), unsafe.Sizeof(loc))
	require.Equal(t, uintptr(4), unsafe.Alignof(loc))
	require.Equal(t, []field{{"id", 0, 4}, {"type", 4, 4}},
		[]field{{"id", unsafe.Offsetof(loc.id), unsafe.Sizeof(loc.id)}, {"type", unsafe.Offsetof(loc.typ), unsafe.Sizeof(loc.typ)}})

	var p physicalMemProp
	require.Equal(t, uintptr(32), unsafe.Sizeof(p))
	require.Equal(t, uintptr(8), unsafe.Alignof(p))
	require.Equal(t,
		[]field{{"handleType", 0, 4}, {"allocationType", 4, 4}, {"memAttr", 8, 4}, {"location", 12, 8}, {"reserve", 24, 8}},
		[]field{
			{"handleType", unsafe.Offsetof(p.handleType), unsafe.Sizeof(p.handleType)},
			{"allocationType", unsafe.Offsetof(p.allocationType), unsafe.Sizeof(p.allocationType)},
			{"memAttr", unsafe.Offsetof(p.memAttr), unsafe.Sizeof(p.memAttr)},
			{"location", unsafe.Offsetof(p.location), unsafe.Sizeof(p.location)},
			{"reserve", unsafe.Offsetof(p.reserve), unsafe.Sizeof(p.reserve)},
		})

	var a memAccessDesc
	require.Equal(t, uintptr(24), unsafe.Sizeof(a))
	require.Equal(t, uintptr(4), unsafe.Alignof(a))
	require.Equal(t, []field{{"flags", 0, 4}, {"location", 4, 8}, {"rsv", 12, 12}},
		[]field{
			{"flags", unsafe.Offsetof(a.flags), unsafe.Sizeof(a.flags)},
			{"location", unsafe.Offsetof(a.location), unsafe.Sizeof(a.location)},
			{"rsv", unsafe.Offsetof(a.rsv), unsafe.Sizeof(a.rsv)},
		})
	require.Equal(t, uintptr(4), unsafe.Sizeof(aclError(0)))
}

// TestEnumValues pins the enum values the driver passes to ACL_ABI.md's.
func TestEnumValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"ACL_MEM_LOCATION_TYPE_DEVICE", locationTypeDevice, 1},
		{"ACL_MEM_ALLOCATION_TYPE_PINNED", allocationPinned, 0},
		{"ACL_MEM_HANDLE_TYPE_NONE", handleTypeNone, 0},
		{"ACL_HBM_MEM_HUGE", memAttrHBMHuge, 4},
		{"granularity MINIMUM", granularityMinimum, 0},
		{"granularity RECOMMENDED", granularityRecommended, 1},
		{"export flags default (PID validation on)", exportPIDValidation, 0},
	} {
		require.Equal(t, c.want, c.got, c.name)
	}
}
