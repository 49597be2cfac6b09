package arena

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

const g = 64 * units.KiB // test granularity

// env is a small stack over one driver: two devices of capacity bytes
// each (drivers_test.go lists the drivers).
type env struct {
	drv   testDriver
	space *vaspace.Space
	mem   *physical.Memory
}

// newEnv is an env on the host driver, for the tests that stay host-only.
func newEnv(t testing.TB, capacity uint64) *env {
	t.Helper()
	drv := openHost(t, 2, capacity)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

func (e *env) arena(t testing.TB, opts Options) *Arena {
	t.Helper()
	a, err := New(e.space, e.mem, opts)
	require.NoError(t, err)
	t.Cleanup(func() { closeArena(t, a) })
	return a
}

func (e *env) used(t testing.TB, dev driver.DeviceID) uint64 {
	u, err := e.mem.Usage(dev)
	require.NoError(t, err)
	return u.Used
}

func TestGrowShrinkTrim(t *testing.T) { onEveryDriver(t, growShrinkTrim) }

func growShrinkTrim(t *testing.T, d backend) {
	e := d.env(t, 64*g)
	a := e.arena(t, Options{Max: 1 * units.GiB, ChunkSize: g, MaxChunk: 4 * g})
	base := a.Base()
	require.NoError(t, a.Grow(100))
	require.Equal(t, uint64(100), a.Len())
	require.Equal(t, g, a.Committed())
	v, err := a.View(0, 100)
	require.NoError(t, err)
	e.writeView(t, v, 0, []byte("written before growth"))

	require.NoError(t, a.Grow(10*g)) // crosses MaxChunk: several chunks
	require.Equal(t, base, a.Base(), "the base never moves")
	require.Equal(t, 100+10*g, a.Len())
	require.Equal(t, 11*g, a.Committed())
	require.Equal(t, "written before growth", string(e.readView(t, v, 0, 21)), "a view taken before growth still reads its bytes")
	st := a.Stats()
	require.Equal(t, 4, st.ChunkMaps, "1 chunk, then 10 granules as 4+4+2")
	require.Equal(t, 2, st.MapEvents, "two grows, each one contiguous range")
	require.Equal(t, 11*g, e.used(t, 0))

	require.NoError(t, v.Release())
	require.NoError(t, a.Shrink(9*g))
	require.Equal(t, 11*g, a.Committed(), "shrink keeps chunks until Trim")
	require.NoError(t, a.Trim())
	require.Equal(t, 1*g+4*g, a.Committed(), "the 4-granule chunk Len still reaches into stays whole")
	require.Equal(t, 5*g, e.used(t, 0))
	require.NoError(t, a.Resize(0))
	require.NoError(t, a.Trim())
	require.Zero(t, a.Committed())
	require.Zero(t, e.used(t, 0))
	require.Equal(t, 11*g, a.Stats().PeakCommitted)
	require.NoError(t, a.Check())
	require.NoError(t, a.Close())
}

// TestGrowRollsBackOnOOM: a grow the device plainly cannot hold is refused
// before anything is mapped; one that runs out part-way (memory taken by
// someone this arena's accounting does not see) unmaps what it had mapped.
// Either way the arena is unchanged and the error says what was asked and
// what the device had.
func TestGrowRollsBackOnOOM(t *testing.T) { onEveryDriver(t, growRollsBackOnOOM) }

func growRollsBackOnOOM(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	a := e.arena(t, Options{Max: units.GiB, ChunkSize: g, MaxChunk: 4 * g})
	require.NoError(t, a.Grow(6*g))
	before := a.Stats()
	drivertest.RequireIs(t, a.Grow(12*g), driver.ErrOutOfMemory, "grow by 768 KiB", "needed 768 KiB more committed", "device 0 had 640 KiB free")
	require.Equal(t, before, a.Stats(), "refused up front: nothing mapped")

	// A second physical memory on the same driver takes 3 granules: this
	// arena still thinks 10 are free; the driver has 7, and the second chunk
	// (4 + 4 + 2) of the grow fails.
	hog, err := physical.New(e.drv).Create(0, 3*g, driver.ChunkOptions{})
	require.NoError(t, err)
	err = a.Grow(10 * g)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "needed 640 KiB more committed", "asked 256 KiB, device has 192 KiB free")
	after := a.Stats()
	require.Equal(t, before.Len, after.Len)
	require.Equal(t, before.Committed, after.Committed)
	require.Equal(t, before.Chunks, after.Chunks)
	require.Equal(t, before.ChunkMaps+1, after.ChunkMaps, "one chunk was mapped...")
	require.Equal(t, before.ChunkUnmaps+1, after.ChunkUnmaps, "...and unmapped again")
	require.Equal(t, 6*g, e.used(t, 0), "the chunks of the failed grow went back")
	require.NoError(t, a.Check())
	require.NoError(t, hog.Release())
	require.NoError(t, a.Grow(10*g), "with the memory back, the same grow succeeds")
}

// TestChunkLargerThanMax: the old arena rounded Max to the driver's
// granularity, below a larger chunk size, and then every grow failed with
// "not reserved". Max is rounded up to whole chunks: the arena grows.
func TestChunkLargerThanMax(t *testing.T) { onEveryDriver(t, chunkLargerThanMax) }

func chunkLargerThanMax(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	a := e.arena(t, Options{Max: g, ChunkSize: 4 * g})
	require.Equal(t, 4*g, a.Max())
	require.NoError(t, a.Grow(g))
	require.NoError(t, a.Grow(3*g))
	drivertest.RequireIs(t, a.Grow(1), driver.ErrOutOfMemory, "past the arena's maximum")
	require.Equal(t, 4*g, a.Committed())
	require.NoError(t, a.Check())
	require.NoError(t, a.Close())
}

func TestViewsBlockShrink(t *testing.T) { onEveryDriver(t, viewsBlockShrink) }

func viewsBlockShrink(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g})
	require.NoError(t, a.Grow(4*g))
	v, err := a.View(2*g, g)
	require.NoError(t, err)
	drivertest.RequireIs(t, a.Shrink(2*g+1), driver.ErrBusy, "live view [0x20000, +64 KiB)")
	require.Equal(t, 4*g, a.Len())
	require.NoError(t, a.Shrink(g), "a shrink that leaves the view whole is fine")
	drivertest.RequireIs(t, a.Close(), driver.ErrBusy, "view")
	require.NoError(t, v.Release())
	require.NoError(t, a.Shrink(3*g))
	require.NoError(t, a.Close())
}

// TestBadInput: every refusal, each leaving the arena as it was.
func TestBadInput(t *testing.T) { onEveryDriver(t, badInput) }

func badInput(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	for _, c := range []struct {
		name     string
		opts     Options
		sentinel error
		mentions string
	}{
		{"zero max", Options{}, driver.ErrInvalid, "Max is zero"},
		{"unknown device", Options{Device: 5, Max: g}, driver.ErrNoDevice, "device 5"},
		{"chunk below granularity", Options{Max: g, ChunkSize: g / 2}, driver.ErrMisaligned, "64 KiB"},
		{"max chunk not a multiple", Options{Max: g, ChunkSize: g, MaxChunk: 3 * g / 2}, driver.ErrMisaligned, "MaxChunk"},
		{"unknown access device", Options{Max: g, ChunkSize: g, Access: []driver.DeviceID{0, 9}}, driver.ErrNoDevice, "device 9"},
	} {
		_, err := New(e.space, e.mem, c.opts)
		drivertest.RequireIs(t, err, c.sentinel, c.mentions)
	}
	require.Empty(t, e.space.Reservations(), "failed New reserved nothing")

	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g})
	require.NoError(t, a.Grow(2*g))
	v, err := a.View(0, g)
	require.NoError(t, err)
	state := func() Stats { require.NoError(t, a.Check()); return a.Stats() }
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"grow past max", func() error { return a.Grow(7 * g) }, driver.ErrOutOfMemory, "maximum"},
		{"grow out of memory", nil, nil, ""},
		{"shrink past zero", func() error { return a.Shrink(3 * g) }, driver.ErrInvalid, "only 128 KiB long"},
		{"shrink under a view", func() error { return a.Shrink(2 * g) }, driver.ErrBusy, "live view"},
		{"view past the end", func() error { _, err := a.View(g, 2*g); return err }, driver.ErrNotMapped, "128 KiB long"},
		{"view of nothing", func() error { _, err := a.View(0, 0); return err }, driver.ErrInvalid, "zero"},
		{"view overflowing", func() error { _, err := a.View(1, ^uint64(0)); return err }, driver.ErrNotMapped, ""},
	} {
		if c.call == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			before := state()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			require.Equal(t, before, state())
		})
	}
	// Out of memory: another arena holds most of the device.
	other := e.arena(t, Options{Max: 16 * g, ChunkSize: g})
	require.NoError(t, other.Grow(13*g))
	before := state()
	drivertest.RequireIs(t, a.Grow(2*g), driver.ErrOutOfMemory, "device 0 had 64 KiB free")
	require.Equal(t, before, state())

	require.NoError(t, v.Release())
	drivertest.RequireIs(t, v.Release(), driver.ErrClosed, "released view")
	_, err = v.Bytes()
	drivertest.RequireIs(t, err, driver.ErrClosed, "released view")
	require.NoError(t, a.Close())
	for _, call := range []func() error{
		func() error { return a.Grow(1) }, func() error { return a.Shrink(0) }, func() error { return a.Resize(0) },
		a.Trim, a.Close, func() error { _, err := a.View(0, 1); return err },
	} {
		drivertest.RequireIs(t, call(), driver.ErrClosed, "closed arena")
	}
}

// TestArenaModel runs random grow/shrink/resize/trim/view/release
// sequences against a model of the chunk list, checking after every step
// that lengths, chunks and usage agree, every view's bytes hold what was
// written, and the invariants hold.
func TestArenaModel(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		for seed := range uint64(d.Seeds(12)) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				r := runArenaModel(t, d, arenaOps(rand.New(rand.NewPCG(seed, 5)), 200))
				// The sequences must reach real states, not only refusals.
				require.Greater(t, r.grows, 5, "successful grows")
				require.Greater(t, r.views, 5, "views taken")
				require.Greater(t, r.maxLen, 4*g, "longest the arena got")
			})
		}
	})
}

func arenaOps(rng *rand.Rand, n int) []byte {
	b := make([]byte, 3*n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

type modelRun struct {
	grows, views int
	maxLen       uint64
}

func runArenaModel(t *testing.T, d backend, data []byte) (r modelRun) {
	const maxChunk = 3 * g
	e := d.env(t, 32*g)
	a := e.arena(t, Options{Max: 24 * g, ChunkSize: g, MaxChunk: maxChunk})
	var length uint64
	var chunks []uint64 // sizes, in order
	committed := func() (c uint64) {
		for _, s := range chunks {
			c += s
		}
		return c
	}
	type mview struct {
		v      *View
		off, n uint64
		tag    byte
	}
	var views []mview
	written := map[uint64]byte{} // bytes written through views; they outlive the views
	for i := 0; i+3 <= len(data) && i < 3*150; i += 3 {
		op, x, y := data[i]%6, uint64(data[i+1]), uint64(data[i+2])
		switch op {
		case 0: // grow by up to 4 granules
			n := x * g / 64
			err := a.Grow(n)
			if length+n > 24*g || committed()+max(0, alignUp(length+n, g)-committed()) > 32*g {
				require.Error(t, err)
				break
			}
			require.NoError(t, err)
			if need := alignUp(length+n, g); need > committed() {
				for rest := need - committed(); rest > 0; rest -= min(rest, maxChunk) {
					chunks = append(chunks, min(rest, maxChunk))
				}
			}
			length += n
			r.grows++
			r.maxLen = max(r.maxLen, length)
		case 1: // shrink by up to 4 granules
			n := min(x*g/64, length+1)
			limit := uint64(0)
			for _, v := range views {
				limit = max(limit, v.off+v.n)
			}
			err := a.Shrink(n)
			if n > length || length-n < limit {
				require.Error(t, err)
				break
			}
			require.NoError(t, err)
			length -= n
		case 2: // trim
			require.NoError(t, a.Trim())
			for at := committed(); len(chunks) > 0 && at-chunks[len(chunks)-1] >= length; {
				at -= chunks[len(chunks)-1]
				chunks = chunks[:len(chunks)-1]
			}
			for at := range written { // a trimmed chunk's memory is gone; a new one is zero
				if at >= committed() {
					delete(written, at)
				}
			}
		case 3, 4: // view, writing a tag
			if length == 0 {
				break
			}
			off := x * length / 256
			n := min(y*64+1, length-off)
			v, err := a.View(off, n)
			require.NoError(t, err)
			tag := byte(i)
			e.writeView(t, v, 0, []byte{tag})
			e.writeView(t, v, n-1, []byte{tag})
			written[off], written[off+n-1] = tag, tag
			views = append(views, mview{v, off, n, tag})
			r.views++
		case 5: // release a view
			if len(views) == 0 {
				break
			}
			k := int(x) % len(views)
			require.NoError(t, views[k].v.Release())
			views = append(views[:k], views[k+1:]...)
		}
		st := a.Stats()
		require.Equal(t, length, st.Len, "step %d", i/3)
		require.Equal(t, committed(), st.Committed, "step %d", i/3)
		require.Equal(t, len(chunks), st.Chunks, "step %d", i/3)
		require.Equal(t, committed(), e.used(t, 0), "step %d", i/3)
		for k, v := range views {
			for _, at := range []uint64{v.off, v.off + v.n - 1} {
				require.Equal(t, written[at], e.readView(t, v.v, at-v.off, 1)[0], "view %d byte %d, step %d", k, at, i/3)
			}
		}
		require.NoError(t, a.Check())
	}
	for _, v := range views {
		require.NoError(t, v.v.Release())
	}
	require.NoError(t, a.Close())
	require.Zero(t, e.used(t, 0))
	return r
}

// FuzzArenaModel fuzzes the arena model's operation decoder.
func FuzzArenaModel(f *testing.F) {
	f.Add(arenaOps(rand.New(rand.NewPCG(1, 1)), 40))
	ds := fuzzDrivers(f, 2, 32*g) // runArenaModel's machine
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range ds {
			_ = runArenaModel(t, d, data)
		}
	})
}

func TestAppend(t *testing.T) { onEveryDriver(t, arenaAppend) }

func arenaAppend(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	a := e.arena(t, Options{Max: 4 * g, ChunkSize: g})
	require.NoError(t, a.Grow(3))
	v, err := a.Append(100, 64)
	require.NoError(t, err)
	require.Equal(t, uint64(64), v.Offset(), "padded to the alignment")
	require.Equal(t, uint64(164), a.Len())
	require.Equal(t, uint64(100), v.Len())
	if b, err := v.Bytes(); e.hostMapped() {
		require.NoError(t, err)
		require.Len(t, b, 100)
	} else {
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "not addressable from the host")
	}
	w, err := a.Append(8, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(164), w.Offset())
	drivertest.RequireIs(t, a.Shrink(10), driver.ErrBusy, "live view")
	before := a.Stats()
	for _, c := range []struct {
		call     func() error
		sentinel error
	}{
		{func() error { _, err := a.Append(0, 0); return err }, driver.ErrInvalid},
		{func() error { _, err := a.Append(8, 3); return err }, driver.ErrInvalid},
		{func() error { _, err := a.Append(4*g, 0); return err }, driver.ErrOutOfMemory},
		{func() error { _, err := a.Append(^uint64(0)-100, 0); return err }, driver.ErrOutOfMemory},
	} {
		drivertest.RequireIs(t, c.call(), c.sentinel)
		require.Equal(t, before, a.Stats())
	}
	require.Equal(t, e.hostMapped(), a.HostAddressable())
	require.NoError(t, v.Release())
	require.NoError(t, w.Release())
	require.NoError(t, a.Close())
	_, err = a.Append(1, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
}

// TestNoLeaks: an arena, an allocator with stitched and plain allocations,
// tensors' worth of views — all closed — leave file descriptors, kernel
// mappings and resident shared memory where they were.
func TestNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 1, Capacity: 32 * g, Granularity: g})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		a, err := New(space, mem, Options{Max: 16 * g, ChunkSize: g})
		require.NoError(t, err)
		v, err := a.Append(3*g, 0)
		require.NoError(t, err)
		b, err := v.Bytes()
		require.NoError(t, err)
		b[len(b)-1] = 1
		require.NoError(t, v.Release())
		// One allocator moves free chunks to where a request goes, one
		// with no room in its address space stitches them.
		for _, o := range []AllocatorOptions{{Max: 16 * g, ChunkSize: g}, {Max: 7 * g, AddressSpace: 7 * g, ChunkSize: g, ReleaseThreshold: 1}} {
			al, err := NewAllocator(space, mem, o)
			require.NoError(t, err)
			var ps []driver.Addr
			for i := 0; i < 6; i++ {
				p, err := al.Alloc(g, 0)
				require.NoError(t, err)
				ps = append(ps, p)
			}
			for i := 0; i < 6; i += 2 {
				require.NoError(t, al.Free(ps[i]))
			}
			big, err := al.Alloc(3*g, 0)
			require.NoError(t, err)
			st := al.Stats()
			require.Equal(t, 1, st.Stitches+st.Relocations)
			for _, p := range []driver.Addr{big, ps[1], ps[3], ps[5]} {
				require.NoError(t, al.Free(p))
			}
			require.NoError(t, al.Close())
		}
		require.NoError(t, a.Close())
		hb, err := drv.HeapBytes(0)
		require.NoError(t, err)
		require.Zero(t, hb, "every chunk went back to the kernel before the driver closed")
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}
