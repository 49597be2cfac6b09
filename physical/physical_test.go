package physical

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/mapref"
	"github.com/vmarena/vmarena/internal/units"
)

const (
	gran     = 2 << 20
	capacity = 64 << 20
	devices  = 2
)

func newMemory(t testing.TB) (*Memory, *sim.Driver) {
	t.Helper()
	d, err := sim.New(sim.Options{Devices: devices, Capacity: capacity, Granularity: gran})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	return New(d), d
}

// state is everything observable about a Memory, for "unchanged" checks.
type state struct {
	usage  []Usage
	chunks []chunkState
	driver []uint64
}

type chunkState struct {
	handle   driver.Handle
	released bool
	maps     int
}

func stateOf(t *testing.T, m *Memory, d *sim.Driver) state {
	t.Helper()
	var st state
	for dev := range driver.DeviceID(devices) {
		u, err := m.Usage(dev)
		require.NoError(t, err)
		st.usage = append(st.usage, u)
		st.driver = append(st.driver, d.Used(dev))
	}
	for _, c := range m.Chunks() {
		st.chunks = append(st.chunks, chunkState{c.Handle(), c.Released(), c.Mappings()})
	}
	return st
}

// requireIs checks err is marked with target (and no other sentinel) and
// its message says want.
func requireIs(t *testing.T, err, target error, want ...string) {
	t.Helper()
	drivertest.RequireIs(t, err, target, want...)
}

// requireIsMsg is requireIs with msg in the failure.
func requireIsMsg(t *testing.T, msg string, err, target error, want ...string) {
	t.Helper()
	require.Error(t, err, msg)
	drivertest.RequireIs(t, err, target, want...)
}

func createErr(_ *Chunk, err error) error { return err }

func usage(t *testing.T, m *Memory, dev driver.DeviceID) Usage {
	t.Helper()
	u, err := m.Usage(dev)
	require.NoError(t, err)
	return u
}

func TestCreate(t *testing.T) {
	m, d := newMemory(t)
	require.Same(t, d, m.Driver())
	a, err := m.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	b, err := m.Create(1, 3*gran, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	require.Equal(t, driver.DeviceID(1), a.Device())
	require.Equal(t, uint64(gran), a.Size())
	require.False(t, a.Shareable())
	require.True(t, b.Shareable())
	require.False(t, a.Released())
	require.Zero(t, a.Mappings())
	require.Equal(t, fmt.Sprintf("chunk %d (2 MiB on device 1)", a.Handle()), a.String())
	require.Equal(t, fmt.Sprintf("chunk %d (6 MiB on device 1)", b.Handle()), b.String())
	require.Equal(t, Usage{Device: 1, Used: 4 * gran, Peak: 4 * gran, Capacity: capacity, Chunks: 2}, usage(t, m, 1))
	require.Equal(t, Usage{Device: 0, Capacity: capacity}, usage(t, m, 0))
	require.Equal(t, []*Chunk{a, b}, m.Chunks())

	require.NoError(t, a.Release())
	require.True(t, a.Released())
	require.Equal(t, Usage{Device: 1, Used: 3 * gran, Peak: 4 * gran, Capacity: capacity, Chunks: 1}, usage(t, m, 1))
	require.Equal(t, d.Used(1), usage(t, m, 1).Used)
	require.Equal(t, []*Chunk{b}, m.Chunks())
	require.NoError(t, m.Check())
}

func TestCreateRejectsBadInput(t *testing.T) {
	m, d := newMemory(t)
	_, err := m.Create(0, capacity-2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	_, err = m.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	before := stateOf(t, m, d)

	requireIs(t, createErr(m.Create(2, gran, driver.ChunkOptions{})), driver.ErrNoDevice, "physical: create 2 MiB on device 2")
	requireIs(t, createErr(m.Create(-1, gran, driver.ChunkOptions{})), driver.ErrNoDevice, "device -1")
	requireIs(t, createErr(m.Create(0, 0, driver.ChunkOptions{})), driver.ErrInvalid, "physical: create", "size is zero")
	requireIs(t, createErr(m.Create(0, gran+4096, driver.ChunkOptions{})), driver.ErrMisaligned,
		"physical: create", "not a multiple of the granularity 2 MiB")
	requireIs(t, createErr(m.Create(1, gran/2, driver.ChunkOptions{})), driver.ErrMisaligned, "granularity 2 MiB")
	// Out of memory: says what was asked and what was free.
	err = createErr(m.Create(0, 4*gran, driver.ChunkOptions{}))
	requireIs(t, err, driver.ErrOutOfMemory, "physical: create 8 MiB on device 0", "asked 8 MiB, device has 4 MiB free of 64 MiB")
	require.NotEmpty(t, errors.GetAllHints(err))

	require.Equal(t, before, stateOf(t, m, d))
	require.NoError(t, m.Check())
	require.NoError(t, d.Check())

	// Exactly what is free still fits.
	_, err = m.Create(0, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, uint64(capacity), usage(t, m, 0).Used)
}

func TestUsageRejectsUnknownDevice(t *testing.T) {
	m, _ := newMemory(t)
	for _, dev := range []driver.DeviceID{-1, devices, driver.MaxDevices} {
		_, err := m.Usage(dev)
		requireIs(t, err, driver.ErrNoDevice, "physical: usage", fmt.Sprintf("device %d", dev))
	}
}

func TestReleaseTwice(t *testing.T) {
	m, d := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Release())
	before := stateOf(t, m, d)
	requireIs(t, c.Release(), driver.ErrBadHandle, "physical: release "+c.String(), "already released")
	require.Equal(t, before, stateOf(t, m, d))
	require.NoError(t, m.Check())
}

func TestDropWithoutAcquire(t *testing.T) {
	m, d := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	before := stateOf(t, m, d)
	err = c.drop()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.Contains(t, err.Error(), "more drops than acquires")
	require.Equal(t, before, stateOf(t, m, d))

	require.NoError(t, c.acquire())
	require.NoError(t, c.drop())
	require.True(t, errors.HasAssertionFailure(c.drop()))
	require.Equal(t, before, stateOf(t, m, d))
	require.NoError(t, m.Check())
}

func TestAcquireReleased(t *testing.T) {
	m, d := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, c.acquire())
	require.NoError(t, c.Release())
	before := stateOf(t, m, d)
	requireIs(t, c.acquire(), driver.ErrBadHandle, "physical: acquire "+c.String(), "released")
	require.Equal(t, before, stateOf(t, m, d))
	require.NoError(t, c.drop())
	require.NoError(t, m.Check())
}

// TestReleaseOfMappedChunk plays the mapping layer (Acquire + driver Map,
// driver Unmap + Drop) and checks that Used follows the driver: a released
// chunk keeps its memory until its last mapping is gone.
func TestReleaseOfMappedChunk(t *testing.T) {
	m, d := newMemory(t)
	base, err := d.Reserve(8*gran, 0, 0)
	require.NoError(t, err)
	c, err := m.Create(1, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	// Two mappings of the same chunk (aliasing).
	for _, at := range []driver.Addr{base, base + 4*gran} {
		require.NoError(t, c.acquire())
		require.NoError(t, d.Map(at, c.Handle()))
	}
	require.Equal(t, 2, c.Mappings())
	require.NoError(t, c.Release())
	agree := func(used uint64, chunks int) {
		t.Helper()
		u := usage(t, m, 1)
		require.Equal(t, used, u.Used)
		require.Equal(t, chunks, u.Chunks)
		require.Equal(t, d.Used(1), u.Used, "physical and the driver agree")
		require.Equal(t, uint64(2*gran), u.Peak)
		require.NoError(t, m.Check())
		require.NoError(t, d.Check())
	}
	agree(2*gran, 1)
	require.True(t, c.Released())
	require.Equal(t, []*Chunk{c}, m.Chunks(), "still listed: its memory is not returned")
	requireIs(t, d.Map(base+2*gran, c.Handle()), driver.ErrBadHandle) // the driver agrees it is released

	require.NoError(t, d.Unmap(base, 2*gran))
	require.NoError(t, c.drop())
	agree(2*gran, 1)
	require.NoError(t, d.Unmap(base+4*gran, 2*gran))
	require.NoError(t, c.drop())
	agree(0, 0)
	require.Empty(t, m.Chunks())
	require.Zero(t, c.Mappings())
	require.True(t, errors.HasAssertionFailure(c.drop()))
	requireIs(t, c.Release(), driver.ErrBadHandle, "already released")
	agree(0, 0)
}

func TestClose(t *testing.T) {
	m, d := newMemory(t)
	base, err := d.Reserve(4*gran, 0, 0)
	require.NoError(t, err)
	free, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	mapped, err := m.Create(0, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	done, err := m.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, done.Release())
	require.NoError(t, mapped.acquire())
	require.NoError(t, d.Map(base, mapped.Handle()))

	require.NoError(t, m.Close())
	require.True(t, free.Released())
	require.True(t, mapped.Released())
	require.Equal(t, []*Chunk{mapped}, m.Chunks(), "the mapped chunk keeps its memory")
	require.Equal(t, Usage{Device: 0, Used: 2 * gran, Peak: 3 * gran, Capacity: capacity, Chunks: 1}, usage(t, m, 0))
	require.Equal(t, d.Used(0), usage(t, m, 0).Used)
	require.NoError(t, m.Check())

	// Every call that would change something is refused.
	requireIs(t, createErr(m.Create(0, gran, driver.ChunkOptions{})), driver.ErrClosed, "physical: create")
	requireIs(t, free.Release(), driver.ErrClosed, "physical: release")
	requireIs(t, mapped.acquire(), driver.ErrClosed, "physical: acquire")
	requireIs(t, m.Close(), driver.ErrClosed, "physical: close")
	require.Equal(t, 1, mapped.Mappings())

	// The mapping layer can still drop the last mapping.
	require.NoError(t, d.Unmap(base, 2*gran))
	require.NoError(t, mapped.drop())
	require.Empty(t, m.Chunks())
	require.Zero(t, usage(t, m, 0).Used)
	require.Zero(t, d.Used(0))
	require.NoError(t, m.Check())
	require.NoError(t, d.Check())
}

// TestCloseWhenDriverRefuses: the driver is closed first; Close reports the
// refusals, keeps the chunks counted, and is closed all the same.
func TestCloseWhenDriverRefuses(t *testing.T) {
	if invariants.Enabled {
		t.Skip("Close leaves a broken invariant on purpose, which the invariants build stops at")
	}
	m, d := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	requireIs(t, m.Close(), driver.ErrClosed, "physical: close", "physical: release "+c.String())
	require.False(t, c.Released())
	require.Equal(t, []*Chunk{c}, m.Chunks())
	requireIs(t, createErr(m.Create(0, gran, driver.ChunkOptions{})), driver.ErrClosed)
	require.True(t, errors.HasAssertionFailure(m.Check()), "an unreleased chunk after Close is reported")
}

// model is the reference model: live chunks and per-device counters.
type model struct {
	chunks map[driver.Handle]*mchunk
	used   [devices]uint64
	peak   [devices]uint64
}

type mchunk struct {
	c        *Chunk
	dev      driver.DeviceID
	size     uint64
	released bool
	maps     []driver.Addr
}

func (md *model) returnIfDone(mc *mchunk) {
	if mc.released && len(mc.maps) == 0 {
		delete(md.chunks, mc.c.Handle())
		md.used[mc.dev] -= mc.size
	}
}

// TestModel runs random operations, including the mapping layer's part
// (Acquire + driver Map, driver Unmap + Drop), against a reference model and
// compares all state, and the driver's, after every step.
func TestModel(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 800) })
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	m, d := newMemory(t)
	const vaSize = 4 * capacity * devices
	base, err := d.Reserve(vaSize, 0, 0)
	require.NoError(t, err)
	va := extent.New(uint64(base), vaSize)
	md := &model{chunks: map[driver.Handle]*mchunk{}}
	var gone []*Chunk // returned chunks
	handles := func() []driver.Handle { return slices.Sorted(maps.Keys(md.chunks)) }
	pick := func(ok func(*mchunk) bool) *mchunk {
		var cs []*mchunk
		for _, h := range handles() {
			if ok(md.chunks[h]) {
				cs = append(cs, md.chunks[h])
			}
		}
		if len(cs) == 0 {
			return nil
		}
		return cs[rng.IntN(len(cs))]
	}

	for step := range steps {
		var desc string
		switch op := rng.IntN(100); {
		case op < 35:
			dev := driver.DeviceID(rng.IntN(devices + 1))
			k := uint64(rng.IntN(10))
			size := k * gran
			if rng.IntN(20) == 0 {
				size += 4096
			}
			desc = fmt.Sprintf("create %d bytes on device %d", size, dev)
			c, err := m.Create(dev, size, driver.ChunkOptions{Shareable: rng.IntN(4) == 0})
			switch {
			case dev >= devices:
				requireIsMsg(t, desc, err, driver.ErrNoDevice)
			case size == 0:
				requireIsMsg(t, desc, err, driver.ErrInvalid)
			case size%gran != 0:
				requireIsMsg(t, desc, err, driver.ErrMisaligned, "granularity 2 MiB")
			case md.used[dev]+size > capacity:
				requireIsMsg(t, desc, err, driver.ErrOutOfMemory, fmt.Sprintf("has %s free", units.Bytes(capacity-md.used[dev])))
			default:
				require.NoError(t, err, desc)
				md.chunks[c.Handle()] = &mchunk{c: c, dev: dev, size: size}
				md.used[dev] += size
				md.peak[dev] = max(md.peak[dev], md.used[dev])
			}
		case op < 55:
			mc := pick(func(mc *mchunk) bool { return !mc.released })
			if mc == nil {
				continue
			}
			desc = fmt.Sprintf("release %s", mc.c)
			require.NoError(t, mc.c.Release(), desc)
			mc.released = true
			md.returnIfDone(mc)
		case op < 60:
			mc := pick(func(mc *mchunk) bool { return mc.released })
			c := (*Chunk)(nil)
			if mc != nil {
				c = mc.c
			} else if len(gone) > 0 {
				c = gone[rng.IntN(len(gone))]
			} else {
				continue
			}
			desc = fmt.Sprintf("release and acquire released %s", c)
			requireIsMsg(t, desc, c.Release(), driver.ErrBadHandle, "already released")
			requireIsMsg(t, desc, c.acquire(), driver.ErrBadHandle)
		case op < 80:
			mc := pick(func(mc *mchunk) bool { return !mc.released })
			if mc == nil {
				continue
			}
			desc = fmt.Sprintf("map %s", mc.c)
			at, ok := va.Alloc(mc.size, gran)
			require.True(t, ok)
			require.NoError(t, mc.c.acquire(), desc)
			require.NoError(t, d.Map(driver.Addr(at), mc.c.Handle()), desc)
			mc.maps = append(mc.maps, driver.Addr(at))
		case op < 97:
			mc := pick(func(mc *mchunk) bool { return len(mc.maps) > 0 })
			if mc == nil {
				continue
			}
			i := rng.IntN(len(mc.maps))
			at := mc.maps[i]
			desc = fmt.Sprintf("unmap %s at %s", mc.c, at)
			require.NoError(t, d.Unmap(at, mc.size), desc)
			require.NoError(t, mc.c.drop(), desc)
			require.NoError(t, va.Free(uint64(at), mc.size))
			mc.maps = slices.Delete(mc.maps, i, i+1)
			md.returnIfDone(mc)
			if _, ok := md.chunks[mc.c.Handle()]; !ok {
				gone = append(gone, mc.c)
			}
		default:
			mc := pick(func(mc *mchunk) bool { return len(mc.maps) == 0 })
			if mc == nil {
				continue
			}
			desc = fmt.Sprintf("drop unacquired %s", mc.c)
			require.True(t, errors.HasAssertionFailure(mc.c.drop()), desc)
		}
		for _, mc := range md.chunks {
			if mc.released && len(mc.maps) == 0 {
				t.Fatalf("model kept a returned chunk")
			}
		}

		// Compare everything after every step.
		msg := fmt.Sprintf("step %d: %s", step, desc)
		var want []driver.Handle
		var got []driver.Handle
		for _, c := range m.Chunks() {
			got = append(got, c.Handle())
			mc := md.chunks[c.Handle()]
			require.NotNil(t, mc, msg)
			require.Same(t, mc.c, c, msg)
			require.Equal(t, mc.released, c.Released(), msg)
			require.Equal(t, len(mc.maps), c.Mappings(), msg)
		}
		want = handles()
		require.Equal(t, want, got, msg)
		for dev := range driver.DeviceID(devices) {
			n := 0
			for _, mc := range md.chunks {
				if mc.dev == dev {
					n++
				}
			}
			require.Equal(t, Usage{Device: dev, Used: md.used[dev], Peak: md.peak[dev], Capacity: capacity, Chunks: n},
				usage(t, m, dev), msg)
			require.Equal(t, d.Used(dev), md.used[dev], "%s: the driver agrees", msg)
		}
		for _, c := range gone {
			require.True(t, c.Released(), msg)
			require.Zero(t, c.Mappings(), msg)
		}
		require.NoError(t, m.Check(), msg)
		require.NoError(t, d.Check(), msg)
	}

	// Close: everything unmapped goes; mapped chunks stay until dropped.
	require.NoError(t, m.Close())
	require.NoError(t, m.Check())
	for _, h := range handles() {
		mc := md.chunks[h]
		mc.released = true
		for _, at := range mc.maps {
			require.NoError(t, d.Unmap(at, mc.size))
			require.NoError(t, mc.c.drop())
		}
		mc.maps = nil
	}
	require.Empty(t, m.Chunks())
	for dev := range driver.DeviceID(devices) {
		require.Zero(t, usage(t, m, dev).Used)
		require.Zero(t, d.Used(dev))
	}
	require.NoError(t, m.Check())
}

// TestConcurrent creates, maps, unmaps and releases chunks from many
// goroutines while others read usage and check; run it with -race. Maps
// and unmaps go through mapWith and unmapWith, as the mapping layer's do:
// with the driver's unmap and the books' drop apart, a create between them
// could see the device's memory back while Used still counts it (the
// invariants build caught that: Used above Capacity).
func TestConcurrent(t *testing.T) {
	m, d := newMemory(t)
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			base, err := d.Reserve(8*gran, 0, 0)
			if err != nil {
				errs <- err
				return
			}
			type mapped struct {
				c  *Chunk
				at driver.Addr
			}
			var live []*Chunk
			var maps []mapped
			slots := make([]bool, 8)
			for range rounds {
				switch rng.IntN(4) {
				case 0:
					c, err := m.Create(driver.DeviceID(rng.IntN(devices)), gran, driver.ChunkOptions{})
					if err == nil {
						live = append(live, c)
					} else if !errors.Is(err, driver.ErrOutOfMemory) {
						errs <- err
						return
					}
				case 1:
					if len(live) == 0 {
						continue
					}
					i := rng.IntN(len(live))
					if err := live[i].Release(); err != nil {
						errs <- err
						return
					}
					live = slices.Delete(live, i, i+1)
				case 2:
					s := slices.Index(slots, false)
					if len(live) == 0 || s < 0 {
						continue
					}
					c := live[rng.IntN(len(live))]
					at := base + driver.Addr(s*gran)
					if err := c.mapWith(mapref.OpFunc(func() error { return d.Map(at, c.Handle()) })); err != nil {
						errs <- err
						return
					}
					slots[s] = true
					maps = append(maps, mapped{c, at})
				case 3:
					if len(maps) == 0 {
						continue
					}
					i := rng.IntN(len(maps))
					mp := maps[i]
					if err := mp.c.unmapWith(mapref.OpFunc(func() error { return d.Unmap(mp.at, gran) })); err != nil {
						errs <- err
						return
					}
					slots[uint64(mp.at-base)/gran] = false
					maps = slices.Delete(maps, i, i+1)
				}
			}
			for _, mp := range maps {
				if err := mp.c.unmapWith(mapref.OpFunc(func() error { return d.Unmap(mp.at, gran) })); err != nil {
					errs <- err
					return
				}
			}
			for _, c := range live {
				if err := c.Release(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := m.Check(); err != nil {
				errs <- err
				return
			}
			for dev := range driver.DeviceID(devices) {
				if u, err := m.Usage(dev); err != nil || u.Used > u.Capacity {
					errs <- errors.Newf("usage %+v, %v", u, err)
					return
				}
			}
			for _, c := range m.Chunks() {
				_ = c.String()
				_ = c.Mappings()
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-checked
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Empty(t, m.Chunks())
	for dev := range driver.DeviceID(devices) {
		u := usage(t, m, dev)
		require.Zero(t, u.Used)
		require.Zero(t, d.Used(dev))
		require.NotZero(t, u.Peak)
	}
	require.NoError(t, m.Check())
	require.NoError(t, d.Check())
	require.NoError(t, m.Close())
}

func TestCreateAfterDriverClosed(t *testing.T) {
	m, d := newMemory(t)
	require.NoError(t, d.Close())
	requireIs(t, createErr(m.Create(0, gran, driver.ChunkOptions{})), driver.ErrClosed, "physical: create 2 MiB on device 0")
	require.Empty(t, m.Chunks())
	require.Zero(t, usage(t, m, 0).Used)
	require.NoError(t, m.Check())
}

func TestChunkMemory(t *testing.T) {
	m, _ := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Same(t, m, c.Memory())
}

// TestCheckFindsCorruption breaks each invariant by hand and expects Check
// to report it, and all of them together.
func TestCheckFindsCorruption(t *testing.T) {
	for name, corrupt := range map[string]func(m *Memory, c *Chunk){
		"used":      func(m *Memory, c *Chunk) { m.usage[0].Used += gran; m.usage[0].Peak += gran },
		"count":     func(m *Memory, c *Chunk) { m.usage[0].Chunks++ },
		"peak":      func(m *Memory, c *Chunk) { m.usage[0].Peak = 0 },
		"capacity":  func(m *Memory, c *Chunk) { m.usage[0].Capacity = gran / 2 },
		"returned":  func(m *Memory, c *Chunk) { c.returned = true },
		"released":  func(m *Memory, c *Chunk) { c.released = true },
		"maps":      func(m *Memory, c *Chunk) { c.maps = -1 },
		"handle":    func(m *Memory, c *Chunk) { c.handle++ },
		"size":      func(m *Memory, c *Chunk) { c.size = 4096; m.usage[0].Used = 4096 },
		"device":    func(m *Memory, c *Chunk) { c.dev = 7 },
		"unclosed":  func(m *Memory, c *Chunk) { m.closed = true },
		"otherdevs": func(m *Memory, c *Chunk) { m.usage[1].Device = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			m, _ := newMemory(t)
			c, err := m.Create(0, gran, driver.ChunkOptions{})
			require.NoError(t, err)
			require.NoError(t, m.Check())
			corrupt(m, c)
			err = m.Check()
			require.True(t, errors.HasAssertionFailure(err), "%v", err)
		})
	}
}

// TestMapAndUnmapUnderTheBooksLock: the mapping layer's driver map and
// unmap run with the memory's lock held, so the driver cannot return a
// released chunk's memory before the books do (a create in between saw
// the device's memory back while Used still counted it, above Capacity).
func TestMapAndUnmapUnderTheBooksLock(t *testing.T) {
	m, d := newMemory(t)
	base, err := d.Reserve(gran, 0, 0)
	require.NoError(t, err)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, c.mapWith(mapref.OpFunc(func() error {
		require.False(t, m.mu.TryLock(), "held while the driver maps")
		return d.Map(base, c.Handle())
	})))
	require.NoError(t, c.Release())
	require.Equal(t, uint64(gran), usage(t, m, 0).Used, "released but mapped: still counted")
	require.NoError(t, c.unmapWith(mapref.OpFunc(func() error {
		require.False(t, m.mu.TryLock(), "held while the driver unmaps")
		return d.Unmap(base, gran)
	})))
	require.Zero(t, usage(t, m, 0).Used)
	// A failed driver call changes no count.
	c2, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.Error(t, c2.mapWith(mapref.OpFunc(func() error { return d.Map(base+1, c2.Handle()) })))
	require.Zero(t, c2.Mappings())
	require.True(t, errors.HasAssertionFailure(c2.unmapWith(mapref.OpFunc(func() error { return nil }))), "nothing to unmap")
	require.NoError(t, c2.Release())
	require.NoError(t, m.Check())
	require.NoError(t, d.Unreserve(base, gran))
}
