package cuda

import (
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
)

// Hints shared by several codes.
const (
	hintSticky = "CUDA reports this kind of fault for every later call of the context: restart the process"
	hintNoGPU  = "check nvidia-smi: the driver sees no usable GPU"
	hintStub   = "this is the CUDA toolkit's link stub (lib64/stubs/libcuda.so), not the driver: install the NVIDIA driver, or put its libcuda.so.1 first on the library path"
)

// results maps every CUresult of CUDA 12's cuda.h to the contract. Codes
// the device raises when it faults (ECC, illegal instructions, failed
// launches, an unknown error) are driver.ErrDeviceFault: the context may be
// unusable. result_test.go checks the table code by code.
var results = map[cuResult]accel.Code{
	0:   code("CUDA_SUCCESS", nil, ""),
	1:   code("CUDA_ERROR_INVALID_VALUE", driver.ErrInvalid, ""),
	2:   code("CUDA_ERROR_OUT_OF_MEMORY", driver.ErrOutOfMemory, "release memory on the device, or use another device"),
	3:   code("CUDA_ERROR_NOT_INITIALIZED", driver.ErrInvalid, "cuInit was not called or failed"),
	4:   code("CUDA_ERROR_DEINITIALIZED", driver.ErrClosed, "the CUDA driver is shutting down"),
	5:   code("CUDA_ERROR_PROFILER_DISABLED", driver.ErrInvalid, ""),
	6:   code("CUDA_ERROR_PROFILER_NOT_INITIALIZED", driver.ErrInvalid, ""),
	7:   code("CUDA_ERROR_PROFILER_ALREADY_STARTED", driver.ErrInvalid, ""),
	8:   code("CUDA_ERROR_PROFILER_ALREADY_STOPPED", driver.ErrInvalid, ""),
	34:  code("CUDA_ERROR_STUB_LIBRARY", driver.ErrUnsupported, hintStub),
	46:  code("CUDA_ERROR_DEVICE_UNAVAILABLE", driver.ErrBusy, "the device is in an exclusive or prohibited compute mode (nvidia-smi -c)"),
	100: code("CUDA_ERROR_NO_DEVICE", driver.ErrNoDevice, hintNoGPU),
	101: code("CUDA_ERROR_INVALID_DEVICE", driver.ErrNoDevice, ""),
	102: code("CUDA_ERROR_DEVICE_NOT_LICENSED", driver.ErrUnsupported, "the GRID license is not applied"),
	200: code("CUDA_ERROR_INVALID_IMAGE", driver.ErrInvalid, ""),
	201: code("CUDA_ERROR_INVALID_CONTEXT", driver.ErrInvalid, ""),
	202: code("CUDA_ERROR_CONTEXT_ALREADY_CURRENT", driver.ErrInvalid, ""),
	205: code("CUDA_ERROR_MAP_FAILED", driver.ErrOutOfMemory, ""),
	206: code("CUDA_ERROR_UNMAP_FAILED", driver.ErrInvalid, ""),
	207: code("CUDA_ERROR_ARRAY_IS_MAPPED", driver.ErrBusy, ""),
	208: code("CUDA_ERROR_ALREADY_MAPPED", driver.ErrOverlap, ""),
	209: code("CUDA_ERROR_NO_BINARY_FOR_GPU", driver.ErrUnsupported, ""),
	210: code("CUDA_ERROR_ALREADY_ACQUIRED", driver.ErrBusy, ""),
	211: code("CUDA_ERROR_NOT_MAPPED", driver.ErrNotMapped, ""),
	212: code("CUDA_ERROR_NOT_MAPPED_AS_ARRAY", driver.ErrNotMapped, ""),
	213: code("CUDA_ERROR_NOT_MAPPED_AS_POINTER", driver.ErrNotMapped, ""),
	214: code("CUDA_ERROR_ECC_UNCORRECTABLE", driver.ErrDeviceFault, hintSticky),
	215: code("CUDA_ERROR_UNSUPPORTED_LIMIT", driver.ErrUnsupported, ""),
	216: code("CUDA_ERROR_CONTEXT_ALREADY_IN_USE", driver.ErrBusy, ""),
	217: code("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", driver.ErrUnsupported, ""),
	218: code("CUDA_ERROR_INVALID_PTX", driver.ErrInvalid, ""),
	219: code("CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", driver.ErrInvalid, ""),
	220: code("CUDA_ERROR_NVLINK_UNCORRECTABLE", driver.ErrDeviceFault, hintSticky),
	221: code("CUDA_ERROR_JIT_COMPILER_NOT_FOUND", driver.ErrUnsupported, ""),
	222: code("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", driver.ErrUnsupported, ""),
	223: code("CUDA_ERROR_JIT_COMPILATION_DISABLED", driver.ErrUnsupported, ""),
	224: code("CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", driver.ErrUnsupported, ""),
	300: code("CUDA_ERROR_INVALID_SOURCE", driver.ErrInvalid, ""),
	301: code("CUDA_ERROR_FILE_NOT_FOUND", driver.ErrInvalid, ""),
	302: code("CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", driver.ErrUnsupported, ""),
	303: code("CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", driver.ErrUnsupported, ""),
	304: code("CUDA_ERROR_OPERATING_SYSTEM", driver.ErrDeviceFault, "an operating-system call inside the CUDA driver failed"),
	400: code("CUDA_ERROR_INVALID_HANDLE", driver.ErrBadHandle, ""),
	401: code("CUDA_ERROR_ILLEGAL_STATE", driver.ErrInvalid, ""),
	500: code("CUDA_ERROR_NOT_FOUND", driver.ErrInvalid, ""),
	600: code("CUDA_ERROR_NOT_READY", driver.ErrBusy, ""),
	700: code("CUDA_ERROR_ILLEGAL_ADDRESS", driver.ErrAccessDenied, hintSticky),
	701: code("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", driver.ErrOutOfMemory, ""),
	702: code("CUDA_ERROR_LAUNCH_TIMEOUT", driver.ErrDeviceFault, hintSticky),
	703: code("CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", driver.ErrUnsupported, ""),
	704: code("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", driver.ErrBusy, ""),
	705: code("CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", driver.ErrAccessDenied, ""),
	708: code("CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", driver.ErrBusy, ""),
	709: code("CUDA_ERROR_CONTEXT_IS_DESTROYED", driver.ErrClosed, ""),
	710: code("CUDA_ERROR_ASSERT", driver.ErrDeviceFault, hintSticky),
	711: code("CUDA_ERROR_TOO_MANY_PEERS", driver.ErrUnsupported, ""),
	712: code("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", driver.ErrBusy, ""),
	713: code("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", driver.ErrInvalid, ""),
	714: code("CUDA_ERROR_HARDWARE_STACK_ERROR", driver.ErrDeviceFault, hintSticky),
	715: code("CUDA_ERROR_ILLEGAL_INSTRUCTION", driver.ErrDeviceFault, hintSticky),
	716: code("CUDA_ERROR_MISALIGNED_ADDRESS", driver.ErrMisaligned, hintSticky),
	717: code("CUDA_ERROR_INVALID_ADDRESS_SPACE", driver.ErrAccessDenied, hintSticky),
	718: code("CUDA_ERROR_INVALID_PC", driver.ErrDeviceFault, hintSticky),
	719: code("CUDA_ERROR_LAUNCH_FAILED", driver.ErrDeviceFault, hintSticky),
	720: code("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", driver.ErrInvalid, ""),
	800: code("CUDA_ERROR_NOT_PERMITTED", driver.ErrAccessDenied, ""),
	801: code("CUDA_ERROR_NOT_SUPPORTED", driver.ErrUnsupported, ""),
	802: code("CUDA_ERROR_SYSTEM_NOT_READY", driver.ErrUnsupported, "the system is not ready (on NVSwitch systems, is nvidia-fabricmanager running?)"),
	803: code("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", driver.ErrUnsupported, "the kernel module and libcuda.so.1 are of different driver versions"),
	804: code("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", driver.ErrUnsupported, ""),
	805: code("CUDA_ERROR_MPS_CONNECTION_FAILED", driver.ErrDeviceFault, ""),
	806: code("CUDA_ERROR_MPS_RPC_FAILURE", driver.ErrDeviceFault, ""),
	807: code("CUDA_ERROR_MPS_SERVER_NOT_READY", driver.ErrBusy, ""),
	808: code("CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", driver.ErrBusy, ""),
	809: code("CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", driver.ErrBusy, ""),
	810: code("CUDA_ERROR_MPS_CLIENT_TERMINATED", driver.ErrDeviceFault, ""),
	811: code("CUDA_ERROR_CDP_NOT_SUPPORTED", driver.ErrUnsupported, ""),
	812: code("CUDA_ERROR_CDP_VERSION_MISMATCH", driver.ErrUnsupported, ""),
	900: code("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", driver.ErrInvalid, ""),
	901: code("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", driver.ErrInvalid, ""),
	902: code("CUDA_ERROR_STREAM_CAPTURE_MERGE", driver.ErrInvalid, ""),
	903: code("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", driver.ErrInvalid, ""),
	904: code("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", driver.ErrInvalid, ""),
	905: code("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", driver.ErrInvalid, ""),
	906: code("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", driver.ErrInvalid, ""),
	907: code("CUDA_ERROR_CAPTURED_EVENT", driver.ErrInvalid, ""),
	908: code("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", driver.ErrInvalid, ""),
	909: code("CUDA_ERROR_TIMEOUT", driver.ErrBusy, ""),
	910: code("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", driver.ErrInvalid, ""),
	911: code("CUDA_ERROR_EXTERNAL_DEVICE", driver.ErrDeviceFault, hintSticky),
	912: code("CUDA_ERROR_INVALID_CLUSTER_SIZE", driver.ErrInvalid, ""),
	999: code("CUDA_ERROR_UNKNOWN", driver.ErrDeviceFault, ""),
}

// resultError is the error of call fn returning r (nil for CUDA_SUCCESS):
// "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)", marked with the code's
// sentinel and hint. A code the table lacks (a newer driver's) is
// ErrDeviceFault, named by the driver's own cuGetErrorName when name is
// not nil.
func resultError(fn string, r cuResult, name func(cuResult) string) error {
	return accel.CallError(results, fn, r, "CUresult", name, "")
}

// code is one entry of results.
func code(name string, sentinel error, hint string) accel.Code {
	return accel.Code{Name: name, Sentinel: sentinel, Hint: hint}
}
