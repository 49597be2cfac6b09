package multidev

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Fault injection over the CUDA stand-in (driver/cuda/cudatest): libcuda
// refuses a call part-way through a migration or a grant, and the arena —
// its layout, every grant, the access CUDA itself gives each device, the
// bytes — and everything under it are as they were; the same call then
// succeeds once CUDA does.

// faultArena is an arena striped over four CUDA devices of a fresh
// stand-in, grown to four chunks holding a pattern, granted to device 0
// (read-write, everywhere: peer access to the other three) and to device 3
// (read-only, over chunks 1 and 2).
type faultArena struct {
	e   *env
	lib *cudatest.Lib
	a   *Arena
}

func newFaultArena(t *testing.T) *faultArena {
	t.Helper()
	d, lib := cudatest.Open(t, machine{devices: 4, capacity: 16 * g}.standin(), cuda.Options{})
	e := &env{drv: d, space: vaspace.New(d), mem: physical.New(d)}
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1, 2, 3)})
	require.NoError(t, a.Grow(4*g))
	require.NoError(t, a.Grant(0, 0, 4*g, driver.AccessReadWrite))
	require.NoError(t, a.Grant(3, g, 2*g, driver.AccessRead))
	require.NoError(t, a.Write(0, 0, fill(0, int(4*g))))
	return &faultArena{e: e, lib: lib, a: a}
}

// migrationState is the arena as a failed call must leave it: env.state
// (Len, layout, grants, physical usage, checks), the access CUDA gives each
// device on each chunk — what the arena grants —, and the bytes.
type migrationState struct {
	State state
	Bytes []byte
}

func (f *faultArena) state(t *testing.T) migrationState {
	t.Helper()
	s := migrationState{State: f.e.state(t, f.a), Bytes: make([]byte, f.a.Len())}
	for off := uint64(0); off < s.State.Committed; off += g {
		for d := range 4 {
			require.Equal(t, s.State.Access[off/g][d], cudatest.Access(t, f.lib, f.a.Base()+driver.Addr(off), d),
				"device %d over the chunk at %#x: CUDA gives what the arena grants", d, off)
		}
	}
	require.NoError(t, f.a.Read(0, 0, s.Bytes))
	return s
}

// op is the sweep's operation on a fresh faultArena.
func (f *faultArena) op(t *testing.T, run func() error) cudatest.Op {
	return cudatest.Op{Lib: f.lib, Devices: 4, Run: run,
		State: func() any { return f.state(t) },
		Below: func() any {
			used := make([]uint64, 4)
			for d := range used {
				used[d] = f.e.drv.Used(driver.DeviceID(d))
			}
			return used
		},
	}
}

// TestMigrateFaults: a migration of four chunks to device 2 — three move,
// device 3 must now reach device 2 (its peer access is enabled first) —
// with every libcuda call it makes refused in turn: the peer access, the
// scratch range's reservation, the new chunks' creates (out of memory,
// then refused), maps and grants, the copies through the host, and the
// swap's unmaps, maps and grants. The chunks stay where they were, with
// their grants in the arena and in CUDA, and the bytes read back the same
// from them. (The copies are synchronous, through the host: a migration
// makes no stream copy, so there is no cuMemcpyDtoDAsync_v2 to fail.)
func TestMigrateFaults(t *testing.T) {
	n := cudatest.Sweep(t, func(t *testing.T) cudatest.Op {
		f := newFaultArena(t)
		return f.op(t, func() error { return f.a.Migrate(0, 4*g, 2) })
	}, cudatest.OutOfMemory("cuMemCreate"), cudatest.Invalid("cuMemCreate"), cudatest.Invalid("cuCtxEnablePeerAccess"),
		cudatest.Invalid("cuMemAddressReserve"), cudatest.Invalid("cuMemMap"), cudatest.Invalid("cuMemSetAccess"),
		cudatest.Invalid("cuMemcpyDtoH_v2"), cudatest.Invalid("cuMemcpyHtoD_v2"),
		cudatest.Lingering(cudatest.Invalid("cuMemUnmap")), cudatest.Lingering(cudatest.Invalid("cuMemAddressFree")))
	require.Equal(t, 3, n["cuMemCreate"], "three chunks move")
	t.Logf("the migration calls %v", n)
}

// TestMigrateOutOfMemoryOnTarget: the target device out of memory in CUDA
// (another process holds it) at the second new chunk: the migration fails
// naming CUDA's code, and nothing changes — no chunk is left on the
// target.
func TestMigrateOutOfMemoryOnTarget(t *testing.T) {
	f := newFaultArena(t)
	before := f.state(t)
	f.lib.Fail("cuMemCreate", 2, 1, 2)
	drivertest.RequireIs(t, f.a.Migrate(0, 4*g, 2), driver.ErrOutOfMemory,
		"multidev: migrate [0x0, +256 KiB) to device 2", "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)")
	require.Equal(t, before, f.state(t))
	require.Equal(t, g, f.lib.Used(2), "device 2 holds its own chunk only")
	dtod := f.lib.Calls("cuMemcpyDtoDAsync_v2")
	require.NoError(t, f.a.Migrate(0, 4*g, 2))
	require.Equal(t, dtod, f.lib.Calls("cuMemcpyDtoDAsync_v2"), "the bytes go through the host, not a stream copy")
	require.Equal(t, []Extent{{vaspace.Range{Base: f.a.Base(), Size: 4 * g}, 2}}, f.a.Layout())
	require.Equal(t, before.Bytes, f.state(t).Bytes)
}

// TestGrantFaults: a grant of device 1 over the four chunks (three on
// other devices: peer access to each enabled first) with each
// cuCtxEnablePeerAccess and cuMemSetAccess refused in turn: no grant
// changes, in the arena or in CUDA.
func TestGrantFaults(t *testing.T) {
	n := cudatest.Sweep(t, func(t *testing.T) cudatest.Op {
		f := newFaultArena(t)
		return f.op(t, func() error { return f.a.Grant(1, 0, 4*g, driver.AccessReadWrite) })
	}, cudatest.Invalid("cuCtxEnablePeerAccess"), cudatest.OutOfMemory("cuMemSetAccess"))
	require.Equal(t, 1, n["cuMemSetAccess"], "one over the four chunks: cuMemSetAccess spans adjacent mappings")
}
