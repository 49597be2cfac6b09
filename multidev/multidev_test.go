package multidev

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

const g = 64 * units.KiB // test granularity

// env is a small machine of one driver: four devices of the given
// capacity (drivers_test.go lists the drivers).
type env struct {
	drv   testDriver
	space *vaspace.Space
	mem   *physical.Memory
}

// newEnv is an env on the host driver, for the tests that stay host-only.
func newEnv(t testing.TB, capacity uint64, noPeer bool) *env {
	t.Helper()
	return backend{testdrivers.Host()}.env(t, capacity, noPeer)
}

func (e *env) arena(t testing.TB, opts Options) *Arena {
	t.Helper()
	a, err := New(e.space, e.mem, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func (e *env) used(t testing.TB) []uint64 {
	t.Helper()
	out := make([]uint64, 4)
	for d := range out {
		u, err := e.mem.Usage(driver.DeviceID(d))
		require.NoError(t, err)
		out[d] = u.Used
	}
	return out
}

// state is everything a refused call must leave as it was.
type state struct {
	Len, Committed uint64
	Layout         []Extent
	Access         [][]driver.Access // per chunk, per device
	Used           []uint64
	Mappings       int
}

func (e *env) state(t testing.TB, a *Arena) state {
	t.Helper()
	require.NoError(t, a.Check())
	require.NoError(t, e.mem.Check())
	require.NoError(t, e.drv.Check())
	s := state{Len: a.Len(), Committed: a.Committed(), Layout: a.Layout(), Used: e.used(t)}
	for off := uint64(0); off < s.Committed; off += a.ChunkSize() {
		var row []driver.Access
		for d := driver.DeviceID(0); d < 4; d++ {
			acc, err := a.Access(d, off)
			require.NoError(t, err)
			row = append(row, acc)
		}
		s.Access = append(s.Access, row)
	}
	s.Mappings = a.Stats().Chunks
	return s
}

// devicesOf returns the device behind every granule of the committed
// memory, looked up twice: by DeviceAt and in the Layout.
func devicesOf(t testing.TB, a *Arena) []driver.DeviceID {
	t.Helper()
	var out []driver.DeviceID
	var fromLayout []driver.DeviceID
	for _, e := range a.Layout() {
		for range e.Range.Size / g {
			fromLayout = append(fromLayout, e.Device)
		}
	}
	for off := uint64(0); off < a.Committed(); off += g {
		d, err := a.DeviceAt(off)
		require.NoError(t, err)
		out = append(out, d)
	}
	require.Equal(t, fromLayout, out)
	return out
}

// perGranule repeats each chunk's device once per granule (chunks of 2g).
func perGranule(devs ...driver.DeviceID) []driver.DeviceID {
	var out []driver.DeviceID
	for _, d := range devs {
		out = append(out, d, d)
	}
	return out
}

// TestPlacement: every granule is on the device the policy says.
func TestPlacement(t *testing.T) { onEveryDriver(t, placement) }

func placement(t *testing.T, d backend) {
	const cs = 2 * g
	t.Run("striped", func(t *testing.T) {
		e := d.env(t, 16*g, false)
		a := e.arena(t, Options{Max: 64 * g, ChunkSize: cs, Placement: Striped(0, 1, 2, 3)})
		require.NoError(t, a.Grow(7*cs+1))
		require.Equal(t, perGranule(0, 1, 2, 3, 0, 1, 2, 3), devicesOf(t, a))
		require.Len(t, a.Layout(), 8, "no two neighbours on one device")
		require.Equal(t, []uint64{2 * cs, 2 * cs, 2 * cs, 2 * cs}, e.used(t))
		require.NoError(t, a.Check())
	})
	t.Run("blocked", func(t *testing.T) {
		e := d.env(t, 16*g, false)
		a := e.arena(t, Options{Max: 64 * g, ChunkSize: cs, Placement: Blocked(2*cs, 2, 0)})
		require.NoError(t, a.Grow(cs))
		require.NoError(t, a.Grow(5*cs)) // two grows: the block continues across them
		require.Equal(t, perGranule(2, 2, 0, 0, 2, 2), devicesOf(t, a), "2 chunks per device, starting again at the first")
		base := a.Base()
		require.Equal(t, []Extent{
			{vaspace.Range{Base: base, Size: 2 * cs}, 2},
			{vaspace.Range{Base: base + driver.Addr(2*cs), Size: 2 * cs}, 0},
			{vaspace.Range{Base: base + driver.Addr(4*cs), Size: 2 * cs}, 2},
		}, a.Layout())
	})
	t.Run("weighted", func(t *testing.T) {
		e := d.env(t, 16*g, false)
		// Device 0 is fuller than device 1, which is fuller than 2 and 3.
		hog0, err := e.mem.Create(0, 6*g, driver.ChunkOptions{})
		require.NoError(t, err)
		hog1, err := e.mem.Create(1, 2*g, driver.ChunkOptions{})
		require.NoError(t, err)
		a := e.arena(t, Options{Max: 64 * g, ChunkSize: cs, Placement: Weighted(0, 1, 2, 3)})
		require.NoError(t, a.Grow(6*cs))
		// Free before each chunk (in g): 10 14 16 16 → 2; 10 14 14 16 → 3;
		// 10 14 14 14 → 1 (ties go to the first listed); 10 12 14 14 → 2;
		// 10 12 12 14 → 3; 10 12 12 12 → 1.
		require.Equal(t, perGranule(2, 3, 1, 2, 3, 1), devicesOf(t, a))
		require.Equal(t, []uint64{6 * g, 6 * g, 4 * g, 4 * g}, e.used(t))
		require.NoError(t, hog0.Release())
		require.NoError(t, hog1.Release())
		require.NoError(t, a.Grow(cs))
		require.Equal(t, driver.DeviceID(0), devicesOf(t, a)[12], "with its memory back, device 0 is the emptiest")
	})
	t.Run("explicit", func(t *testing.T) {
		e := d.env(t, 16*g, false)
		a := e.arena(t, Options{Max: 64 * g, ChunkSize: cs, Placement: Explicit(func(off uint64) driver.DeviceID {
			if off < 2*cs {
				return 3
			}
			return driver.DeviceID(off / cs % 2)
		})})
		require.NoError(t, a.Grow(6*cs))
		require.Equal(t, perGranule(3, 3, 0, 1, 0, 1), devicesOf(t, a))
	})
	t.Run("default", func(t *testing.T) {
		e := d.env(t, 16*g, false)
		a := e.arena(t, Options{Max: 64 * units.MiB})
		require.Equal(t, 2*units.MiB, a.ChunkSize(), "the devices' recommended granularity")
		require.Equal(t, "striped over [0 1 2 3]", a.Placement().String())
	})
}

// TestOnFull: a full device is skipped or fails the grow, as asked, and a
// grow that runs out part-way leaves the arena as it was.
func TestOnFull(t *testing.T) { onEveryDriver(t, onFull) }

func onFull(t *testing.T, d backend) {
	t.Run("skip", func(t *testing.T) {
		e := d.env(t, 4*g, false)
		hog, err := e.mem.Create(0, 4*g, driver.ChunkOptions{})
		require.NoError(t, err)
		a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1)})
		require.NoError(t, a.Grow(3*g))
		require.Equal(t, []driver.DeviceID{1, 1, 1}, devicesOf(t, a), "device 0 is full: every chunk goes to the next")
		require.NoError(t, hog.Release())
		require.NoError(t, a.Grow(g))
		require.Equal(t, driver.DeviceID(1), devicesOf(t, a)[3], "chunk 3 of Striped(0, 1) goes to device 1 when it has room")
		require.NoError(t, a.Grow(g))
		require.Equal(t, driver.DeviceID(0), devicesOf(t, a)[4])
	})
	t.Run("fail", func(t *testing.T) {
		e := d.env(t, 4*g, false)
		hog, err := e.mem.Create(0, 4*g, driver.ChunkOptions{})
		require.NoError(t, err)
		a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1), OnFull: FailWhenFull})
		before := e.state(t, a)
		drivertest.RequireIs(t, a.Grow(g), driver.ErrOutOfMemory, "grow by 64 KiB", "chunk 0 at offset 0x0",
			"fail when full", "device 0 had 0 B free, device 1 had 256 KiB free, device 2")
		require.Equal(t, before, e.state(t, a))
		require.NoError(t, hog.Release())
		require.NoError(t, a.Grow(g))
	})
	t.Run("part-way", func(t *testing.T) {
		for _, onFull := range []OnFull{SkipFull, FailWhenFull} {
			t.Run(onFull.String(), func(t *testing.T) {
				e := d.env(t, 4*g, false)
				a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1), OnFull: onFull})
				require.NoError(t, a.Grow(g/2))
				hog, err := e.mem.Create(1, 3*g, driver.ChunkOptions{})
				require.NoError(t, err)
				before := e.state(t, a)
				// Chunks 1 (device 1), 2 (device 0) fit; chunk 3 wants device
				// 1, full: FailWhenFull stops there, SkipFull goes on on
				// device 0 until chunk 5 finds both full.
				err = a.Grow(6 * g)
				drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "grow by 384 KiB from 32 KiB",
					"device 0 had 192 KiB free, device 1 had 64 KiB free", "device 1 has 0 B free")
				require.Equal(t, before, e.state(t, a), "the chunks mapped before the failure went back")
				require.NoError(t, hog.Release())
				require.NoError(t, a.Grow(6*g))
			})
		}
	})
	t.Run("hidden", func(t *testing.T) {
		// Another physical memory on the same driver takes device 0: this
		// arena's books say it has room, Create says it has not.
		e := d.env(t, 4*g, false)
		other := physical.New(e.drv)
		hog, err := other.Create(0, 4*g, driver.ChunkOptions{})
		require.NoError(t, err)
		a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1)})
		require.NoError(t, a.Grow(2*g))
		require.Equal(t, []driver.DeviceID{1, 1}, devicesOf(t, a))
		b := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1), OnFull: FailWhenFull})
		before := e.state(t, b)
		drivertest.RequireIs(t, b.Grow(g), driver.ErrOutOfMemory, "asked 64 KiB, device has 0 B free")
		require.Equal(t, before, e.state(t, b))
		require.NoError(t, hog.Release())
	})
}

// pattern is the byte at offset off in the tests' known contents.
func pattern(off uint64) byte { return byte(off*7 + off>>16) }

func fill(off uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = pattern(off + uint64(i))
	}
	return p
}

// TestAccessMatrix: a grant covers one device and one range, nothing more.
func TestAccessMatrix(t *testing.T) { onEveryDriver(t, accessMatrix) }

func accessMatrix(t *testing.T, d backend) {
	e := d.env(t, 16*g, false)
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1, 2, 3)})
	require.NoError(t, a.Grow(8*g))
	// X is chunks 2 and 3, on devices 2 and 3: device 1 reaches them by
	// peer access, which Grant enables.
	x0, x1 := 2*g, 4*g
	require.NoError(t, a.Grant(1, x0, x1-x0, driver.AccessReadWrite))
	require.NoError(t, a.Write(1, x0, fill(x0, int(x1-x0))))
	buf := make([]byte, 16)
	for dev := driver.DeviceID(0); dev < 4; dev++ {
		for off := uint64(0); off < 8*g; off += g / 2 {
			err := a.Read(dev, off, buf)
			acc, aerr := a.Access(dev, off)
			require.NoError(t, aerr)
			if dev == 1 && off >= x0 && off < x1 {
				require.NoError(t, err, "device 1 at %#x", off)
				require.Equal(t, fill(off, len(buf)), buf)
				require.Equal(t, driver.AccessReadWrite, acc)
				continue
			}
			drivertest.RequireIs(t, err, driver.ErrAccessDenied, fmt.Sprintf("device %d", dev))
			require.Equal(t, driver.AccessNone, acc, "device %d at %#x", dev, off)
		}
	}
	drivertest.RequireIs(t, a.Read(1, x1-8, buf), driver.ErrAccessDenied, "no access at")
	require.NoError(t, a.Check())

	// Read-only for device 0 over the first chunk of X.
	require.NoError(t, a.Grant(0, x0, g, driver.AccessRead))
	require.NoError(t, a.Read(0, x0, buf))
	require.Equal(t, fill(x0, len(buf)), buf)
	drivertest.RequireIs(t, a.Write(0, x0, buf), driver.ErrAccessDenied, "read-write access is needed")
	// Revoking needs no reachability and leaves other grants alone.
	require.NoError(t, a.Grant(1, x0, g, driver.AccessNone))
	drivertest.RequireIs(t, a.Read(1, x0, buf), driver.ErrAccessDenied)
	require.NoError(t, a.Read(1, x0+g, buf))
	require.NoError(t, a.Read(0, x0, buf))
	require.NoError(t, a.Check())
	ok, err := a.Reachable(1, 2)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestUnreachable: on a machine whose devices cannot reach each other,
// grants and migrations across devices are refused, naming both devices,
// and change nothing.
func TestUnreachable(t *testing.T) { onEveryDriver(t, unreachableGrants) }

func unreachableGrants(t *testing.T, d backend) {
	e := d.env(t, 16*g, true)
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1)})
	require.NoError(t, a.Grow(4*g))
	for _, p := range [][2]driver.DeviceID{{0, 1}, {1, 0}, {2, 3}} {
		ok, err := a.Reachable(p[0], p[1])
		require.NoError(t, err)
		require.False(t, ok, "%d → %d", p[0], p[1])
	}
	ok, err := a.Reachable(1, 1)
	require.NoError(t, err)
	require.True(t, ok, "a device reaches its own memory")

	require.NoError(t, a.Grant(0, 0, g, driver.AccessReadWrite), "device 0's own chunk")
	require.NoError(t, a.Grant(1, g, g, driver.AccessReadWrite), "device 1's own chunk")
	before := e.state(t, a)
	drivertest.RequireIs(t, a.Grant(0, 0, 2*g, driver.AccessRead), driver.ErrAccessDenied,
		"grant device 0 read access over [0x0, +128 KiB)", "the chunk at 0x10000 is on device 1",
		"device 0 cannot reach memory of device 1")
	require.Equal(t, before, e.state(t, a))
	drivertest.RequireIs(t, a.Grant(2, 0, g, driver.AccessRead), driver.ErrAccessDenied, "device 2 cannot reach memory of device 0")
	require.Equal(t, before, e.state(t, a))

	// Device 0 holds a grant over chunk 0: moving it to device 1 would put
	// it out of device 0's reach.
	drivertest.RequireIs(t, a.Migrate(0, g, 1), driver.ErrAccessDenied,
		"migrate [0x0, +64 KiB) to device 1", "device 0 holds read-write access over the chunk at 0x0",
		"device 0 cannot reach memory of device 1")
	require.Equal(t, before, e.state(t, a), "no chunk was created on device 1")
	// A chunk nobody was granted moves, bytes and all (through the host).
	require.NoError(t, a.Grant(0, 0, g, driver.AccessNone))
	require.NoError(t, a.Write(1, g, []byte("on device 1")))
	require.NoError(t, a.Migrate(0, 2*g, 1))
	require.Equal(t, []driver.DeviceID{1, 1, 0, 1}, devicesOf(t, a))
	buf := make([]byte, 11)
	require.NoError(t, a.Read(1, g, buf))
	require.Equal(t, "on device 1", string(buf))
	require.NoError(t, a.Check())
}

// TestMigrateKeepsGrants: the new chunks are mapped with the old grants,
// and a migration's bytes are the old bytes.
func TestMigrateKeepsGrants(t *testing.T) { onEveryDriver(t, migrateKeepsGrants) }

func migrateKeepsGrants(t *testing.T, d backend) {
	e := d.env(t, 16*g, false)
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1)})
	require.NoError(t, a.Grow(4*g))
	require.NoError(t, a.Grant(0, 0, 4*g, driver.AccessReadWrite))
	require.NoError(t, a.Grant(3, g, 2*g, driver.AccessRead))
	require.NoError(t, a.Write(0, 0, fill(0, int(4*g))))
	before := e.state(t, a)
	require.NoError(t, a.Migrate(0, 4*g, 2))
	after := e.state(t, a)
	require.Equal(t, before.Access, after.Access)
	require.Equal(t, []Extent{{vaspace.Range{Base: a.Base(), Size: 4 * g}, 2}}, a.Layout())
	require.Equal(t, []uint64{0, 0, 4 * g, 0}, e.used(t), "the old chunks went back to devices 0 and 1")
	got := make([]byte, 4*g)
	require.NoError(t, a.Read(0, 0, got))
	require.Equal(t, fill(0, int(4*g)), got)
	require.NoError(t, a.Read(3, g, got[:2*g]))
	require.NoError(t, a.Migrate(0, 4*g, 2), "already there: nothing to do")
	require.Equal(t, after, e.state(t, a))

	// Out of memory on the target: nothing changes, the new chunks go back.
	hog, err := e.mem.Create(1, 14*g, driver.ChunkOptions{})
	require.NoError(t, err)
	before = e.state(t, a)
	drivertest.RequireIs(t, a.Migrate(0, 4*g, 1), driver.ErrOutOfMemory,
		"migrate [0x0, +256 KiB) to device 1", "need 256 KiB on device 1, which has 128 KiB free")
	require.Equal(t, before, e.state(t, a))
	require.NoError(t, hog.Release())
}

// TestBadInput: every refusal, each leaving the arena as it was.
func TestBadInput(t *testing.T) { onEveryDriver(t, badInput) }

func badInput(t *testing.T, d backend) {
	e := d.env(t, 16*g, false)
	for _, c := range []struct {
		name     string
		opts     Options
		sentinel error
		mentions []string
	}{
		{"zero max", Options{ChunkSize: g}, driver.ErrInvalid, []string{"Max is zero"}},
		{"unknown device", Options{Max: g, ChunkSize: g, Placement: Striped(0, 7)}, driver.ErrNoDevice, []string{"device 7"}},
		{"unknown weighted device", Options{Max: g, ChunkSize: g, Placement: Weighted(-1)}, driver.ErrNoDevice, []string{"device -1"}},
		{"no device", Options{Max: g, ChunkSize: g, Placement: Blocked(g)}, driver.ErrInvalid, []string{"names no device"}},
		{"a device twice", Options{Max: g, ChunkSize: g, Placement: Striped(1, 2, 1)}, driver.ErrInvalid, []string{"device 1 twice"}},
		{"chunk below granularity", Options{Max: g, ChunkSize: g / 2}, driver.ErrMisaligned, []string{"chunk size", "64 KiB"}},
		{"block not whole chunks", Options{Max: g, ChunkSize: 2 * g, Placement: Blocked(3*g, 0)}, driver.ErrMisaligned,
			[]string{"192 KiB per device is not a multiple of the chunk size 128 KiB"}},
		{"empty block", Options{Max: g, ChunkSize: g, Placement: Blocked(0, 0)}, driver.ErrInvalid, []string{"zero bytes per device"}},
		{"no function", Options{Max: g, ChunkSize: g, Placement: Explicit(nil)}, driver.ErrInvalid, []string{"no function"}},
		{"unknown OnFull", Options{Max: g, ChunkSize: g, OnFull: 2}, driver.ErrInvalid, []string{"OnFull 2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(e.space, e.mem, c.opts)
			drivertest.RequireIs(t, err, c.sentinel, c.mentions...)
		})
	}
	require.Empty(t, e.space.Reservations(), "a refused New reserves nothing")

	// An explicit placement that names a device the machine lacks: the grow
	// fails at that chunk, after mapping two, and unmaps them again.
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Explicit(func(off uint64) driver.DeviceID {
		if off >= 4*g {
			return 9
		}
		return driver.DeviceID(off / g)
	})})
	require.NoError(t, a.Grow(2*g))
	require.NoError(t, a.Grant(0, 0, g, driver.AccessReadWrite))
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions []string
	}{
		{"placement names an unknown device", func() error { return a.Grow(4 * g) }, driver.ErrNoDevice,
			[]string{"grow by 256 KiB from 128 KiB", "chunk 4 at offset 0x40000", "device 9"}},
		{"grow past max", func() error { return a.Grow(15 * g) }, driver.ErrOutOfMemory, []string{"maximum"}},
		{"shrink past zero", func() error { return a.Shrink(3 * g) }, driver.ErrInvalid, []string{"only 128 KiB long"}},
		{"grant to an unknown device", func() error { return a.Grant(4, 0, g, driver.AccessRead) }, driver.ErrNoDevice, []string{"device 4"}},
		{"grant of an undefined access", func() error { return a.Grant(0, 0, g, 2) }, driver.ErrInvalid, []string{"access value 2"}},
		{"grant of nothing", func() error { return a.Grant(0, 0, 0, driver.AccessRead) }, driver.ErrInvalid, []string{"size is zero"}},
		{"grant misaligned", func() error { return a.Grant(1, g/2, g, driver.AccessRead) }, driver.ErrMisaligned, []string{"whole chunks of 64 KiB"}},
		{"grant part of a chunk", func() error { return a.Grant(1, 0, g/2, driver.AccessRead) }, driver.ErrMisaligned, []string{"whole chunks"}},
		{"grant past committed", func() error { return a.Grant(1, g, 2*g, driver.AccessRead) }, driver.ErrNotMapped, []string{"[0x20000, 0x30000) is not committed"}},
		{"migrate to an unknown device", func() error { return a.Migrate(0, g, 5) }, driver.ErrNoDevice, []string{"migrate", "device 5"}},
		{"migrate an unmapped range", func() error { return a.Migrate(2*g, g, 3) }, driver.ErrNotMapped, []string{"migrate [0x20000, +64 KiB)", "is not committed"}},
		{"migrate misaligned", func() error { return a.Migrate(0, g+4096, 3) }, driver.ErrMisaligned, []string{"whole chunks"}},
		{"migrate nothing", func() error { return a.Migrate(0, 0, 3) }, driver.ErrInvalid, []string{"size is zero"}},
		{"migrate overflowing", func() error { return a.Migrate(g, ^uint64(0)-g+1, 3) }, driver.ErrNotMapped, nil},
		{"read past the length", func() error { return a.Read(0, 2*g-1, make([]byte, 2)) }, driver.ErrAccessDenied, []string{"past the arena's length 128 KiB"}},
		{"read by an unknown device", func() error { return a.Read(8, 0, make([]byte, 2)) }, driver.ErrNoDevice, []string{"device 8"}},
		{"write without a grant", func() error { return a.Write(1, 0, []byte{1}) }, driver.ErrAccessDenied, []string{"device 1 has no access"}},
		{"access past committed", func() error { _, err := a.Access(0, 2*g); return err }, driver.ErrNotMapped, nil},
		{"access of an unknown device", func() error { _, err := a.Access(4, 0); return err }, driver.ErrNoDevice, nil},
		{"device past committed", func() error { _, err := a.DeviceAt(2 * g); return err }, driver.ErrNotMapped, nil},
		{"reachable, unknown device", func() error { _, err := a.Reachable(0, 4); return err }, driver.ErrNoDevice, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.state(t, a)
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions...)
			require.Equal(t, before, e.state(t, a))
		})
	}

	require.NoError(t, a.Close())
	for name, call := range map[string]func() error{
		"grow": func() error { return a.Grow(1) }, "shrink": func() error { return a.Shrink(0) }, "trim": a.Trim,
		"close": a.Close, "grant": func() error { return a.Grant(0, 0, g, driver.AccessRead) },
		"migrate": func() error { return a.Migrate(0, g, 1) },
		"read":    func() error { return a.Read(0, 0, []byte{0}) }, "write": func() error { return a.Write(0, 0, []byte{0}) },
		"access":    func() error { _, err := a.Access(0, 0); return err },
		"device at": func() error { _, err := a.DeviceAt(0); return err },
		"reachable": func() error { _, err := a.Reachable(0, 1); return err },
	} {
		drivertest.RequireIs(t, call(), driver.ErrClosed, name+" on a closed arena")
	}
	require.Empty(t, a.Layout())
	require.NoError(t, a.Check())
	require.Equal(t, []uint64{0, 0, 0, 0}, e.used(t))
}

// TestNoLeaks: an arena over four devices, grown, granted, migrated,
// trimmed and closed, leaves file descriptors, kernel mappings and
// resident shared memory where they were.
func TestNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 4, Capacity: 32 * g, Granularity: g})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		a, err := New(space, mem, Options{Max: 32 * g, ChunkSize: g, Placement: Weighted(0, 1, 2, 3)})
		require.NoError(t, err)
		require.NoError(t, a.Grow(12*g))
		require.NoError(t, a.Grant(2, 0, 12*g, driver.AccessReadWrite))
		require.NoError(t, a.Write(2, 0, fill(0, int(12*g))))
		require.NoError(t, a.Migrate(0, 8*g, 3))
		require.NoError(t, a.Migrate(4*g, 8*g, 1))
		require.NoError(t, a.Shrink(6*g))
		require.NoError(t, a.Trim())
		require.NoError(t, a.Check())
		require.NoError(t, a.Close())
		for d := driver.DeviceID(0); d < 4; d++ {
			hb, err := drv.HeapBytes(d)
			require.NoError(t, err)
			require.Zero(t, hb, "device %d's heap went back to the kernel", d)
		}
		require.Empty(t, space.Reservations(), "the arena's and the scratch reservations are freed")
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
