package cuda

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
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
			base, h, s := mappedWithStream(t, d)
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
			base, _, s := mappedWithStream(t, d)
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

// mappedWithStream maps one granule at a fresh reservation, read-write
// for device 0, and makes a stream of device 0.
func mappedWithStream(t *testing.T, d *Driver) (driver.Addr, driver.Handle, driver.Stream) {
	t.Helper()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	return base, h, s
}

// TestSetAccessRollsBackOnCUDAFailure: access over three mappings, the
// second cuMemSetAccess refused: the first mapping is set back, in CUDA
// too (a later copy through the stream still finds no access), and the
// record is unchanged.
func TestSetAccessRollsBackOnCUDAFailure(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	for i := range 3 {
		h, err := d.Create(0, g, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(base+driver.Addr(uint64(i)*g), h))
	}
	before := lib.Calls("cuMemSetAccess")
	lib.Fail("cuMemSetAccess", 2, 1, 2) // CUDA_ERROR_OUT_OF_MEMORY at the second mapping
	err = d.SetAccess(base, 3*g, 0, driver.AccessReadWrite)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "cuMemSetAccess: CUDA_ERROR_OUT_OF_MEMORY (2)")
	require.Equal(t, before+3, lib.Calls("cuMemSetAccess"), "one set, one refused, one set back")
	for i := range 3 {
		a, err := d.Access(base+driver.Addr(uint64(i)*g), 0)
		require.NoError(t, err)
		require.Equal(t, driver.AccessNone, a)
	}
	// CUDA agrees: the stand-in refuses the device's own copy there.
	lib.Clear()
	require.NoError(t, d.SetAccess(base+driver.Addr(g), 2*g, 0, driver.AccessReadWrite))
	drivertest.RequireIs(t, d.Write(base, []byte("x")), driver.ErrAccessDenied)
	require.NoError(t, d.Write(base+driver.Addr(g), []byte("x")))
	for i := range 3 {
		require.NoError(t, d.Unmap(base+driver.Addr(uint64(i)*g), g))
	}
}

// TestCreateFailureChangesNothing: cuMemCreate and cuMemMap refused
// (out of memory, a refused map): nothing recorded, nothing held.
func TestCreateFailureChangesNothing(t *testing.T) {
	d, lib := openStandin(t, small, Options{})
	lib.Fail("cuMemCreate", 1, 1, 2)
	_, err := d.Create(1, g, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY (2)")
	require.Zero(t, d.Used(1))
	require.Zero(t, lib.Live("allocations"))

	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	lib.Fail("cuMemMap", 1, 1, 1)
	drivertest.RequireIs(t, d.Map(base, h), driver.ErrInvalid, "cuMemMap: CUDA_ERROR_INVALID_VALUE (1)")
	require.Zero(t, lib.Live("mappings"))
	require.NoError(t, d.Map(base, h), "the same map succeeds once CUDA does")
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
}
