package pool

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/testdrivers"
)

// Fault injection over the CUDA stand-in (driver/cuda/cudatest): libcuda
// refuses a call under a MallocAsync that must commit, and the pool — its
// live allocations, its attributes, the bytes behind them, what CUDA
// holds — is as it was; memory freed in stream order is still handed out
// again without CUDA.

// faultPool is a pool on device 0 of the CUDA driver over a fresh
// stand-in (every reuse policy on, freed memory kept through
// synchronizes), with five live allocations holding a pattern that fill
// the chunks they lie in: the pool holds no wholly free chunk, so no
// failure can be answered by giving memory back.
type faultPool struct {
	*poolEnv
	lib   *cudatest.Lib
	lives []driver.Addr
}

func newFaultPool(t *testing.T) *faultPool {
	t.Helper()
	var lib *cudatest.Lib
	d := backend{testdrivers.Backend{Name: "cuda", Open: func(t testing.TB, m testdrivers.Machine) testdrivers.Driver {
		drv, l := cudatest.Open(t, m.Standin(), cuda.Options{})
		lib = l
		return drv
	}}}
	fp := &faultPool{poolEnv: d.poolEnv(t, Props{}, true, true, true), lib: lib}
	require.NoError(t, fp.p.SetAttribute(ReleaseThreshold, 1<<40))
	// Four chunks, then half of the one the allocator committed ahead.
	for i, size := range []uint64{g, g, g, g, g/2 + 1000} {
		p, err := fp.p.MallocAsync(size, fp.a)
		require.NoError(t, err)
		require.NoError(t, fp.a.CopyHtoD(p, bytes.Repeat([]byte{byte(i + 1)}, int(size))))
		fp.lives = append(fp.lives, p)
	}
	require.NoError(t, fp.a.Synchronize())
	return fp
}

// poolState is a pool as a failed call must leave it: its attributes,
// live allocations and their bytes, and what CUDA holds.
type poolState struct {
	Attrs       map[Attr]uint64
	Allocations int
	Bytes       map[driver.Addr][]byte
	Held        cudatest.Held
}

func (fp *faultPool) state(t *testing.T) poolState {
	t.Helper()
	require.NoError(t, fp.p.Check())
	require.NoError(t, fp.drv.Check())
	s := poolState{Attrs: map[Attr]uint64{}, Allocations: allocations(fp.p), Bytes: map[driver.Addr][]byte{},
		Held: cudatest.HeldBy(fp.lib, 2)}
	for _, a := range []Attr{ReservedMemCurrent, ReservedMemHigh, UsedMemCurrent, UsedMemHigh} {
		v, err := fp.p.Attribute(a)
		require.NoError(t, err)
		s.Attrs[a] = v
	}
	require.Equal(t, s.Attrs[ReservedMemCurrent], fp.lib.Used(0), "the pool reserves what CUDA holds")
	for _, p := range fp.lives {
		size, err := alSize(fp.p.al, p)
		require.NoError(t, err)
		b := make([]byte, size)
		require.NoError(t, fp.a.CopyDtoH(b, p))
		s.Bytes[p] = b
	}
	require.NoError(t, fp.a.Synchronize())
	return s
}

// TestMallocAsyncOutOfMemory: CUDA refuses every cuMemCreate (the GPU's
// memory taken by another process) under a MallocAsync that must commit:
// it fails marked out of memory naming CUDA's code, after the allocator's
// retries, and the pool's reserved and used memory, its high-water marks,
// its live allocations and their bytes, and what CUDA holds are as they
// were. Memory freed on a stream is then still handed out again to that
// stream, and is usable there; once CUDA has memory again the same
// MallocAsync succeeds.
func TestMallocAsyncOutOfMemory(t *testing.T) {
	fp := newFaultPool(t)
	before := fp.state(t)
	creates := fp.lib.Calls("cuMemCreate")
	fp.lib.Fail("cuMemCreate", 1, 0, 2)
	_, err := fp.p.MallocAsync(3*g, fp.a)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "pool: malloc async 192 KiB", "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)")
	require.Greater(t, fp.lib.Calls("cuMemCreate"), creates+1, "the allocator tried again before reporting")
	require.Equal(t, before, fp.state(t))

	// Freed on A, handed out again on A: no create needed.
	freed := fp.lives[1]
	require.NoError(t, fp.p.FreeAsync(freed, fp.a))
	fp.lives = append(fp.lives[:1], fp.lives[2:]...)
	p, err := fp.p.MallocAsync(g, fp.a)
	require.NoError(t, err, "freed memory is handed out again while CUDA has none")
	require.Equal(t, freed, p)
	require.NoError(t, fp.a.CopyHtoD(p, []byte("reused")))
	got := make([]byte, 6)
	require.NoError(t, fp.a.CopyDtoH(got, p))
	require.NoError(t, fp.a.Synchronize())
	require.Equal(t, "reused", string(got))
	fp.lives = append(fp.lives, p)

	fp.lib.Clear()
	q, err := fp.p.MallocAsync(3*g, fp.a)
	require.NoError(t, err, "the same request, once CUDA has memory")
	require.NoError(t, fp.p.FreeAsync(q, fp.a))
	require.NoError(t, fp.a.Synchronize())
}

// TestMallocAsyncFaults: every cuMemCreate, cuMemMap and cuMemSetAccess
// of a MallocAsync that must commit refused in turn: the MallocAsync
// fails, and the pool is as it was.
func TestMallocAsyncFaults(t *testing.T) {
	n := cudatest.Sweep(t, func(t *testing.T) cudatest.Op {
		fp := newFaultPool(t)
		return cudatest.Op{Lib: fp.lib, Devices: 2,
			Run: func() error {
				p, err := fp.p.MallocAsync(3*g, fp.a)
				if err == nil {
					fp.lives = append(fp.lives, p)
				}
				return err
			},
			State: func() any {
				s := fp.state(t)
				s.Held = cudatest.Held{} // the sweep compares what CUDA holds itself
				return s
			},
		}
	}, cudatest.Invalid("cuMemCreate"), cudatest.Invalid("cuMemMap"), cudatest.Invalid("cuMemSetAccess"))
	t.Logf("a MallocAsync of three chunks calls %v", n)
}
