package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/units"
)

const g = 64 * units.KiB // the stand-in's granularity in these tests

// TestAsyncFailureReported: a copy CUDA accepts and then fails when it runs
// is reported by the next SyncStream, naming the operation and the code,
// in every wait mode; the stream goes on afterwards.
func TestAsyncFailureReported(t *testing.T) {
	for _, w := range []WaitMode{WaitHostFunc, WaitEvent, WaitSync} {
		t.Run(w.String(), func(t *testing.T) {
			d, lib := openStandin(t, small, Options{Wait: w})
			base, h, s := acceltest.MappedWithStream(t, d, g)
			lib.Fail("cuMemcpyHtoDAsync_v2:exec", 1, 1, 1)
			require.NoError(t, d.CopyHtoD(base, make([]byte, 128), s), "CUDA accepts the copy")
			err := d.SyncStream(s)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "CUDA_ERROR_INVALID_VALUE (1)", "copy 128 bytes from the host")
			require.NoError(t, d.SyncStream(s), "reported once")
			require.NoError(t, d.CopyHtoD(base, []byte("after"), s))
			require.NoError(t, d.SyncStream(s), "the stream goes on")
			require.NoError(t, d.DestroyStream(s))
			require.NoError(t, d.Unmap(base, g))
			require.NoError(t, d.Release(h))
		})
	}
}

// TestStickyFailure: CUDA_ERROR_ILLEGAL_ADDRESS at run time poisons the
// context, as CUDA does: SyncStream reports it — with host functions too,
// which CUDA never calls after such a failure: the driver finds it by
// querying the stream instead of waiting for ever — and every later call
// fails with the code and the hint to restart, never a crash or a hang.
func TestStickyFailure(t *testing.T) {
	for _, w := range []WaitMode{WaitHostFunc, WaitEvent, WaitSync} {
		t.Run(w.String(), func(t *testing.T) {
			lib := standin.Open(t, standin.CUDA, small)
			d, err := Open(Options{Library: lib.Path(), Wait: w})
			require.NoError(t, err)
			t.Cleanup(func() { _ = d.tearDown() }) // the stand-in keeps what the poisoned context held
			base, _, s := acceltest.MappedWithStream(t, d, g)
			lib.Fail("cuMemcpyHtoDAsync_v2:exec", 1, 1, 700)
			require.NoError(t, d.CopyHtoD(base, make([]byte, 128), s))
			err = d.SyncStream(s)
			drivertest.RequireIs(t, err, driver.ErrAccessDenied, "CUDA_ERROR_ILLEGAL_ADDRESS (700)")
			require.Contains(t, errors.FlattenHints(err), "restart the process")
			drivertest.RequireIs(t, d.DestroyStream(s), driver.ErrAccessDenied, "CUDA_ERROR_ILLEGAL_ADDRESS (700)")
			drivertest.RequireIs(t, d.Unmap(base, g), driver.ErrAccessDenied, "cuMemUnmap: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
			_, err = d.Create(0, g, driver.ChunkOptions{})
			drivertest.RequireIs(t, err, driver.ErrAccessDenied)
			require.NoError(t, d.Check(), "the record stays consistent: refused calls changed nothing")
		})
	}
}

// TestSetAccessRollsBackOnCUDAFailure: the second of three cuMemSetAccess
// refused; the first set back, in CUDA too.
func TestSetAccessRollsBackOnCUDAFailure(t *testing.T) {
	vendor.SetAccessRollsBack(t, small, acceltest.Fault{Fn: "cuMemSetAccess", Code: 2, Sentinel: driver.ErrOutOfMemory,
		Message: "cuMemSetAccess: CUDA_ERROR_OUT_OF_MEMORY (2)"})
}

// TestCreateFailureChangesNothing: cuMemCreate and cuMemMap refused (out
// of memory, a refused map): nothing recorded, nothing held.
func TestCreateFailureChangesNothing(t *testing.T) {
	vendor.CreateAndMapFailuresChangeNothing(t, small,
		acceltest.Fault{Fn: "cuMemCreate", Code: 2, Sentinel: driver.ErrOutOfMemory, Message: "CUDA_ERROR_OUT_OF_MEMORY (2)"},
		acceltest.Fault{Fn: "cuMemMap", Code: 1, Sentinel: driver.ErrInvalid, Message: "cuMemMap: CUDA_ERROR_INVALID_VALUE (1)"})
}

// TestStreamCallsFailCleanly: cuStreamCreate, cuMemHostAlloc and
// cuCtxEnablePeerAccess refused leave nothing made.
func TestStreamCallsFailCleanly(t *testing.T) {
	vendor.StreamCallsFailCleanly(t, small,
		acceltest.Fault{Fn: "cuStreamCreate", Code: 2, Sentinel: driver.ErrOutOfMemory, Message: "cuStreamCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"},
		acceltest.Fault{Fn: "cuMemHostAlloc", Code: 2, Sentinel: driver.ErrOutOfMemory, Message: "cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)"},
		acceltest.Fault{Fn: "cuCtxEnablePeerAccess", Code: 711, Sentinel: driver.ErrUnsupported, Message: "cuCtxEnablePeerAccess: CUDA_ERROR_TOO_MANY_PEERS (711)"})
}

// TestSetAccessSpansMappings: one cuMemSetAccess grants three adjacent
// mappings, as PyTorch's expandable segments grant a run of chunks.
func TestSetAccessSpansMappings(t *testing.T) {
	vendor.SetAccessCalls(t, small, "cuMemSetAccess", 1)
}

// TestSyncDevice: SyncDevice waits for the driver's own streams and for
// work on a stream it never made (cuCtxSynchronize); a bad device is
// ErrNoDevice, a refused call its code's sentinel, a libcuda without
// cuCtxSynchronize ErrUnsupported.
func TestSyncDevice(t *testing.T) {
	vendor.SyncDeviceWaits(t, small, "cuCtxSynchronize",
		acceltest.Fault{Fn: "cuCtxSynchronize", Code: 999, Sentinel: driver.ErrDeviceFault, Message: "cuCtxSynchronize: CUDA_ERROR_UNKNOWN (999)"})
}
