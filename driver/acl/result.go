package acl

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// result is what this package knows of one aclError: its name in the CANN
// headers (acl_base.h, and rt_error_codes.h for the runtime's own codes),
// the contract's sentinel it is marked with, and a hint.
type result struct {
	name     string
	sentinel error
	hint     string
}

const hintFault = "the NPU or its runtime failed: see the CANN logs (ASCEND_SLOG_PRINT_TO_STDOUT=1)"

// results maps every aclError the CANN headers define to the contract;
// codes the device raises when it fails (AI Core exceptions, timeouts,
// internal errors, codes the driver does not know) are
// driver.ErrDeviceFault. result_test.go checks the table code by code.
var results = map[aclError]result{
	0: {"ACL_SUCCESS", nil, ""},

	100000: {"ACL_ERROR_INVALID_PARAM", driver.ErrInvalid, ""},
	100001: {"ACL_ERROR_UNINITIALIZE", driver.ErrInvalid, "aclInit was not called or failed"},
	100002: {"ACL_ERROR_REPEAT_INITIALIZE", driver.ErrBusy, ""},
	100003: {"ACL_ERROR_INVALID_FILE", driver.ErrInvalid, ""},
	100004: {"ACL_ERROR_WRITE_FILE", driver.ErrInvalid, ""},
	100005: {"ACL_ERROR_INVALID_FILE_SIZE", driver.ErrInvalid, ""},
	100006: {"ACL_ERROR_PARSE_FILE", driver.ErrInvalid, ""},
	100007: {"ACL_ERROR_FILE_MISSING_ATTR", driver.ErrInvalid, ""},
	100008: {"ACL_ERROR_FILE_ATTR_INVALID", driver.ErrInvalid, ""},
	100009: {"ACL_ERROR_INVALID_DUMP_CONFIG", driver.ErrInvalid, ""},
	100010: {"ACL_ERROR_INVALID_PROFILING_CONFIG", driver.ErrInvalid, ""},
	100011: {"ACL_ERROR_INVALID_MODEL_ID", driver.ErrInvalid, ""},
	100012: {"ACL_ERROR_DESERIALIZE_MODEL", driver.ErrInvalid, ""},
	100013: {"ACL_ERROR_PARSE_MODEL", driver.ErrInvalid, ""},
	100014: {"ACL_ERROR_READ_MODEL_FAILURE", driver.ErrInvalid, ""},
	100015: {"ACL_ERROR_MODEL_SIZE_INVALID", driver.ErrInvalid, ""},
	100016: {"ACL_ERROR_MODEL_MISSING_ATTR", driver.ErrInvalid, ""},
	100017: {"ACL_ERROR_MODEL_INPUT_NOT_MATCH", driver.ErrInvalid, ""},
	100018: {"ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", driver.ErrInvalid, ""},
	100019: {"ACL_ERROR_MODEL_NOT_DYNAMIC", driver.ErrInvalid, ""},
	100020: {"ACL_ERROR_OP_TYPE_NOT_MATCH", driver.ErrInvalid, ""},
	100021: {"ACL_ERROR_OP_INPUT_NOT_MATCH", driver.ErrInvalid, ""},
	100022: {"ACL_ERROR_OP_OUTPUT_NOT_MATCH", driver.ErrInvalid, ""},
	100023: {"ACL_ERROR_OP_ATTR_NOT_MATCH", driver.ErrInvalid, ""},
	100024: {"ACL_ERROR_OP_NOT_FOUND", driver.ErrUnsupported, ""},
	100025: {"ACL_ERROR_OP_LOAD_FAILED", driver.ErrUnsupported, ""},
	100026: {"ACL_ERROR_UNSUPPORTED_DATA_TYPE", driver.ErrUnsupported, ""},
	100027: {"ACL_ERROR_FORMAT_NOT_MATCH", driver.ErrInvalid, ""},
	100028: {"ACL_ERROR_BIN_SELECTOR_NOT_REGISTERED", driver.ErrInvalid, ""},
	100029: {"ACL_ERROR_KERNEL_NOT_FOUND", driver.ErrUnsupported, ""},
	100030: {"ACL_ERROR_BIN_SELECTOR_ALREADY_REGISTERED", driver.ErrBusy, ""},
	100031: {"ACL_ERROR_KERNEL_ALREADY_REGISTERED", driver.ErrBusy, ""},
	100032: {"ACL_ERROR_INVALID_QUEUE_ID", driver.ErrInvalid, ""},
	100033: {"ACL_ERROR_REPEAT_SUBSCRIBE", driver.ErrBusy, ""},
	100034: {"ACL_ERROR_STREAM_NOT_SUBSCRIBE", driver.ErrInvalid, ""},
	100035: {"ACL_ERROR_THREAD_NOT_SUBSCRIBE", driver.ErrInvalid, ""},
	100036: {"ACL_ERROR_WAIT_CALLBACK_TIMEOUT", driver.ErrBusy, ""},
	100037: {"ACL_ERROR_REPEAT_FINALIZE", driver.ErrClosed, ""},
	100038: {"ACL_ERROR_NOT_STATIC_AIPP", driver.ErrInvalid, ""},
	100039: {"ACL_ERROR_COMPILING_STUB_MODE", driver.ErrUnsupported, "this is the CANN toolkit's compile stub, not the runtime: set up the Ascend driver and runtime (source set_env.sh)"},
	100040: {"ACL_ERROR_GROUP_NOT_SET", driver.ErrInvalid, ""},
	100041: {"ACL_ERROR_GROUP_NOT_CREATE", driver.ErrInvalid, ""},
	100042: {"ACL_ERROR_PROF_ALREADY_RUN", driver.ErrBusy, ""},
	100043: {"ACL_ERROR_PROF_NOT_RUN", driver.ErrInvalid, ""},
	100044: {"ACL_ERROR_DUMP_ALREADY_RUN", driver.ErrBusy, ""},
	100045: {"ACL_ERROR_DUMP_NOT_RUN", driver.ErrInvalid, ""},

	107000: {"ACL_ERROR_RT_PARAM_INVALID", driver.ErrInvalid, ""},
	107001: {"ACL_ERROR_RT_INVALID_DEVICEID", driver.ErrNoDevice, ""},
	107002: {"ACL_ERROR_RT_CONTEXT_NULL", driver.ErrInvalid, ""},
	107003: {"ACL_ERROR_RT_STREAM_CONTEXT", driver.ErrInvalid, ""},
	107004: {"ACL_ERROR_RT_MODEL_CONTEXT", driver.ErrInvalid, ""},
	107005: {"ACL_ERROR_RT_STREAM_MODEL", driver.ErrInvalid, ""},
	107006: {"ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID", driver.ErrInvalid, ""},
	107007: {"ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL", driver.ErrInvalid, ""},
	107008: {"ACL_ERROR_RT_ADDR_UNALIGNED", driver.ErrMisaligned, ""},
	107009: {"ACL_ERROR_RT_FILE_OPEN", driver.ErrInvalid, ""},
	107010: {"ACL_ERROR_RT_FILE_WRITE", driver.ErrInvalid, ""},
	107011: {"ACL_ERROR_RT_STREAM_SUBSCRIBE", driver.ErrInvalid, ""},
	107012: {"ACL_ERROR_RT_THREAD_SUBSCRIBE", driver.ErrInvalid, ""},
	107013: {"ACL_ERROR_RT_GROUP_NOT_SET", driver.ErrInvalid, ""},
	107014: {"ACL_ERROR_RT_GROUP_NOT_CREATE", driver.ErrInvalid, ""},
	107015: {"ACL_ERROR_RT_STREAM_NO_CB_REG", driver.ErrInvalid, ""},
	107016: {"ACL_ERROR_RT_INVALID_MEMORY_TYPE", driver.ErrInvalid, ""},
	107017: {"ACL_ERROR_RT_INVALID_HANDLE", driver.ErrBadHandle, ""},
	107018: {"ACL_ERROR_RT_INVALID_MALLOC_TYPE", driver.ErrInvalid, ""},
	107019: {"ACL_ERROR_RT_WAIT_TIMEOUT", driver.ErrBusy, ""},
	107020: {"ACL_ERROR_RT_TASK_TIMEOUT", driver.ErrDeviceFault, hintFault},

	200000: {"ACL_ERROR_BAD_ALLOC", driver.ErrOutOfMemory, ""},
	200001: {"ACL_ERROR_API_NOT_SUPPORT", driver.ErrUnsupported, ""},
	200002: {"ACL_ERROR_INVALID_DEVICE", driver.ErrNoDevice, ""},
	200003: {"ACL_ERROR_MEMORY_ADDRESS_UNALIGNED", driver.ErrMisaligned, ""},
	200004: {"ACL_ERROR_RESOURCE_NOT_MATCH", driver.ErrInvalid, ""},
	200005: {"ACL_ERROR_INVALID_RESOURCE_HANDLE", driver.ErrBadHandle, ""},
	200006: {"ACL_ERROR_FEATURE_UNSUPPORTED", driver.ErrUnsupported, ""},
	200007: {"ACL_ERROR_PROF_MODULES_UNSUPPORTED", driver.ErrUnsupported, ""},

	207000: {"ACL_ERROR_RT_FEATURE_NOT_SUPPORT", driver.ErrUnsupported, ""},
	207001: {"ACL_ERROR_RT_MEMORY_ALLOCATION", driver.ErrOutOfMemory, "free memory on the NPU, or use another one"},
	207002: {"ACL_ERROR_RT_MEMORY_FREE", driver.ErrDeviceFault, hintFault},
	207003: {"ACL_ERROR_RT_AICORE_OVER_FLOW", driver.ErrDeviceFault, hintFault},
	207004: {"ACL_ERROR_RT_NO_DEVICE", driver.ErrNoDevice, "check npu-smi info: the runtime sees no usable NPU"},
	207005: {"ACL_ERROR_RT_RESOURCE_ALLOC_FAIL", driver.ErrOutOfMemory, ""},
	207006: {"ACL_ERROR_RT_NO_PERMISSION", driver.ErrAccessDenied, ""},
	207007: {"ACL_ERROR_RT_NO_EVENT_RESOURCE", driver.ErrOutOfMemory, ""},
	207008: {"ACL_ERROR_RT_NO_STREAM_RESOURCE", driver.ErrOutOfMemory, ""},
	207009: {"ACL_ERROR_RT_NO_NOTIFY_RESOURCE", driver.ErrOutOfMemory, ""},
	207010: {"ACL_ERROR_RT_NO_MODEL_RESOURCE", driver.ErrOutOfMemory, ""},
	207011: {"ACL_ERROR_RT_NO_CDQ_RESOURCE", driver.ErrOutOfMemory, ""},
	207012: {"ACL_ERROR_RT_OVER_LIMIT", driver.ErrOutOfMemory, ""},
	207013: {"ACL_ERROR_RT_QUEUE_EMPTY", driver.ErrInvalid, ""},
	207014: {"ACL_ERROR_RT_QUEUE_FULL", driver.ErrBusy, ""},
	207015: {"ACL_ERROR_RT_REPEATED_INIT", driver.ErrBusy, ""},
	207016: {"ACL_ERROR_RT_AIVEC_OVER_FLOW", driver.ErrDeviceFault, hintFault},
	207017: {"ACL_ERROR_RT_OVER_FLOW", driver.ErrDeviceFault, hintFault},
	207018: {"ACL_ERROR_RT_DEVIDE_OOM", driver.ErrOutOfMemory, ""},
	207019: {"ACL_ERROR_RT_SEND_MSG", driver.ErrDeviceFault, hintFault},
	207020: {"ACL_ERROR_RT_COPY_USER_FAIL", driver.ErrDeviceFault, hintFault},

	300000: {"ACL_ERROR_STORAGE_OVER_LIMIT", driver.ErrOutOfMemory, ""},

	500000: {"ACL_ERROR_INTERNAL_ERROR", driver.ErrDeviceFault, hintFault},
	500001: {"ACL_ERROR_FAILURE", driver.ErrDeviceFault, hintFault},
	500002: {"ACL_ERROR_GE_FAILURE", driver.ErrDeviceFault, hintFault},
	500003: {"ACL_ERROR_RT_FAILURE", driver.ErrDeviceFault, hintFault},
	500004: {"ACL_ERROR_DRV_FAILURE", driver.ErrDeviceFault, hintFault},
	500005: {"ACL_ERROR_PROFILING_FAILURE", driver.ErrDeviceFault, hintFault},

	507000: {"ACL_ERROR_RT_INTERNAL_ERROR", driver.ErrDeviceFault, hintFault},
	507001: {"ACL_ERROR_RT_TS_ERROR", driver.ErrDeviceFault, hintFault},
	507002: {"ACL_ERROR_RT_STREAM_TASK_FULL", driver.ErrBusy, ""},
	507003: {"ACL_ERROR_RT_STREAM_TASK_EMPTY", driver.ErrInvalid, ""},
	507004: {"ACL_ERROR_RT_STREAM_NOT_COMPLETE", driver.ErrBusy, ""},
	507005: {"ACL_ERROR_RT_END_OF_SEQUENCE", driver.ErrInvalid, ""},
	507006: {"ACL_ERROR_RT_EVENT_NOT_COMPLETE", driver.ErrBusy, ""},
	507007: {"ACL_ERROR_RT_CONTEXT_RELEASE_ERROR", driver.ErrDeviceFault, hintFault},
	507008: {"ACL_ERROR_RT_SOC_VERSION", driver.ErrUnsupported, "the runtime was built for another SoC"},
	507009: {"ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT", driver.ErrUnsupported, ""},
	507010: {"ACL_ERROR_RT_LOST_HEARTBEAT", driver.ErrDeviceFault, hintFault},
	507011: {"ACL_ERROR_RT_MODEL_EXECUTE", driver.ErrDeviceFault, hintFault},
	507012: {"ACL_ERROR_RT_REPORT_TIMEOUT", driver.ErrDeviceFault, hintFault},
	507013: {"ACL_ERROR_RT_SYS_DMA", driver.ErrDeviceFault, hintFault},
	507014: {"ACL_ERROR_RT_AICORE_TIMEOUT", driver.ErrDeviceFault, hintFault},
	507015: {"ACL_ERROR_RT_AICORE_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507016: {"ACL_ERROR_RT_AICORE_TRAP_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507017: {"ACL_ERROR_RT_AICPU_TIMEOUT", driver.ErrDeviceFault, hintFault},
	507018: {"ACL_ERROR_RT_AICPU_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507019: {"ACL_ERROR_RT_AICPU_DATADUMP_RSP_ERR", driver.ErrDeviceFault, hintFault},
	507020: {"ACL_ERROR_RT_AICPU_MODEL_RSP_ERR", driver.ErrDeviceFault, hintFault},
	507021: {"ACL_ERROR_RT_PROFILING_ERROR", driver.ErrDeviceFault, hintFault},
	507022: {"ACL_ERROR_RT_IPC_ERROR", driver.ErrDeviceFault, hintFault},
	507023: {"ACL_ERROR_RT_MODEL_ABORT_NORMAL", driver.ErrDeviceFault, hintFault},
	507024: {"ACL_ERROR_RT_KERNEL_UNREGISTERING", driver.ErrBusy, ""},
	507025: {"ACL_ERROR_RT_RINGBUFFER_NOT_INIT", driver.ErrDeviceFault, hintFault},
	507026: {"ACL_ERROR_RT_RINGBUFFER_NO_DATA", driver.ErrDeviceFault, hintFault},
	507027: {"ACL_ERROR_RT_KERNEL_LOOKUP", driver.ErrInvalid, ""},
	507028: {"ACL_ERROR_RT_KERNEL_DUPLICATE", driver.ErrBusy, ""},
	507029: {"ACL_ERROR_RT_DEBUG_REGISTER_FAIL", driver.ErrDeviceFault, hintFault},
	507030: {"ACL_ERROR_RT_DEBUG_UNREGISTER_FAIL", driver.ErrDeviceFault, hintFault},
	507031: {"ACL_ERROR_RT_LABEL_CONTEXT", driver.ErrInvalid, ""},
	507032: {"ACL_ERROR_RT_PROGRAM_USE_OUT", driver.ErrOutOfMemory, ""},
	507033: {"ACL_ERROR_RT_DEV_SETUP_ERROR", driver.ErrDeviceFault, hintFault},
	507034: {"ACL_ERROR_RT_VECTOR_CORE_TIMEOUT", driver.ErrDeviceFault, hintFault},
	507035: {"ACL_ERROR_RT_VECTOR_CORE_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507036: {"ACL_ERROR_RT_VECTOR_CORE_TRAP_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507037: {"ACL_ERROR_RT_CDQ_BATCH_ABNORMAL", driver.ErrDeviceFault, hintFault},
	507038: {"ACL_ERROR_RT_DIE_MODE_CHANGE_ERROR", driver.ErrInvalid, ""},
	507039: {"ACL_ERROR_RT_DIE_SET_ERROR", driver.ErrInvalid, ""},
	507040: {"ACL_ERROR_RT_INVALID_DIEID", driver.ErrInvalid, ""},
	507041: {"ACL_ERROR_RT_DIE_MODE_NOT_SET", driver.ErrInvalid, ""},
	507042: {"ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW", driver.ErrDeviceFault, hintFault},
	507043: {"ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW", driver.ErrDeviceFault, hintFault},
	507044: {"ACL_ERROR_RT_VECTOR_CORE_TRAP_READ_OVERFLOW", driver.ErrDeviceFault, hintFault},
	507045: {"ACL_ERROR_RT_VECTOR_CORE_TRAP_WRITE_OVERFLOW", driver.ErrDeviceFault, hintFault},
	507046: {"ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", driver.ErrBusy, ""},
	507047: {"ACL_ERROR_RT_EVENT_SYNC_TIMEOUT", driver.ErrBusy, ""},
	507048: {"ACL_ERROR_RT_FFTS_PLUS_TIMEOUT", driver.ErrDeviceFault, hintFault},
	507049: {"ACL_ERROR_RT_FFTS_PLUS_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507050: {"ACL_ERROR_RT_FFTS_PLUS_TRAP_EXCEPTION", driver.ErrDeviceFault, hintFault},
	507899: {"ACL_ERROR_RT_DRV_INTERNAL_ERROR", driver.ErrDeviceFault, hintFault},
	507900: {"ACL_ERROR_RT_AICPU_INTERNAL_ERROR", driver.ErrDeviceFault, hintFault},
	507901: {"ACL_ERROR_RT_SOCKET_CLOSE", driver.ErrDeviceFault, hintFault},
}

// codeName spells e as the CANN headers do, with its number:
// "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)".
func codeName(e aclError) string {
	if res, ok := results[e]; ok {
		return fmt.Sprintf("%s (%d)", res.name, e)
	}
	return fmt.Sprintf("aclError %d", e)
}

// resultError is the error of call fn returning e (nil for success),
// marked with the code's sentinel (ErrDeviceFault for one the table
// lacks). recent, when not empty, is the runtime's own message
// (aclrtGetRecentErrMsg), kept in the error's details.
func resultError(fn string, e aclError, recent string) error {
	if e == 0 {
		return nil
	}
	res, ok := results[e]
	sentinel := driver.ErrDeviceFault
	if ok {
		sentinel = res.sentinel
	}
	err := errors.Mark(errors.Newf("%s: %s", errors.Safe(fn), errors.Safe(codeName(e))), sentinel)
	if recent != "" {
		err = errors.WithDetailf(err, "AscendCL says: %s", recent)
	}
	if res.hint != "" {
		err = errors.WithHint(err, res.hint)
	}
	return err
}
