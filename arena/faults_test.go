package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Fault injection over the CUDA stand-in (driver/cuda/cudatest): libcuda
// refuses a call part-way through a commit, a grow, a grant, a move or an
// allocation — out of memory because other processes hold the GPU, a
// refused map — and each test shows the layer putting back everything it
// changed: its own books, physical memory's, the driver's record and what
// "CUDA" holds (the stand-in's memory and live objects, and the access it
// gives each device, from its own books), with the bytes already there
// untouched; the same call then succeeds once CUDA does. The rule is the
// package's: a call that fails changes nothing — but for the memory an
// allocation gives back before it reports out of memory, and memory given
// back before CUDA refused to give back more (TestGiveBackFaults).
//
// Most tests sweep: they run the operation once to count its calls of
// each libcuda function, then once per call with that call refused, on a
// fresh stand-in each time, so every point of failure is tried.

// faultEnv is an env on the CUDA driver over a fresh stand-in, which the
// test makes fail.
type faultEnv struct {
	*env
	lib *cudatest.Lib
}

func newFaultEnv(t *testing.T, capacity uint64) *faultEnv {
	t.Helper()
	d, lib := cudatest.Open(t, standin(2, capacity), cuda.Options{})
	return &faultEnv{env: &env{drv: d, space: vaspace.New(d), mem: physical.New(d)}, lib: lib}
}

// cudaAccess is what CUDA itself lets dev do at addr.
func (f *faultEnv) cudaAccess(t *testing.T, addr driver.Addr, dev int) driver.Access {
	return cudatest.Access(t, f.lib, addr, dev)
}

// underneath is what lies under the layers — physical memory's books and
// the driver's record — as a failed call must leave it (the sweep adds
// what the stand-in holds). Physical memory's Peak is left out: it is a
// high-water mark, and the chunks a failed commit made before the failure
// did exist.
type underneath struct {
	Used, DriverUsed [2]uint64
	Chunks           [2]int
}

func (f *faultEnv) underneath(t *testing.T) underneath {
	t.Helper()
	require.NoError(t, f.mem.Check())
	require.NoError(t, f.drv.Check())
	var u underneath
	for d := range 2 {
		us, err := f.mem.Usage(driver.DeviceID(d))
		require.NoError(t, err)
		u.Used[d], u.Chunks[d] = us.Used, us.Chunks
		u.DriverUsed[d] = f.drv.Used(driver.DeviceID(d))
		require.Equal(t, f.lib.Used(d), u.DriverUsed[d], "the driver's record holds what CUDA holds on device %d", d)
	}
	return u
}

// rangeState is a range as a failed call must leave it: its extents and
// figures, every chunk's access per device — which CUDA must grant as the
// range counts it —, and every committed byte.
type rangeState struct {
	Layout              []Extent
	Committed, Borrowed uint64
	Chunks              int
	Access              [][2]driver.Access // per chunk-sized piece, in address order
	Bytes               [][]byte           // per extent
}

func (f *faultEnv) rangeState(t *testing.T, s *Sparse) rangeState {
	t.Helper()
	require.NoError(t, s.Check())
	st := s.Stats()
	r := rangeState{Layout: s.Layout(), Committed: st.Committed, Borrowed: st.Borrowed, Chunks: st.Chunks}
	for _, ext := range r.Layout {
		for off := ext.Offset; off < ext.Offset+ext.Size; off += s.ChunkSize() {
			var acc [2]driver.Access
			for d := range 2 {
				a, err := s.AccessAt(driver.DeviceID(d), off)
				require.NoError(t, err)
				acc[d] = a
				require.Equal(t, a, f.cudaAccess(t, s.Base()+driver.Addr(off), d),
					"device %d at offset %#x: CUDA grants what the range counts", d, off)
			}
			r.Access = append(r.Access, acc)
		}
		b := make([]byte, ext.Size)
		require.NoError(t, f.drv.Read(s.Base()+driver.Addr(ext.Offset), b))
		r.Bytes = append(r.Bytes, b)
	}
	return r
}

// fill writes a pattern, distinct per call, over every committed byte of s.
func (f *faultEnv) fill(t *testing.T, s *Sparse, seed byte) {
	t.Helper()
	for _, ext := range s.Layout() {
		b := make([]byte, ext.Size)
		for i := range b {
			b[i] = seed + byte(i*7+i>>9)
		}
		require.NoError(t, f.drv.Write(s.Base()+driver.Addr(ext.Offset), b))
	}
}

// sweep is cudatest.Sweep over a faultEnv of capacity bytes per device:
// setup builds the layer on it and returns the operation and the layer's
// state; physical memory's books and the driver's record are checked
// underneath.
func sweep(t *testing.T, capacity uint64, setup func(t *testing.T, f *faultEnv) (op func() error, state func() any), faults ...cudatest.Fault) map[string]int {
	t.Helper()
	return cudatest.Sweep(t, func(t *testing.T) cudatest.Op {
		f := newFaultEnv(t, capacity)
		op, state := setup(t, f)
		return cudatest.Op{Lib: f.lib, Devices: 2, Run: op, State: state, Below: func() any { return f.underneath(t) }}
	}, faults...)
}

var (
	invalid     = cudatest.Invalid
	outOfMemory = cudatest.OutOfMemory
)

// TestCommitFaults: a commit of five chunks into two holes of a range,
// granted to both devices, with each cuMemCreate in turn out of memory
// (the GPU full: one device only, so no other device takes the chunk),
// and each cuMemCreate, cuMemMap and cuMemSetAccess in turn refused.
func TestCommitFaults(t *testing.T) {
	setup := func(t *testing.T, f *faultEnv) (func() error, func() any) {
		s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Access: []driver.DeviceID{0, 1}})
		require.NoError(t, s.Commit(2*g, g))
		f.fill(t, s, 1)
		// Holes [0, 2g) and [3g, 6g): five chunks of one granule.
		return func() error { return s.Commit(0, 6*g) }, func() any { return f.rangeState(t, s) }
	}
	n := sweep(t, 16*g, setup, outOfMemory("cuMemCreate"), invalid("cuMemCreate"), invalid("cuMemMap"), invalid("cuMemSetAccess"))
	require.Equal(t, 5, n["cuMemCreate"])
	require.Equal(t, 5, n["cuMemMap"])
	require.Equal(t, 4, n["cuMemSetAccess"], "each hole granted to two devices, one call each")
}

// TestGrowFaults: an arena that grows by four chunks from two, with each
// cuMemCreate in turn out of memory and each cuMemCreate, cuMemMap and
// cuMemSetAccess in turn refused: Len, the chunks, the bytes and
// everything under the arena stay as they were.
func TestGrowFaults(t *testing.T) {
	type arenaState struct {
		Len   uint64
		Range rangeState
	}
	setup := func(t *testing.T, f *faultEnv) (func() error, func() any) {
		a := f.arena(t, Options{Max: 8 * g, ChunkSize: g, MaxChunk: g})
		require.NoError(t, a.Grow(g+100))
		f.fill(t, a.s, 2)
		return func() error { return a.Grow(4 * g) }, func() any {
			require.NoError(t, a.Check())
			return arenaState{a.Len(), f.rangeState(t, a.s)}
		}
	}
	n := sweep(t, 16*g, setup, outOfMemory("cuMemCreate"), invalid("cuMemCreate"), invalid("cuMemMap"), invalid("cuMemSetAccess"))
	require.Equal(t, 4, n["cuMemCreate"], "Len 5 granules and 100 bytes: four chunks more")
}

// TestCommitOutOfMemoryGoesToTheNextDevice: when CUDA reports a device
// full that the range's books thought had room (another process took the
// memory), the chunk goes to the placement's next device, as the commit
// would have placed it had the range known; nothing is left of the
// refused create.
func TestCommitOutOfMemoryGoesToTheNextDevice(t *testing.T) {
	f := newFaultEnv(t, 16*g)
	s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Placement: parity{}, Access: []driver.DeviceID{0, 1}})
	f.lib.Fail("cuMemCreate", 3, 1, 2) // chunk 2, on device 0 by parity
	require.NoError(t, s.Commit(0, 4*g))
	require.Equal(t, []Extent{{0, g, 0, false}, {g, 3 * g, 1, false}}, s.Layout(), "chunks 1 and 3 by parity, 2 after device 0 was full")
	require.Equal(t, g, f.lib.Used(0))
	require.Equal(t, 3*g, f.lib.Used(1))
	require.Equal(t, int64(4), f.lib.Live("allocations"))
	_ = f.rangeState(t, s)
}

// TestGrantFaults: a grant over four chunks whose access for device 1
// differs (chunk 0 readable, the rest not: two runs, each one call of the
// driver, which makes one cuMemSetAccess a run — cuMemSetAccess spans
// adjacent mappings), and SetAccess of the whole range, with each
// cuMemSetAccess in turn refused — out of memory, as CUDA may answer it:
// the access CUDA grants each device on each chunk is what it was, and so
// are the range's books.
func TestGrantFaults(t *testing.T) {
	for _, op := range []string{"grant", "set access"} {
		t.Run(op, func(t *testing.T) {
			setup := func(t *testing.T, f *faultEnv) (func() error, func() any) {
				s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
				require.NoError(t, s.Commit(0, 4*g))
				require.NoError(t, s.Grant(1, 0, g, driver.AccessRead))
				f.fill(t, s, 3)
				call := func() error { return s.Grant(1, 0, 4*g, driver.AccessReadWrite) }
				if op == "set access" {
					call = func() error { return s.SetAccess(1, driver.AccessReadWrite) }
				}
				return call, func() any { return []any{f.rangeState(t, s), s.Access(1)} }
			}
			n := sweep(t, 16*g, setup, outOfMemory("cuMemSetAccess"))
			require.Equal(t, 2, n["cuMemSetAccess"], "one a run of equal access")
		})
	}
}

// TestMoveFaults: a move of four chunks, two on each device, to device 1
// (the two on device 0 move), with every libcuda call of the move refused
// in turn: the new chunks' creates, maps and grants, the borrowing of the
// old ones into the scratch range, the copies through the host, and the
// swap's unmaps, maps and grants. The range keeps its chunks, devices,
// access and bytes; the scratch range and the new chunks are gone.
func TestMoveFaults(t *testing.T) {
	setup := func(t *testing.T, f *faultEnv) (func() error, func() any) {
		s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Placement: parity{}, Access: []driver.DeviceID{0, 1}})
		require.NoError(t, s.Commit(0, 4*g))
		require.NoError(t, s.Grant(1, g, g, driver.AccessRead))
		f.fill(t, s, 4)
		return func() error { return s.Move(0, 4*g, 1) }, func() any { return f.rangeState(t, s) }
	}
	n := sweep(t, 16*g, setup, outOfMemory("cuMemCreate"), invalid("cuMemCreate"), invalid("cuMemMap"), invalid("cuMemSetAccess"),
		invalid("cuMemcpyDtoH_v2"), invalid("cuMemcpyHtoD_v2"), invalid("cuMemAddressReserve"),
		cudatest.Lingering(invalid("cuMemUnmap")), cudatest.Lingering(invalid("cuMemAddressFree")))
	require.Equal(t, 2, n["cuMemCreate"], "the chunks on device 0")
	t.Logf("a move of two chunks calls %v", n)
}

// allocState is an allocator as a failed Alloc must leave it: its live
// allocations (address, size, every byte) and figures. Committed memory
// is left out where the failure was out of memory: the allocator gives
// free memory back before it reports that, as PyTorch does; it must
// still be what the device holds.
type allocState struct {
	Live                 map[driver.Addr][]byte
	Allocated, Held      uint64
	Committed            uint64
	LargestFree, Stitch  uint64
	Count, Stitches, OOM int
}

func (f *faultEnv) allocState(t *testing.T, al *Allocator, lives []driver.Addr, withCommitted bool) allocState {
	t.Helper()
	require.NoError(t, al.Check())
	st := al.Stats()
	s := allocState{Live: map[driver.Addr][]byte{}, Allocated: st.Allocated, Held: al.held, LargestFree: st.LargestFree,
		Count: st.Live, Stitches: st.Stitches, OOM: st.OOMRetries}
	for _, p := range lives {
		n, err := al.Size(p)
		require.NoError(t, err)
		b := make([]byte, n)
		require.NoError(t, f.drv.Read(p, b))
		s.Live[p] = b
	}
	var committed uint64
	for d := range 2 {
		committed += f.drv.Used(driver.DeviceID(d))
	}
	require.Equal(t, st.Committed, committed, "the allocator's committed memory is what the driver holds")
	require.Equal(t, st.Committed, f.lib.Used(0), "and what CUDA holds")
	if withCommitted {
		s.Committed, s.Stitch = st.Committed, al.st.Stats().Borrowed
	} else {
		s.LargestFree = 0
	}
	return s
}

// allocSetup is an allocator of one-granule chunks with eight live
// allocations of a chunk each and a small one, all holding a pattern. Its
// operation asks for three chunks: with stitch, four alternate chunks
// are free and the budget is spent, so the request is stitched from them;
// without, there is room in the budget (a release threshold of eight
// chunks, a maximum well above: nothing is given back first), so it
// commits, ahead of need up to the budget.
func allocSetup(t *testing.T, f *faultEnv, mode string, withCommitted bool) (func() error, func() any) {
	stitch := mode != "grow"
	opt := func(o *AllocatorOptions) { o.ReleaseThreshold = 8 * g }
	if stitch {
		opt = strict
	}
	max, full := 64*g, func(*AllocatorOptions) {}
	if stitch && mode == "stitch" {
		// No hole beside the eight chunks: stitching, not moving.
		max, full = 9*g, func(o *AllocatorOptions) { o.AddressSpace = o.Max }
	}
	al := f.fine(t, max, PolicyDefault, opt, full)
	var lives []driver.Addr
	for i := range 8 {
		p, err := al.Alloc(g, 0)
		require.NoError(t, err)
		b := make([]byte, g)
		for k := range b {
			b[k] = byte(i*31 + k)
		}
		require.NoError(t, f.drv.Write(p, b))
		lives = append(lives, p)
	}
	small, err := al.Alloc(1000, 0) // in the small heap
	require.NoError(t, err)
	require.NoError(t, f.drv.Write(small, []byte("small")))
	lives = append(lives, small)
	switch mode {
	case "stitch":
		// Four single free chunks, none adjacent, and the budget spent:
		// a request of three chunks is stitched from them.
		for i := 0; i < 8; i += 2 {
			require.NoError(t, al.Free(lives[i]))
		}
		lives = []driver.Addr{lives[1], lives[3], lives[5], lives[7], small}
	case "relocate":
		// Three single free chunks, none adjacent: a request of three
		// chunks takes them where it goes, and nothing is left to give
		// back.
		for _, i := range []int{0, 2, 4} {
			require.NoError(t, al.Free(lives[i]))
		}
		lives = []driver.Addr{lives[1], lives[3], lives[5], lives[6], lives[7], small}
	}
	op := func() error {
		_, err := al.Alloc(3*g, 0)
		return err
	}
	return op, func() any { return f.allocState(t, al, lives, withCommitted) }
}

// TestAllocFaults: an Alloc that must commit three chunks, and one that
// must stitch them, with each cuMemCreate, cuMemMap and cuMemSetAccess of
// the operation refused in turn: the Alloc fails, every live allocation
// keeps its address, size and bytes, and the figures and invariants hold.
func TestAllocFaults(t *testing.T) {
	t.Run("grow", func(t *testing.T) {
		n := sweep(t, 80*g, func(t *testing.T, f *faultEnv) (func() error, func() any) {
			return allocSetup(t, f, "grow", true)
		}, invalid("cuMemCreate"), invalid("cuMemMap"), invalid("cuMemSetAccess"))
		t.Logf("the Alloc calls %v", n)
	})
	t.Run("stitch", func(t *testing.T) {
		n := sweep(t, 80*g, func(t *testing.T, f *faultEnv) (func() error, func() any) {
			return allocSetup(t, f, "stitch", true)
		}, invalid("cuMemMap"), invalid("cuMemSetAccess"))
		require.Equal(t, 3, n["cuMemMap"], "the three lent chunks mapped side by side")
		require.Equal(t, 1, n["cuMemSetAccess"], "granted in one call")
	})
	t.Run("relocate", func(t *testing.T) {
		n := sweep(t, 80*g, func(t *testing.T, f *faultEnv) (func() error, func() any) {
			return allocSetup(t, f, "relocate", true)
		}, invalid("cuMemUnmap"), invalid("cuMemMap"), invalid("cuMemSetAccess"))
		require.Equal(t, 3, n["cuMemUnmap"], "the three chunks unmapped where they were")
		require.Equal(t, 3, n["cuMemMap"], "and mapped side by side")
		require.Zero(t, n["cuMemCreate"], "nothing created")
	})
}

// TestAllocOutOfMemoryRetries: CUDA out of memory under an Alloc that must
// commit. The allocator's documented answer is to try again committing
// just what is needed, then again after giving back every free chunk, and
// only then report out of memory: one refused create costs nothing, two
// cost the free memory, and a GPU that stays full fails the Alloc naming
// CUDA's code — every live allocation intact each time.
func TestAllocOutOfMemoryRetries(t *testing.T) {
	for _, c := range []struct {
		name     string
		refusals int // consecutive creates refused, from the first; 0: all
		ok       bool
		retries  int
	}{
		{"once", 1, true, 0},
		{"twice", 2, true, 1},
		{"always", 0, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFaultEnv(t, 80*g)
			op, state := allocSetup(t, f, "grow", false)
			before := state().(allocState)
			f.lib.Fail("cuMemCreate", 1, c.refusals, 2)
			err := op()
			after := state().(allocState)
			require.Equal(t, before.OOM+c.retries, after.OOM, "OOM retries")
			if c.ok {
				require.NoError(t, err)
				require.Equal(t, before.Count+1, after.Count)
				for p, b := range before.Live {
					require.Equal(t, b, after.Live[p], "live allocation at %s", p)
				}
				return
			}
			drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)")
			after.OOM = before.OOM
			require.Equal(t, before, after)
			f.lib.Clear()
			require.NoError(t, op())
		})
	}
}

// closer is an object whose Close and give-back calls are tried with
// libcuda refusing an unmap, a release or a free.
type closer struct {
	name string
	// setup builds it on f, holding memory, and returns the call that
	// gives memory back and a check of its books.
	setup func(t *testing.T, f *faultEnv) (call func() error, check func() error)
}

// TestGiveBackFaults: Close of a range, an arena and an allocator, and a
// range's Decommit, an arena's Trim and an allocator's Trim, with each
// cuMemUnmap, cuMemRelease and cuMemAddressFree they make refused in
// turn. What was unmapped cannot be mapped back (its memory is gone), so
// the call may have given back part of what it was asked: the books must
// say exactly that (every Check passes, physical memory and the driver
// agree with CUDA), and the same call, once CUDA accepts it, finishes the
// job — at the end the stand-in holds nothing.
func TestGiveBackFaults(t *testing.T) {
	for _, c := range []closer{
		{"range close", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
			require.NoError(t, s.Commit(0, 5*g))
			return s.Close, s.Check
		}},
		{"range decommit", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			s := f.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
			require.NoError(t, s.Commit(0, 5*g))
			return func() error { return s.Decommit(0, 6*g) }, s.Check
		}},
		{"arena close", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			a := f.arena(t, Options{Max: 8 * g, ChunkSize: g, MaxChunk: g})
			require.NoError(t, a.Grow(3*g+5))
			return a.Close, a.Check
		}},
		{"arena trim", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			a := f.arena(t, Options{Max: 8 * g, ChunkSize: g, MaxChunk: g})
			require.NoError(t, a.Grow(4*g))
			require.NoError(t, a.Shrink(3*g))
			return a.Trim, a.Check
		}},
		{"allocator", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			al := f.fine(t, 7*g, PolicyDefault, strict, full(7))
			var ps []driver.Addr
			for range 6 {
				p, err := al.Alloc(g, 0)
				require.NoError(t, err)
				ps = append(ps, p)
			}
			small, err := al.Alloc(100, 0)
			require.NoError(t, err)
			for i := 0; i < 6; i += 2 {
				require.NoError(t, al.Free(ps[i]))
			}
			big, err := al.Alloc(3*g, 0) // stitched from the three free chunks
			require.NoError(t, err)
			require.Equal(t, 1, al.Stats().Stitches)
			for _, p := range []driver.Addr{big, ps[1], ps[3], ps[5], small} {
				require.NoError(t, al.Free(p))
			}
			return al.Close, al.Check
		}},
		{"allocator trim", func(t *testing.T, f *faultEnv) (func() error, func() error) {
			al := f.fine(t, 16*g, PolicyDefault, strict)
			var ps []driver.Addr
			for range 6 {
				p, err := al.Alloc(g, 0)
				require.NoError(t, err)
				ps = append(ps, p)
			}
			for i := 0; i < 6; i += 2 {
				require.NoError(t, al.Free(ps[i]))
			}
			return al.Trim, al.Check
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := map[string]int{}
			t.Run("count", func(t *testing.T) {
				f := newFaultEnv(t, 32*g)
				call, check := c.setup(t, f)
				before := map[string]uint64{}
				for _, fn := range []string{"cuMemUnmap", "cuMemRelease", "cuMemAddressFree"} {
					before[fn] = f.lib.Calls(fn)
				}
				require.NoError(t, call())
				require.NoError(t, check())
				for fn, n := range before {
					calls[fn] = int(f.lib.Calls(fn) - n)
				}
			})
			for _, fn := range []string{"cuMemUnmap", "cuMemRelease", "cuMemAddressFree"} {
				for nth := 1; nth <= calls[fn]; nth++ {
					t.Run(fmt.Sprintf("%s#%d-of-%d", fn, nth, calls[fn]), func(t *testing.T) {
						f := newFaultEnv(t, 32*g)
						call, check := c.setup(t, f)
						f.lib.Fail(fn, nth, 1, 1)
						drivertest.RequireIs(t, call(), driver.ErrInvalid, fn+": CUDA_ERROR_INVALID_VALUE (1)")
						if err := check(); err != nil && !errors.Is(err, driver.ErrClosed) {
							require.NoError(t, err, "the books say what is left")
						}
						_ = f.underneath(t) // physical memory and the driver pass their checks and agree with CUDA
						f.lib.Clear()
						require.NoError(t, call(), "the same call, once CUDA accepts it")
						require.NoError(t, check())
					})
				}
			}
			t.Logf("%v", calls)
		})
	}
}
