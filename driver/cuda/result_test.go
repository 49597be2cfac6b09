package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestResultTable checks the CUresult table code by code against a second,
// independent statement of it: the codes CUDA_ABI.md lists by name, and
// for every sentinel the codes marked with it. A code added to one and
// not the other, or marked twice, fails here.
func TestResultTable(t *testing.T) {
	abi := map[cuResult]string{ // shared/CUDA_ABI.md, "results"
		0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
		3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
		101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT", 208: "CUDA_ERROR_ALREADY_MAPPED",
		211: "CUDA_ERROR_NOT_MAPPED", 400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
		700: "CUDA_ERROR_ILLEGAL_ADDRESS", 800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED",
		999: "CUDA_ERROR_UNKNOWN", 34: "CUDA_ERROR_STUB_LIBRARY",
	}
	for code, name := range abi {
		require.Equal(t, name, results[code].Name, "code %d", code)
	}
	bySentinel := map[error][]cuResult{
		driver.ErrInvalid:      {1, 3, 5, 6, 7, 8, 200, 201, 202, 206, 218, 219, 300, 301, 401, 500, 713, 720, 900, 901, 902, 903, 904, 905, 906, 907, 908, 910, 912},
		driver.ErrOutOfMemory:  {2, 205, 701},
		driver.ErrClosed:       {4, 709},
		driver.ErrUnsupported:  {34, 102, 209, 215, 217, 221, 222, 223, 224, 302, 303, 703, 711, 801, 802, 803, 804, 811, 812},
		driver.ErrBusy:         {46, 207, 210, 216, 600, 704, 708, 712, 807, 808, 809, 909},
		driver.ErrNoDevice:     {100, 101},
		driver.ErrOverlap:      {208},
		driver.ErrNotMapped:    {211, 212, 213},
		driver.ErrDeviceFault:  {214, 220, 304, 702, 710, 714, 715, 718, 719, 805, 806, 810, 911, 999},
		driver.ErrBadHandle:    {400},
		driver.ErrAccessDenied: {700, 705, 717, 800},
		driver.ErrMisaligned:   {716},
	}
	seen := map[cuResult]bool{0: true}
	for sentinel, codes := range bySentinel {
		for _, code := range codes {
			require.False(t, seen[code], "code %d listed twice", code)
			seen[code] = true
			res, ok := results[code]
			require.True(t, ok, "code %d is not in the table", code)
			require.Equal(t, sentinel, res.Sentinel, "code %d (%s)", code, res.Name)
			require.True(t, strings.HasPrefix(res.Name, "CUDA_ERROR_"), "code %d is named %q", code, res.Name)

			err := resultError("cuMemCreate", code, nil)
			drivertest.RequireIs(t, err, sentinel, fmt.Sprintf("cuMemCreate: %s (%d)", res.Name, code))
		}
	}
	require.Len(t, results, len(seen), "every code of the table is in exactly one sentinel's list")
	require.NoError(t, resultError("cuInit", 0, nil))
}

// TestUnknownResult: a code the table lacks is a device fault, named by
// the driver's own cuGetErrorName when it has one.
func TestUnknownResult(t *testing.T) {
	err := resultError("cuMemMap", 1234, nil)
	drivertest.RequireIs(t, err, driver.ErrDeviceFault, "cuMemMap: CUresult 1234")
	err = resultError("cuMemMap", 1234, func(r cuResult) string { return "CUDA_ERROR_FROM_THE_FUTURE" })
	drivertest.RequireIs(t, err, driver.ErrDeviceFault, "CUDA_ERROR_FROM_THE_FUTURE (1234)")
	require.Contains(t, errors.FlattenHints(resultError("cuInit", 34, nil)), "link stub")
}
