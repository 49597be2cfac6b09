package acl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestResultTable checks the aclError table code by code against a second
// statement of it: the codes ACL_ABI.md lists by name, and for every
// sentinel the codes marked with it.
func TestResultTable(t *testing.T) {
	abi := map[aclError]string{ // shared/ACL_ABI.md, "errors"
		100000: "ACL_ERROR_INVALID_PARAM", 200000: "ACL_ERROR_BAD_ALLOC", 200001: "ACL_ERROR_API_NOT_SUPPORT",
		200002: "ACL_ERROR_INVALID_DEVICE", 200003: "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
		207001: "ACL_ERROR_RT_MEMORY_ALLOCATION", 207006: "ACL_ERROR_RT_NO_PERMISSION",
		// rt_error_codes.h of CANN 8 (ACL 1.17): 207019 is no device fault
		// but a driver too old for the call; 507051.. took the codes
		// older headers gave 207019 and 207020.
		207018: "ACL_ERROR_RT_DEVICE_OOM", 207019: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT_UPDATE_OP",
		207020: "ACL_ERROR_RT_TIMEOUT", 507051: "ACL_ERROR_RT_SEND_MSG", 507052: "ACL_ERROR_RT_COPY_DATA",
		507053: "ACL_ERROR_RT_DEVICE_MEM_ERROR", 507054: "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR",
		507055: "ACL_ERROR_RT_SUSPECT_DEVICE_MEM_ERROR", 507056: "ACL_ERROR_RT_LINK_ERROR",
		507057: "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR",
	}
	for code, name := range abi {
		require.Equal(t, name, results[code].Name, "code %d", code)
	}
	span := func(from, to aclError, except ...aclError) []aclError {
		var out []aclError
	next:
		for c := from; c <= to; c++ {
			for _, x := range except {
				if c == x {
					continue next
				}
			}
			out = append(out, c)
		}
		return out
	}
	concat := func(lists ...[]aclError) []aclError {
		var out []aclError
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}
	bySentinel := map[error][]aclError{
		driver.ErrInvalid: concat(
			span(100000, 100045, 100002, 100024, 100025, 100026, 100029, 100030, 100031, 100033, 100036, 100037, 100039, 100042, 100044),
			span(107000, 107018, 107001, 107008, 107017),
			[]aclError{200004, 207013, 507003, 507005, 507027, 507031, 507038, 507039, 507040, 507041}),
		driver.ErrBusy: {100002, 100030, 100031, 100033, 100036, 100042, 100044, 107019, 207014, 207015,
			507002, 507004, 507006, 507024, 507028, 507046, 507047},
		driver.ErrClosed:       {100037},
		driver.ErrUnsupported:  {100024, 100025, 100026, 100029, 100039, 200001, 200006, 200007, 207000, 207019, 507008, 507009},
		driver.ErrNoDevice:     {107001, 200002, 207004},
		driver.ErrMisaligned:   {107008, 200003},
		driver.ErrBadHandle:    {107017, 200005},
		driver.ErrOutOfMemory:  {200000, 207001, 207005, 207007, 207008, 207009, 207010, 207011, 207012, 207018, 300000, 507032},
		driver.ErrAccessDenied: {207006},
		driver.ErrDeviceFault: concat([]aclError{107020, 207002, 207003, 207016, 207017, 207020},
			span(500000, 500005),
			span(507000, 507057, 507002, 507003, 507004, 507005, 507006, 507008, 507009, 507024, 507027, 507028, 507031, 507032,
				507038, 507039, 507040, 507041, 507046, 507047),
			[]aclError{507899, 507900, 507901}),
	}
	seen := map[aclError]bool{0: true}
	for sentinel, codes := range bySentinel {
		for _, code := range codes {
			require.False(t, seen[code], "code %d listed twice", code)
			seen[code] = true
			res, ok := results[code]
			require.True(t, ok, "code %d is not in the table", code)
			require.Equal(t, sentinel, res.Sentinel, "code %d (%s)", code, res.Name)
			require.True(t, strings.HasPrefix(res.Name, "ACL_ERROR_"), "code %d is named %q", code, res.Name)
			drivertest.RequireIs(t, resultError("aclrtMallocPhysical", code, ""), sentinel,
				fmt.Sprintf("aclrtMallocPhysical: %s (%d)", res.Name, code))
		}
	}
	require.Len(t, results, len(seen), "every code of the table is in exactly one sentinel's list")
	require.NoError(t, resultError("aclInit", 0, ""))
}

// TestUnknownResult: a code the table lacks is a device fault; the
// runtime's own message is kept.
func TestUnknownResult(t *testing.T) {
	err := resultError("aclrtMapMem", 999999, "something broke")
	drivertest.RequireIs(t, err, driver.ErrDeviceFault, "aclrtMapMem: aclError 999999")
	require.Contains(t, errors.FlattenDetails(err), "something broke")
}
