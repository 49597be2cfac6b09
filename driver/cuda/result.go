package cuda

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// result is what this package knows of one CUresult: its name in cuda.h,
// the contract's sentinel it is marked with, and a hint for the user.
type result struct {
	name     string
	sentinel error
	hint     string
}

// Hints shared by several codes.
const (
	hintSticky = "CUDA reports this kind of fault for every later call of the context: restart the process"
	hintNoGPU  = "check nvidia-smi: the driver sees no usable GPU"
	hintStub   = "this is the CUDA toolkit's link stub (lib64/stubs/libcuda.so), not the driver: install the NVIDIA driver, or put its libcuda.so.1 first on the library path"
)

// results maps every CUresult of CUDA 12's cuda.h to the contract. Codes
// the device raises when it faults (ECC, illegal instructions, failed
// launches, an unknown error) are driver.ErrDeviceFault: the context may be
// unusable. results_test.go checks the table code by code.
var results = map[cuResult]result{
	0:   {"CUDA_SUCCESS", nil, ""},
	1:   {"CUDA_ERROR_INVALID_VALUE", driver.ErrInvalid, ""},
	2:   {"CUDA_ERROR_OUT_OF_MEMORY", driver.ErrOutOfMemory, "release memory on the device, or use another device"},
	3:   {"CUDA_ERROR_NOT_INITIALIZED", driver.ErrInvalid, "cuInit was not called or failed"},
	4:   {"CUDA_ERROR_DEINITIALIZED", driver.ErrClosed, "the CUDA driver is shutting down"},
	5:   {"CUDA_ERROR_PROFILER_DISABLED", driver.ErrInvalid, ""},
	6:   {"CUDA_ERROR_PROFILER_NOT_INITIALIZED", driver.ErrInvalid, ""},
	7:   {"CUDA_ERROR_PROFILER_ALREADY_STARTED", driver.ErrInvalid, ""},
	8:   {"CUDA_ERROR_PROFILER_ALREADY_STOPPED", driver.ErrInvalid, ""},
	34:  {"CUDA_ERROR_STUB_LIBRARY", driver.ErrUnsupported, hintStub},
	46:  {"CUDA_ERROR_DEVICE_UNAVAILABLE", driver.ErrBusy, "the device is in an exclusive or prohibited compute mode (nvidia-smi -c)"},
	100: {"CUDA_ERROR_NO_DEVICE", driver.ErrNoDevice, hintNoGPU},
	101: {"CUDA_ERROR_INVALID_DEVICE", driver.ErrNoDevice, ""},
	102: {"CUDA_ERROR_DEVICE_NOT_LICENSED", driver.ErrUnsupported, "the GRID license is not applied"},
	200: {"CUDA_ERROR_INVALID_IMAGE", driver.ErrInvalid, ""},
	201: {"CUDA_ERROR_INVALID_CONTEXT", driver.ErrInvalid, ""},
	202: {"CUDA_ERROR_CONTEXT_ALREADY_CURRENT", driver.ErrInvalid, ""},
	205: {"CUDA_ERROR_MAP_FAILED", driver.ErrOutOfMemory, ""},
	206: {"CUDA_ERROR_UNMAP_FAILED", driver.ErrInvalid, ""},
	207: {"CUDA_ERROR_ARRAY_IS_MAPPED", driver.ErrBusy, ""},
	208: {"CUDA_ERROR_ALREADY_MAPPED", driver.ErrOverlap, ""},
	209: {"CUDA_ERROR_NO_BINARY_FOR_GPU", driver.ErrUnsupported, ""},
	210: {"CUDA_ERROR_ALREADY_ACQUIRED", driver.ErrBusy, ""},
	211: {"CUDA_ERROR_NOT_MAPPED", driver.ErrNotMapped, ""},
	212: {"CUDA_ERROR_NOT_MAPPED_AS_ARRAY", driver.ErrNotMapped, ""},
	213: {"CUDA_ERROR_NOT_MAPPED_AS_POINTER", driver.ErrNotMapped, ""},
	214: {"CUDA_ERROR_ECC_UNCORRECTABLE", driver.ErrDeviceFault, hintSticky},
	215: {"CUDA_ERROR_UNSUPPORTED_LIMIT", driver.ErrUnsupported, ""},
	216: {"CUDA_ERROR_CONTEXT_ALREADY_IN_USE", driver.ErrBusy, ""},
	217: {"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", driver.ErrUnsupported, ""},
	218: {"CUDA_ERROR_INVALID_PTX", driver.ErrInvalid, ""},
	219: {"CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", driver.ErrInvalid, ""},
	220: {"CUDA_ERROR_NVLINK_UNCORRECTABLE", driver.ErrDeviceFault, hintSticky},
	221: {"CUDA_ERROR_JIT_COMPILER_NOT_FOUND", driver.ErrUnsupported, ""},
	222: {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", driver.ErrUnsupported, ""},
	223: {"CUDA_ERROR_JIT_COMPILATION_DISABLED", driver.ErrUnsupported, ""},
	224: {"CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", driver.ErrUnsupported, ""},
	300: {"CUDA_ERROR_INVALID_SOURCE", driver.ErrInvalid, ""},
	301: {"CUDA_ERROR_FILE_NOT_FOUND", driver.ErrInvalid, ""},
	302: {"CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", driver.ErrUnsupported, ""},
	303: {"CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", driver.ErrUnsupported, ""},
	304: {"CUDA_ERROR_OPERATING_SYSTEM", driver.ErrDeviceFault, "an operating-system call inside the CUDA driver failed"},
	400: {"CUDA_ERROR_INVALID_HANDLE", driver.ErrBadHandle, ""},
	401: {"CUDA_ERROR_ILLEGAL_STATE", driver.ErrInvalid, ""},
	500: {"CUDA_ERROR_NOT_FOUND", driver.ErrInvalid, ""},
	600: {"CUDA_ERROR_NOT_READY", driver.ErrBusy, ""},
	700: {"CUDA_ERROR_ILLEGAL_ADDRESS", driver.ErrAccessDenied, hintSticky},
	701: {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", driver.ErrOutOfMemory, ""},
	702: {"CUDA_ERROR_LAUNCH_TIMEOUT", driver.ErrDeviceFault, hintSticky},
	703: {"CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", driver.ErrUnsupported, ""},
	704: {"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", driver.ErrBusy, ""},
	705: {"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", driver.ErrAccessDenied, ""},
	708: {"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", driver.ErrBusy, ""},
	709: {"CUDA_ERROR_CONTEXT_IS_DESTROYED", driver.ErrClosed, ""},
	710: {"CUDA_ERROR_ASSERT", driver.ErrDeviceFault, hintSticky},
	711: {"CUDA_ERROR_TOO_MANY_PEERS", driver.ErrUnsupported, ""},
	712: {"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", driver.ErrBusy, ""},
	713: {"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", driver.ErrInvalid, ""},
	714: {"CUDA_ERROR_HARDWARE_STACK_ERROR", driver.ErrDeviceFault, hintSticky},
	715: {"CUDA_ERROR_ILLEGAL_INSTRUCTION", driver.ErrDeviceFault, hintSticky},
	716: {"CUDA_ERROR_MISALIGNED_ADDRESS", driver.ErrMisaligned, hintSticky},
	717: {"CUDA_ERROR_INVALID_ADDRESS_SPACE", driver.ErrAccessDenied, hintSticky},
	718: {"CUDA_ERROR_INVALID_PC", driver.ErrDeviceFault, hintSticky},
	719: {"CUDA_ERROR_LAUNCH_FAILED", driver.ErrDeviceFault, hintSticky},
	720: {"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", driver.ErrInvalid, ""},
	800: {"CUDA_ERROR_NOT_PERMITTED", driver.ErrAccessDenied, ""},
	801: {"CUDA_ERROR_NOT_SUPPORTED", driver.ErrUnsupported, ""},
	802: {"CUDA_ERROR_SYSTEM_NOT_READY", driver.ErrUnsupported, "the system is not ready (on NVSwitch systems, is nvidia-fabricmanager running?)"},
	803: {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", driver.ErrUnsupported, "the kernel module and libcuda.so.1 are of different driver versions"},
	804: {"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", driver.ErrUnsupported, ""},
	805: {"CUDA_ERROR_MPS_CONNECTION_FAILED", driver.ErrDeviceFault, ""},
	806: {"CUDA_ERROR_MPS_RPC_FAILURE", driver.ErrDeviceFault, ""},
	807: {"CUDA_ERROR_MPS_SERVER_NOT_READY", driver.ErrBusy, ""},
	808: {"CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", driver.ErrBusy, ""},
	809: {"CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", driver.ErrBusy, ""},
	810: {"CUDA_ERROR_MPS_CLIENT_TERMINATED", driver.ErrDeviceFault, ""},
	811: {"CUDA_ERROR_CDP_NOT_SUPPORTED", driver.ErrUnsupported, ""},
	812: {"CUDA_ERROR_CDP_VERSION_MISMATCH", driver.ErrUnsupported, ""},
	900: {"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", driver.ErrInvalid, ""},
	901: {"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", driver.ErrInvalid, ""},
	902: {"CUDA_ERROR_STREAM_CAPTURE_MERGE", driver.ErrInvalid, ""},
	903: {"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", driver.ErrInvalid, ""},
	904: {"CUDA_ERROR_STREAM_CAPTURE_UNJOINED", driver.ErrInvalid, ""},
	905: {"CUDA_ERROR_STREAM_CAPTURE_ISOLATION", driver.ErrInvalid, ""},
	906: {"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", driver.ErrInvalid, ""},
	907: {"CUDA_ERROR_CAPTURED_EVENT", driver.ErrInvalid, ""},
	908: {"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", driver.ErrInvalid, ""},
	909: {"CUDA_ERROR_TIMEOUT", driver.ErrBusy, ""},
	910: {"CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", driver.ErrInvalid, ""},
	911: {"CUDA_ERROR_EXTERNAL_DEVICE", driver.ErrDeviceFault, hintSticky},
	912: {"CUDA_ERROR_INVALID_CLUSTER_SIZE", driver.ErrInvalid, ""},
	999: {"CUDA_ERROR_UNKNOWN", driver.ErrDeviceFault, ""},
}

// codeName spells r as cuda.h does, with its number: "CUDA_ERROR_OUT_OF_MEMORY (2)".
// A code the table lacks (a newer driver's) is named by the driver's own
// cuGetErrorName when name is not nil.
func codeName(r cuResult, name func(cuResult) string) string {
	if res, ok := results[r]; ok {
		return fmt.Sprintf("%s (%d)", res.name, r)
	}
	if name != nil {
		if n := name(r); n != "" {
			return fmt.Sprintf("%s (%d)", n, r)
		}
	}
	return fmt.Sprintf("CUresult %d", r)
}

// resultError is the error of call fn returning r (nil for CUDA_SUCCESS):
// "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)", marked with the code's
// sentinel (ErrDeviceFault for a code the table lacks) and its hint.
func resultError(fn string, r cuResult, name func(cuResult) string) error {
	if r == 0 {
		return nil
	}
	res, ok := results[r]
	sentinel := driver.ErrDeviceFault
	if ok {
		sentinel = res.sentinel
	}
	err := errors.Mark(errors.Newf("%s: %s", errors.Safe(fn), errors.Safe(codeName(r, name))), sentinel)
	if res.hint != "" {
		err = errors.WithHint(err, res.hint)
	}
	return err
}
