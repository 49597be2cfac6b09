package ledger

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// The ledger is tested through every driver's conformance suite; these
// tests pin what only the accelerator drivers reach: access kept per
// device by the hardware (DeviceProtector), and host accesses cut into
// segments a device can make.

const g = 4096

// perDevice is a backend with no memory whose hardware keeps each
// device's access: it records the calls it was given and refuses the
// call numbered failAt (1-based; 0 never).
type perDevice struct {
	next   driver.Addr
	calls  []call
	failAt int
}

type call struct {
	addr     driver.Addr
	size     uint64
	dev      driver.DeviceID
	from, to driver.Access
}

func (b *perDevice) Reserve(size, _ uint64, _ driver.Addr) (driver.Addr, any, error) {
	b.next += 1 << 30
	return b.next, nil, nil
}
func (b *perDevice) Unreserve(*Region) error { return nil }
func (b *perDevice) Commit(*Chunk) error     { return nil }
func (b *perDevice) Free(*Chunk) error       { return nil }
func (b *perDevice) Map(*Mapping) error      { return nil }
func (b *perDevice) Unmap(*Mapping) error    { return nil }
func (b *perDevice) Close() error            { return nil }

func (b *perDevice) SetDeviceAccess(_ *Region, addr driver.Addr, size uint64, dev driver.DeviceID, from, to driver.Access) error {
	b.calls = append(b.calls, call{addr, size, dev, from, to})
	if len(b.calls) == b.failAt {
		return errors.Wrap(driver.ErrOutOfMemory, "refused")
	}
	return nil
}

func devices(n int) []driver.Device {
	devs := make([]driver.Device, n)
	for i := range devs {
		devs[i] = driver.Device{ID: driver.DeviceID(i), Capacity: 1 << 20, MinGranularity: g, RecommendedGranularity: g}
	}
	return devs
}

// mapped makes a ledger over b with a reservation holding n chunks of
// size bytes, side by side.
func mapped(t *testing.T, b Backend, n int, size uint64) (*Ledger, driver.Addr) {
	t.Helper()
	l, err := New("test", devices(3), b, false)
	require.NoError(t, err)
	base, err := l.Reserve(uint64(n)*size, 0, 0)
	require.NoError(t, err)
	for i := range n {
		h, err := l.Create(0, size, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Map(base+driver.Addr(uint64(i)*size), h))
	}
	return l, base
}

// TestNewNeedsOneWayOfProtecting: a backend must say how access reaches
// its hardware, one way exactly.
func TestNewNeedsOneWayOfProtecting(t *testing.T) {
	type neither struct{ Backend }
	_, err := New("test", devices(1), neither{}, false)
	require.Error(t, err)
	require.True(t, errors.IsAssertionFailure(err), "%v", err)
}

// TestSetAccessPerDevice: with a DeviceProtector the ledger asks the
// hardware for dev's own change, one call per mapping the range covers
// (never one spanning two), skipping mappings where dev's access does not
// change; a refusal part-way sets the mappings already changed back and
// records nothing.
func TestSetAccessPerDevice(t *testing.T) {
	b := &perDevice{}
	l, base := mapped(t, b, 3, 2*g)
	require.NoError(t, l.SetAccess(base+g, g, 1, driver.AccessRead))
	require.Equal(t, []call{{base + g, g, 1, driver.AccessNone, driver.AccessRead}}, b.calls)

	b.calls = nil
	require.NoError(t, l.SetAccess(base, 6*g, 1, driver.AccessRead))
	require.Equal(t, []call{
		{base, g, 1, driver.AccessNone, driver.AccessRead},
		{base + 2*g, 2 * g, 1, driver.AccessNone, driver.AccessRead},
		{base + 4*g, 2 * g, 1, driver.AccessNone, driver.AccessRead},
	}, b.calls, "one call per mapping; the granule already readable needs none")

	b.calls, b.failAt = nil, 2
	err := l.SetAccess(base, 6*g, 0, driver.AccessReadWrite)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Equal(t, []call{
		{base, 2 * g, 0, driver.AccessNone, driver.AccessReadWrite},
		{base + 2*g, 2 * g, 0, driver.AccessNone, driver.AccessReadWrite},
		{base, 2 * g, 0, driver.AccessReadWrite, driver.AccessNone},
	}, b.calls, "the first mapping set back")
	for off := uint64(0); off < 6*g; off += g {
		a, err := l.Access(base+driver.Addr(off), 0)
		require.NoError(t, err)
		require.Equal(t, driver.AccessNone, a)
	}
	require.NoError(t, l.Check())
}

// TestWithHostSegments: a host access is cut where the lowest-numbered
// device that may make it changes, across mappings too, and refused where
// no device may.
func TestWithHostSegments(t *testing.T) {
	b := &perDevice{}
	l, base := mapped(t, b, 2, 2*g)
	require.NoError(t, l.SetAccess(base, 4*g, 2, driver.AccessRead))
	require.NoError(t, l.SetAccess(base+g, 2*g, 1, driver.AccessReadWrite))
	var got []Segment
	keep := func(segs []Segment) error { got = segs; return nil }

	require.NoError(t, l.WithHostSegments("read", base+100, 4*g-200, driver.AccessRead, keep))
	require.Equal(t, []Segment{
		{base + 100, g - 100, 2},
		{base + g, 2 * g, 1},
		{base + 3*g, g - 100, 2},
	}, got)

	require.NoError(t, l.WithHostSegments("write", base+g, 2*g, driver.AccessReadWrite, keep))
	require.Equal(t, []Segment{{base + g, 2 * g, 1}}, got, "one segment across the two mappings")

	err := l.WithHostSegments("write", base, 2*g, driver.AccessReadWrite, keep)
	require.True(t, errors.Is(err, driver.ErrAccessDenied), "%v", err)
	require.Contains(t, err.Error(), "mapped with access read for every device, read-write is needed")
}

// wholeMappings is a perDevice backend whose hardware call takes exactly
// one whole mapping, and whose reservations bind one device's memory.
type wholeMappings struct{ perDevice }

func (*wholeMappings) WholeMappings() bool  { return true }
func (*wholeMappings) BindsOneDevice() bool { return true }

// TestWholeMappingAccess: a grant over part of a mapping is recorded per
// granule, and the hardware gets one call over the whole mapping, with the
// device's widest access there; a change that leaves the widest alone
// makes no call, and a refused call is undone on the mappings changed
// before it.
func TestWholeMappingAccess(t *testing.T) {
	b := &wholeMappings{}
	l, base := mapped(t, b, 2, 4*g)
	at := func(i int) driver.Addr { return base + driver.Addr(uint64(i)*g) }
	require.NoError(t, l.SetAccess(at(1), g, 0, driver.AccessRead))
	require.Equal(t, []call{{base, 4 * g, 0, driver.AccessNone, driver.AccessRead}}, b.calls)
	a, err := l.Access(at(0), 0)
	require.NoError(t, err)
	require.Equal(t, driver.AccessNone, a, "the record keeps the granule")
	require.NoError(t, l.SetAccess(at(2), g, 0, driver.AccessRead))
	require.Len(t, b.calls, 1, "the widest is still read: no call")
	require.NoError(t, l.SetAccess(at(1), 6*g, 0, driver.AccessReadWrite), "over both mappings")
	require.Equal(t, []call{{base, 4 * g, 0, driver.AccessRead, driver.AccessReadWrite}, {at(4), 4 * g, 0, driver.AccessNone, driver.AccessReadWrite}}, b.calls[1:])
	require.NoError(t, l.SetAccess(at(1), 3*g, 0, driver.AccessNone))
	require.Equal(t, call{base, 4 * g, 0, driver.AccessReadWrite, driver.AccessNone}, b.calls[3], "nothing left granted in the first")

	b.calls, b.failAt = nil, 2
	err = l.SetAccess(base, 8*g, 1, driver.AccessRead)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Equal(t, call{base, 4 * g, 1, driver.AccessRead, driver.AccessNone}, b.calls[2], "the first mapping set back")
	a, err = l.Access(base, 1)
	require.NoError(t, err)
	require.Equal(t, driver.AccessNone, a, "refused: the record is unchanged")
	require.NoError(t, l.Check())
}

// TestOneDevicePerReservation: where the backend binds a reservation to
// one device's memory, local or imported, a Map mixing them is
// ErrUnsupported and changes nothing; another reservation takes it, and
// once the first device's mappings are gone the other's map there.
func TestOneDevicePerReservation(t *testing.T) {
	// Two granules of reservation, device 0's chunk in the first.
	l, base := mapped(t, &wholeMappings{}, 2, g)
	l2, base2 := mapped(t, &perDevice{}, 2, g)
	require.NoError(t, l.Unmap(base+g, g))
	require.NoError(t, l2.Unmap(base2+g, g))
	h1, err := l.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	err = l.Map(base+g, h1)
	require.True(t, errors.Is(err, driver.ErrUnsupported), "%v", err)
	require.ErrorContains(t, err, "holds local memory of device 0")
	_, err = l.Access(base+g, 0)
	require.True(t, errors.Is(err, driver.ErrNotMapped), "refused: nothing mapped")
	imp, err := l.Import(0, g, func(*Chunk) error { return nil })
	require.NoError(t, err)
	err = l.Map(base+g, imp)
	require.True(t, errors.Is(err, driver.ErrUnsupported), "imported beside local: %v", err)
	require.NoError(t, l.Unmap(base, g))
	require.NoError(t, l.Map(base+g, imp), "the reservation is empty again")
	require.NoError(t, l.Check())

	h, err := l2.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, l2.Map(base2+g, h), "a backend that does not say so mixes devices")
}

// spanningWhole is a perDevice backend whose hardware call takes a run of
// adjacent mappings, each whole (cuMemSetAccess on real hardware).
type spanningWhole struct{ perDevice }

func (*spanningWhole) WholeMappings() bool { return true }
func (*spanningWhole) SpansMappings() bool { return true }

// TestSpanningWholeMappingAccess: with a backend that both spans and takes
// whole mappings, a grant over a piece of a mapping makes one call over
// that whole mapping with the device's widest access there; a grant over
// several mappings makes one call per run of adjacent mappings whose
// change is the same, never one over a piece; a refused call sets the
// runs already changed back and records nothing.
func TestSpanningWholeMappingAccess(t *testing.T) {
	b := &spanningWhole{}
	l, base := mapped(t, b, 4, 2*g)
	at := func(i int) driver.Addr { return base + driver.Addr(uint64(i)*g) }
	access := func(i int, dev driver.DeviceID) driver.Access {
		t.Helper()
		a, err := l.Access(at(i), dev)
		require.NoError(t, err)
		return a
	}

	require.NoError(t, l.SetAccess(at(1), g, 0, driver.AccessRead), "the second half of the first mapping")
	require.Equal(t, []call{{base, 2 * g, 0, driver.AccessNone, driver.AccessRead}}, b.calls, "the whole first mapping")
	require.Equal(t, driver.AccessNone, access(0, 0), "the record keeps the granule")
	require.Equal(t, driver.AccessRead, access(1, 0))

	b.calls = nil
	require.NoError(t, l.SetAccess(at(1), 7*g, 0, driver.AccessRead), "from inside the first mapping to the end")
	require.Equal(t, []call{{at(2), 6 * g, 0, driver.AccessNone, driver.AccessRead}}, b.calls,
		"the first mapping's widest is unchanged; the other three are one run")

	b.calls = nil
	require.NoError(t, l.SetAccess(at(0), 8*g, 0, driver.AccessReadWrite))
	require.Equal(t, []call{{base, 8 * g, 0, driver.AccessRead, driver.AccessReadWrite}}, b.calls, "one call over all four")

	b.calls = nil
	require.NoError(t, l.SetAccess(at(3), 2*g, 0, driver.AccessNone), "a granule of the second and third mappings each")
	require.Empty(t, b.calls, "each keeps read-write in its other granule")
	require.NoError(t, l.SetAccess(at(2), g, 0, driver.AccessNone))
	require.Equal(t, []call{{at(2), 2 * g, 0, driver.AccessReadWrite, driver.AccessNone}}, b.calls, "the second mapping has nothing left")
	require.Equal(t, driver.AccessReadWrite, access(5, 0))

	// Device 1: the runs differ where device 0's grants do not matter, so
	// the calls follow device 1's own widest access only.
	b.calls = nil
	require.NoError(t, l.SetAccess(at(2), 2*g, 1, driver.AccessRead))
	require.NoError(t, l.SetAccess(at(0), 8*g, 1, driver.AccessReadWrite))
	require.Equal(t, []call{
		{at(2), 2 * g, 1, driver.AccessNone, driver.AccessRead},
		{base, 2 * g, 1, driver.AccessNone, driver.AccessReadWrite},
		{at(2), 2 * g, 1, driver.AccessRead, driver.AccessReadWrite},
		{at(4), 4 * g, 1, driver.AccessNone, driver.AccessReadWrite},
	}, b.calls, "a run breaks where the change differs")
	require.NoError(t, l.Check())

	// A refusal part-way: the runs already changed are set back, the
	// record is unchanged.
	require.NoError(t, l.SetAccess(at(1), 5*g, 2, driver.AccessRead), "the first three mappings, in part")
	b.calls, b.failAt = nil, 2
	err := l.SetAccess(at(0), 8*g, 2, driver.AccessReadWrite)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Equal(t, []call{
		{base, 6 * g, 2, driver.AccessRead, driver.AccessReadWrite},
		{at(6), 2 * g, 2, driver.AccessNone, driver.AccessReadWrite},
		{base, 6 * g, 2, driver.AccessReadWrite, driver.AccessRead},
	}, b.calls, "the first run set back")
	for i, want := range []driver.Access{0, 1, 1, 1, 1, 1, 0, 0} {
		require.Equal(t, want, access(i, 2), "granule %d: refused, the record is unchanged", i)
	}
	require.NoError(t, l.Check())
}

// hardware is a spanning, whole-mapping backend that keeps each device's
// access per granule as the hardware would and holds every call to the
// rules: a range of whole mappings, each granule's current access `from`.
type hardware struct {
	spanningWhole
	t      *testing.T
	base   driver.Addr
	starts map[uint64]bool // granule indexes where a mapping starts or the last ends
	hw     [][3]driver.Access
}

func (h *hardware) SetDeviceAccess(r *Region, addr driver.Addr, size uint64, dev driver.DeviceID, from, to driver.Access) error {
	if err := h.perDevice.SetDeviceAccess(r, addr, size, dev, from, to); err != nil {
		return err
	}
	g0, g1 := uint64(addr-h.base)/g, uint64(addr-h.base)/g+size/g
	require.True(h.t, h.starts[g0] && h.starts[g1], "[%d, %d) is not a run of whole mappings", g0, g1)
	for k := g0; k < g1; k++ {
		require.Equal(h.t, from, h.hw[k][dev], "granule %d", k)
		h.hw[k][dev] = to
	}
	return nil
}

// TestSpanningWholeMappingModel: random grants of random ranges over
// mappings of mixed sizes, some refused part-way, against a reference
// record per granule: the ledger's record matches it, and the hardware
// gives each device, over each whole mapping, the widest access the
// reference has for it anywhere in that mapping.
func TestSpanningWholeMappingModel(t *testing.T) {
	sizes := []uint64{1, 3, 2, 1, 4, 2} // granules
	var n uint64
	starts := map[uint64]bool{0: true}
	for _, s := range sizes {
		n += s
		starts[n] = true
	}
	h := &hardware{t: t, starts: starts, hw: make([][3]driver.Access, n)}
	l, err := New("test", devices(3), h, false)
	require.NoError(t, err)
	base, err := l.Reserve(n*g, 0, 0)
	require.NoError(t, err)
	h.base = base
	at := base
	for _, s := range sizes {
		c, err := l.Create(0, s*g, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Map(at, c))
		at += driver.Addr(s * g)
	}
	ref := make([][3]driver.Access, n)
	rng := rand.New(rand.NewPCG(1, 2))
	values := []driver.Access{driver.AccessNone, driver.AccessRead, driver.AccessReadWrite}
	for op := range 500 {
		lo := rng.Uint64N(n)
		hi := lo + 1 + rng.Uint64N(n-lo)
		dev, a := driver.DeviceID(rng.IntN(3)), values[rng.IntN(3)]
		h.calls, h.failAt = nil, 0
		if rng.IntN(4) == 0 {
			h.failAt = 1 + rng.IntN(3)
		}
		err := l.SetAccess(base+driver.Addr(lo*g), (hi-lo)*g, dev, a)
		if err != nil {
			require.True(t, errors.Is(err, driver.ErrOutOfMemory), "op %d: %v", op, err)
		} else {
			for k := lo; k < hi; k++ {
				ref[k][dev] = a
			}
		}
		m := uint64(0)
		for _, s := range sizes {
			for d := range 3 {
				var widest driver.Access
				for k := m; k < m+s; k++ {
					widest |= ref[k][d]
				}
				for k := m; k < m+s; k++ {
					got, err := l.Access(base+driver.Addr(k*g), driver.DeviceID(d))
					require.NoError(t, err)
					require.Equal(t, ref[k][d], got, "op %d: the record, granule %d device %d", op, k, d)
					require.Equal(t, widest, h.hw[k][d], "op %d: the hardware, granule %d device %d", op, k, d)
				}
			}
			m += s
		}
	}
	require.NoError(t, l.Check())
}
