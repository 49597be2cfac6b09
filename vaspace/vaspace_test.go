package vaspace

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
)

const gran = 2 << 20

func newSim(t testing.TB) *sim.Driver {
	t.Helper()
	d, err := sim.New(sim.Options{Devices: 2, Capacity: 64 << 20, Granularity: gran})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	return d
}

func newSpace(t testing.TB) (*Space, *sim.Driver) {
	d := newSim(t)
	return New(d), d
}

// occupant is an Occupant whose uses the test sets.
type occupant struct {
	mu   sync.Mutex
	uses []Use
}

func (o *occupant) Occupied() []Use {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.uses)
}

func (o *occupant) set(uses ...Use) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.uses = uses
}

// snapshot is everything observable about a space, for "unchanged" checks.
type snapshot struct {
	ranges []Range
	carved [][]Range
}

func snap(s *Space) snapshot {
	var sn snapshot
	for _, r := range s.Reservations() {
		sn.ranges = append(sn.ranges, r.Range())
		sn.carved = append(sn.carved, r.Carved())
	}
	return sn
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

func TestRange(t *testing.T) {
	r := Range{Base: 0x1000, Size: 0x1000}
	require.Equal(t, driver.Addr(0x2000), r.End())
	require.Equal(t, "[0x1000, 0x2000)", r.String())
	for _, tc := range []struct {
		a    driver.Addr
		want bool
	}{{0xfff, false}, {0x1000, true}, {0x1fff, true}, {0x2000, false}} {
		require.Equal(t, tc.want, r.Contains(tc.a), "%s contains %s", r, tc.a)
	}
	require.False(t, Range{0x1000, 0}.Contains(0x1000), "an empty range contains nothing")
	for _, tc := range []struct {
		o                  Range
		contains, overlaps bool
	}{
		{Range{0x1000, 0x1000}, true, true},
		{Range{0x1800, 0x800}, true, true},
		{Range{0x800, 0x1000}, false, true},
		{Range{0x1800, 0x1000}, false, true},
		{Range{0x0, 0x1000}, false, false},
		{Range{0x2000, 0x1000}, false, false},
		{Range{0x0, 0x4000}, false, true},
		{Range{0x1800, 0}, true, false},
		{Range{^driver.Addr(0) - 0x10, 0x100}, false, false}, // wraps around
	} {
		require.Equal(t, tc.contains, r.ContainsRange(tc.o), "%s contains %s", r, tc.o)
		require.Equal(t, tc.overlaps, r.Overlaps(tc.o), "%s overlaps %s", r, tc.o)
		require.Equal(t, tc.overlaps, tc.o.Overlaps(r), "%s overlaps %s", tc.o, r)
	}
}

func TestReserveRejectsBadInput(t *testing.T) {
	s, d := newSpace(t)
	keep, err := s.Reserve(8*gran, 0)
	require.NoError(t, err)
	before := snap(s)

	requireIs(t, reserveErr(s.Reserve(0, 0)), driver.ErrInvalid, "vaspace: reserve", "size is zero")
	requireIs(t, reserveErr(s.Reserve(gran+4096, 0)), driver.ErrMisaligned, "vaspace: reserve", "granularity 2 MiB")
	requireIs(t, reserveErr(s.Reserve(gran, 3*gran)), driver.ErrInvalid, "not a power of two")
	requireIs(t, reserveErr(s.Reserve(1<<50, 0)), driver.ErrOutOfMemory, "vaspace: reserve")

	require.Equal(t, before, snap(s))
	require.Equal(t, []*Reservation{keep}, s.Reservations())
	require.NoError(t, s.Check())
	require.NoError(t, d.Check())
}

func reserveErr(_ *Reservation, err error) error { return err }
func carveErr(_ Range, err error) error          { return err }

func TestReserveAlignment(t *testing.T) {
	s, _ := newSpace(t)
	for _, align := range []uint64{0, 1, 4096, gran, 16 * gran, 1 << 30} {
		r, err := s.Reserve(2*gran, align)
		require.NoError(t, err)
		require.Zero(t, uint64(r.Base())%max(align, gran), "align %d: base %s", align, r.Base())
		require.Equal(t, uint64(2*gran), r.Size())
		require.Same(t, s, r.Space())
	}
	rs := s.Reservations()
	require.Len(t, rs, 6)
	require.True(t, slices.IsSortedFunc(rs, func(a, b *Reservation) int { return int(a.Base()>>20) - int(b.Base()>>20) }))
	require.NoError(t, s.Check())
}

func TestCarve(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(16*gran, 16*gran)
	require.NoError(t, err)
	b := r.Base()
	a, err := r.Carve(gran, 0)
	require.NoError(t, err)
	require.Equal(t, Range{b, gran}, a, "first fit from the lowest address")
	c, err := r.Carve(2*gran, 4*gran)
	require.NoError(t, err)
	require.Equal(t, Range{b + 4*gran, 2 * gran}, c, "aligned to 4 granules")
	e, err := r.CarveAt(b+gran, gran)
	require.NoError(t, err)
	require.Equal(t, []Range{a, e, c}, r.Carved())
	require.NoError(t, r.Uncarve(e))
	require.NoError(t, r.Uncarve(a))
	f, err := r.Carve(3*gran, 0)
	require.NoError(t, err)
	require.Equal(t, Range{b, 3 * gran}, f, "uncarved ranges merge")
	require.NoError(t, s.Check())
}

func TestCarveRejectsBadInput(t *testing.T) {
	s, d := newSpace(t)
	r, err := s.Reserve(8*gran, 0)
	require.NoError(t, err)
	b := r.Base()
	taken, err := r.CarveAt(b+2*gran, 2*gran)
	require.NoError(t, err)
	before := snap(s)

	requireIs(t, carveErr(r.Carve(0, 0)), driver.ErrInvalid, "vaspace: carve", "size is zero")
	requireIs(t, carveErr(r.Carve(gran/2, 0)), driver.ErrMisaligned, "granularity 2 MiB")
	requireIs(t, carveErr(r.Carve(gran, 3*gran)), driver.ErrInvalid, "alignment", "not a power of two")
	requireIs(t, carveErr(r.CarveAt(b, 0)), driver.ErrInvalid, "size is zero")
	requireIs(t, carveErr(r.CarveAt(b, gran+1)), driver.ErrMisaligned, "granularity 2 MiB")
	requireIs(t, carveErr(r.CarveAt(b+4096, gran)), driver.ErrMisaligned, "granularity 2 MiB")

	// Taken: the message names the carved range in the way.
	requireIs(t, carveErr(r.CarveAt(b+gran, 2*gran)), driver.ErrOverlap, "overlaps the carved range "+taken.String())
	requireIs(t, carveErr(r.CarveAt(b+3*gran, gran)), driver.ErrOverlap, taken.String())

	// Outside, wholly or in part.
	requireIs(t, carveErr(r.CarveAt(b-gran, gran)), driver.ErrNotReserved, "not inside the reservation")
	requireIs(t, carveErr(r.CarveAt(b+7*gran, 2*gran)), driver.ErrNotReserved, "not inside the reservation")
	requireIs(t, carveErr(r.CarveAt(b+8*gran, gran)), driver.ErrNotReserved)
	requireIs(t, carveErr(r.CarveAt(^driver.Addr(0)-gran+1, gran)), driver.ErrNotReserved)

	// No room: says so, with the largest free range.
	requireIs(t, carveErr(r.Carve(6*gran, 0)), driver.ErrOutOfMemory,
		"no free range of 12 MiB", "the largest free range is 8 MiB")
	requireIs(t, carveErr(r.Carve(gran, 1<<62)), driver.ErrOutOfMemory, "aligned to 4194304 TiB")

	require.Equal(t, before, snap(s))
	require.NoError(t, s.Check())
	require.NoError(t, d.Check())
}

func TestUncarveRejectsWhatWasNotCarved(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(8*gran, 0)
	require.NoError(t, err)
	b := r.Base()
	c, err := r.CarveAt(b+2*gran, 2*gran)
	require.NoError(t, err)
	before := snap(s)

	requireIs(t, r.Uncarve(Range{b, gran}), driver.ErrNotReserved, "nothing carved starts there")
	requireIs(t, r.Uncarve(Range{b + 3*gran, gran}), driver.ErrNotReserved, "overlaps the carved range "+c.String())
	requireIs(t, r.Uncarve(Range{b + 2*gran, gran}), driver.ErrNotReserved, "the carved range there is "+c.String())
	requireIs(t, r.Uncarve(Range{b + 2*gran, 4 * gran}), driver.ErrNotReserved, c.String())
	requireIs(t, r.Uncarve(Range{b + 100*gran, gran}), driver.ErrNotReserved)
	require.Equal(t, before, snap(s))

	require.NoError(t, r.Uncarve(c))
	requireIs(t, r.Uncarve(c), driver.ErrNotReserved, "nothing carved starts there")
	require.Empty(t, r.Carved())
	require.NoError(t, s.Check())
}

func TestFreeRefusesWhileOccupied(t *testing.T) {
	s, d := newSpace(t)
	r, err := s.Reserve(8*gran, 0)
	require.NoError(t, err)
	_, err = r.Carve(4*gran, 0) // carved ranges do not hold the range
	require.NoError(t, err)
	o1, o2 := &occupant{}, &occupant{}
	require.NoError(t, r.Attach(o1))
	require.NoError(t, r.Attach(o1)) // once is enough
	require.NoError(t, r.Attach(o2))
	var uses []Use
	for i := range 6 {
		uses = append(uses, Use{Range{r.Base() + driver.Addr(i*gran), gran}, fmt.Sprintf("chunk %d of device 1", i+1)})
	}
	o1.set(uses[:2]...)
	o2.set(uses[2:]...)
	before := snap(s)

	err = r.Free()
	requireIs(t, err, driver.ErrBusy, "vaspace: free "+r.String(), "6 use(s)",
		uses[0].String(), "chunk 4 of device 1 at", ", and 2 more")
	require.NotContains(t, err.Error(), "chunk 5 of device 1")
	require.False(t, r.Freed())
	require.Equal(t, before, snap(s))

	// Occupants with nothing in use do not hold the range.
	o1.set()
	requireIs(t, r.Free(), driver.ErrBusy, "4 use(s)")
	r.Detach(o2)
	r.Detach(o2)
	require.NoError(t, r.Free())
	require.True(t, r.Freed())
	require.Empty(t, s.Reservations())
	// The driver no longer holds it either.
	requireIs(t, d.Unreserve(r.Base(), r.Size()), driver.ErrNotReserved)
	require.NoError(t, s.Check())
	require.NoError(t, d.Check())
}

// TestFreeRefusedByDriver: something mapped with no occupant to report it is
// still caught, by the driver, and the failed Free changes nothing.
func TestFreeRefusedByDriver(t *testing.T) {
	s, d := newSpace(t)
	r, err := s.Reserve(4*gran, 0)
	require.NoError(t, err)
	_, err = r.Carve(gran, 0)
	require.NoError(t, err)
	h, err := d.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(r.Base(), h))
	before := snap(s)

	requireIs(t, r.Free(), driver.ErrBusy, "vaspace: free "+r.String())
	require.False(t, r.Freed())
	require.Equal(t, before, snap(s))
	require.NoError(t, s.Check())

	require.NoError(t, d.Unmap(r.Base(), gran))
	require.NoError(t, d.Release(h))
	require.NoError(t, r.Free())
	require.NoError(t, s.Check())
}

func TestCallsAfterFree(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(4*gran, 0)
	require.NoError(t, err)
	c, err := r.Carve(gran, 0)
	require.NoError(t, err)
	rng := r.Range()
	require.NoError(t, r.Free())

	requireIs(t, r.Free(), driver.ErrClosed, "vaspace: free", "freed")
	requireIs(t, carveErr(r.Carve(gran, 0)), driver.ErrClosed, "vaspace: carve")
	requireIs(t, carveErr(r.CarveAt(r.Base(), gran)), driver.ErrClosed)
	requireIs(t, r.Uncarve(c), driver.ErrClosed, "vaspace: uncarve")
	requireIs(t, r.Hold(func() error { t.Fatal("Hold ran fn on a freed reservation"); return nil }), driver.ErrClosed)
	requireIs(t, r.Attach(&occupant{uses: []Use{{c, "chunk 1 of device 0"}}}), driver.ErrClosed, "vaspace: attach an occupant")
	r.Detach(&occupant{})
	require.Empty(t, r.Carved())
	require.True(t, r.Freed())
	require.Equal(t, rng, r.Range())
	require.Equal(t, rng.Base, r.Base())
	require.Equal(t, rng.Size, r.Size())
	require.NoError(t, r.Check())
	require.NoError(t, s.Check())
}

func TestSpaceClose(t *testing.T) {
	s, d := newSpace(t)
	var rs []*Reservation
	for range 3 {
		r, err := s.Reserve(4*gran, 0)
		require.NoError(t, err)
		_, err = r.Carve(gran, 0)
		require.NoError(t, err)
		rs = append(rs, r)
	}
	o := &occupant{}
	o.set(Use{Range{rs[1].Base(), gran}, "chunk 3 of device 1"})
	require.NoError(t, rs[1].Attach(o))
	before := snap(s)

	requireIs(t, s.Close(), driver.ErrBusy, "vaspace: close", "1 reservation(s) still in use",
		rs[1].Range().String(), "chunk 3 of device 1")
	require.Equal(t, before, snap(s))
	for _, r := range rs {
		require.False(t, r.Freed())
	}
	_, err := s.Reserve(gran, 0)
	require.NoError(t, err, "a refused Close leaves the space open")

	o.set()
	require.NoError(t, s.Close())
	for _, r := range rs {
		require.True(t, r.Freed())
		requireIs(t, d.Unreserve(r.Base(), r.Size()), driver.ErrNotReserved)
	}
	require.Empty(t, s.Reservations())
	requireIs(t, reserveErr(s.Reserve(gran, 0)), driver.ErrClosed, "vaspace: reserve", "closed")
	requireIs(t, s.Close(), driver.ErrClosed, "vaspace: close")
	requireIs(t, rs[0].Free(), driver.ErrClosed)
	requireIs(t, carveErr(rs[2].Carve(gran, 0)), driver.ErrClosed)
	require.NoError(t, s.Check())
	require.NoError(t, d.Check())
	require.Same(t, d, s.Driver())
}

// TestCloseRefusedByDriver: the driver refuses one reservation; Close frees
// the others and the space stays open so that Close can be tried again.
func TestCloseRefusedByDriver(t *testing.T) {
	s, d := newSpace(t)
	a, err := s.Reserve(2*gran, 0)
	require.NoError(t, err)
	b, err := s.Reserve(2*gran, 0)
	require.NoError(t, err)
	h, err := d.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(b.Base(), h))

	requireIs(t, s.Close(), driver.ErrBusy, "refused to unreserve 1 of 2")
	require.True(t, a.Freed())
	require.False(t, b.Freed())
	require.Equal(t, []*Reservation{b}, s.Reservations())
	require.NoError(t, s.Check())

	require.NoError(t, d.Unmap(b.Base(), gran))
	require.NoError(t, s.Close())
	require.True(t, b.Freed())
	require.NoError(t, s.Check())
}

func TestHoldKeepsReservationLive(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(2*gran, 0)
	require.NoError(t, err)
	inside, release := make(chan struct{}), make(chan struct{})
	held := make(chan error)
	go func() {
		held <- r.Hold(func() error {
			close(inside)
			<-release
			// Carving under Hold is allowed.
			_, err := r.Carve(gran, 0)
			return err
		})
	}()
	<-inside
	freed := make(chan error)
	go func() { freed <- r.Free() }()
	select {
	case err := <-freed:
		t.Fatalf("Free returned while a Hold ran: %v", err)
	default:
	}
	require.False(t, r.Freed())
	close(release)
	require.NoError(t, <-held)
	require.NoError(t, <-freed)
	require.True(t, r.Freed())
	requireIs(t, r.Hold(func() error { return nil }), driver.ErrClosed)
	sentinel := errors.New("from fn")
	r2, err := s.Reserve(gran, 0)
	require.NoError(t, err)
	require.ErrorIs(t, r2.Hold(func() error { return sentinel }), sentinel)
}

// resModel is the reference model of one reservation: a flag per granule.
type resModel struct {
	r      *Reservation
	taken  []bool
	carved map[driver.Addr]Range
}

func (m *resModel) index(a driver.Addr) int { return int(uint64(a-m.r.Base()) / gran) }

func (m *resModel) free(c Range) bool {
	for i := m.index(c.Base); i < m.index(c.End()); i++ {
		if m.taken[i] {
			return false
		}
	}
	return true
}

func (m *resModel) mark(c Range, v bool) {
	for i := m.index(c.Base); i < m.index(c.End()); i++ {
		m.taken[i] = v
	}
}

func (m *resModel) sorted() []Range {
	var out []Range
	for _, c := range m.carved {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Range) int { return compareAddr(a.Base, b.Base) })
	return out
}

func compareAddr(a, b driver.Addr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// firstFit is where Carve must put size bytes aligned to align.
func (m *resModel) firstFit(size, align uint64) (Range, bool) {
	at := (uint64(m.r.Base()) + align - 1) &^ (align - 1)
	for ; at+size <= uint64(m.r.Range().End()); at += align {
		if c := (Range{driver.Addr(at), size}); m.free(c) {
			return c, true
		}
	}
	return Range{}, false
}

// TestModel runs random operations against a reference model and compares
// the whole state after every step.
func TestModel(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 600) })
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	s, d := newSpace(t)
	var live []*resModel
	var freed []*Reservation
	pick := func() *resModel { return live[rng.IntN(len(live))] }
	aligns := []uint64{0, gran, 2 * gran, 4 * gran, 8 * gran, 3 * gran}

	for step := range steps {
		op := rng.IntN(100)
		var desc string
		switch {
		case op < 8 || len(live) == 0:
			k := uint64(rng.IntN(20))
			align := aligns[rng.IntN(len(aligns))]
			desc = fmt.Sprintf("reserve %d granules aligned %d", k, align)
			r, err := s.Reserve(k*gran, align)
			switch {
			case k == 0:
				requireIsMsg(t, desc, err, driver.ErrInvalid)
			case align&(align-1) != 0:
				requireIsMsg(t, desc, err, driver.ErrInvalid)
			default:
				require.NoError(t, err, desc)
				require.Zero(t, uint64(r.Base())%max(align, gran))
				live = append(live, &resModel{r: r, taken: make([]bool, k), carved: map[driver.Addr]Range{}})
			}
		case op < 12:
			i := rng.IntN(len(live))
			m := live[i]
			desc = fmt.Sprintf("free %s", m.r)
			var o *occupant
			if rng.IntN(3) == 0 {
				o = &occupant{uses: []Use{{m.r.Range(), "chunk 1 of device 0"}}}
				require.NoError(t, m.r.Attach(o), desc)
			}
			err := m.r.Free()
			if o != nil {
				requireIsMsg(t, desc, err, driver.ErrBusy)
				m.r.Detach(o)
			} else {
				require.NoError(t, err, desc)
				live = slices.Delete(live, i, i+1)
				freed = append(freed, m.r)
			}
		case op < 14 && len(freed) > 0:
			r := freed[rng.IntN(len(freed))]
			desc = fmt.Sprintf("carve from freed %s", r)
			requireIsMsg(t, desc, carveErr(r.Carve(gran, 0)), driver.ErrClosed)
			requireIsMsg(t, desc, r.Free(), driver.ErrClosed)
		case op < 50:
			m := pick()
			k := uint64(rng.IntN(7))
			size := k * gran
			if rng.IntN(20) == 0 {
				size += 4096
			}
			align := aligns[rng.IntN(len(aligns))]
			desc = fmt.Sprintf("carve %d bytes aligned %d from %s", size, align, m.r)
			c, err := m.r.Carve(size, align)
			switch {
			case size == 0:
				requireIsMsg(t, desc, err, driver.ErrInvalid)
			case size%gran != 0:
				requireIsMsg(t, desc, err, driver.ErrMisaligned)
			case align&(align-1) != 0:
				requireIsMsg(t, desc, err, driver.ErrInvalid)
			default:
				want, ok := m.firstFit(size, max(align, gran))
				if !ok {
					requireIsMsg(t, desc, err, driver.ErrOutOfMemory)
					break
				}
				require.NoError(t, err, desc)
				require.Equal(t, want, c, desc)
				m.mark(c, true)
				m.carved[c.Base] = c
			}
		case op < 70:
			m := pick()
			n := len(m.taken)
			off := rng.IntN(n+4) - 2
			k := uint64(rng.IntN(4) + 1)
			base := m.r.Base() + driver.Addr(int64(off)*gran)
			if rng.IntN(20) == 0 {
				base += 4096
			}
			want := Range{base, k * gran}
			desc = fmt.Sprintf("carve at %s from %s", want, m.r)
			c, err := m.r.CarveAt(base, k*gran)
			switch {
			case uint64(base)%gran != 0:
				requireIsMsg(t, desc, err, driver.ErrMisaligned)
			case !m.r.Range().ContainsRange(want):
				requireIsMsg(t, desc, err, driver.ErrNotReserved)
			case !m.free(want):
				// The message names the lowest carved range in the way.
				var in []Range
				for _, x := range m.sorted() {
					if x.Overlaps(want) {
						in = append(in, x)
					}
				}
				requireIsMsg(t, desc, err, driver.ErrOverlap, "overlaps the carved range "+in[0].String())
			default:
				require.NoError(t, err, desc)
				require.Equal(t, want, c)
				m.mark(c, true)
				m.carved[c.Base] = c
			}
		default:
			m := pick()
			cs := m.sorted()
			if len(cs) > 0 && rng.IntN(4) > 0 {
				c := cs[rng.IntN(len(cs))]
				desc = fmt.Sprintf("uncarve %s from %s", c, m.r)
				require.NoError(t, m.r.Uncarve(c), desc)
				m.mark(c, false)
				delete(m.carved, c.Base)
				break
			}
			c := Range{m.r.Base() + driver.Addr(rng.IntN(len(m.taken))*gran), uint64(rng.IntN(3)+1) * gran}
			desc = fmt.Sprintf("uncarve %s (maybe not carved) from %s", c, m.r)
			err := m.r.Uncarve(c)
			if m.carved[c.Base] == c {
				require.NoError(t, err, desc)
				m.mark(c, false)
				delete(m.carved, c.Base)
			} else {
				requireIsMsg(t, desc, err, driver.ErrNotReserved)
			}
		}

		// Compare everything after every step.
		rs := s.Reservations()
		require.Len(t, rs, len(live), "step %d: %s", step, desc)
		byBase := slices.Clone(live)
		slices.SortFunc(byBase, func(a, b *resModel) int { return compareAddr(a.r.Base(), b.r.Base()) })
		for i, m := range byBase {
			require.Same(t, m.r, rs[i], "step %d: %s", step, desc)
			require.Equal(t, m.sorted(), m.r.Carved(), "step %d: %s", step, desc)
		}
		for _, r := range freed {
			require.True(t, r.Freed())
		}
		require.NoError(t, s.Check(), "step %d: %s", step, desc)
		require.NoError(t, d.Check(), "step %d: %s", step, desc)
	}
	require.NoError(t, s.Close())
	require.NoError(t, s.Check())
}

// TestConcurrent carves, uncarves, reserves, frees and holds from many
// goroutines at once; run it with -race.
func TestConcurrent(t *testing.T) {
	s, d := newSpace(t)
	shared, err := s.Reserve(64*gran, 0)
	require.NoError(t, err)
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []Range
			for range rounds {
				switch rng.IntN(5) {
				case 0, 1:
					c, err := shared.Carve(uint64(rng.IntN(3)+1)*gran, 0)
					if err == nil {
						mine = append(mine, c)
					} else if !errors.Is(err, driver.ErrOutOfMemory) {
						errs <- err
						return
					}
				case 2:
					at := shared.Base() + driver.Addr(rng.IntN(64)*gran)
					c, err := shared.CarveAt(at, gran)
					if err == nil {
						mine = append(mine, c)
					} else if !errors.Is(err, driver.ErrOverlap) {
						errs <- err
						return
					}
				case 3:
					if len(mine) > 0 {
						i := rng.IntN(len(mine))
						if err := shared.Uncarve(mine[i]); err != nil {
							errs <- err
							return
						}
						mine = slices.Delete(mine, i, i+1)
					}
				case 4:
					r, err := s.Reserve(gran, 0)
					if err != nil {
						errs <- err
						return
					}
					o := &occupant{}
					r.Attach(o)
					if err := r.Hold(func() error { _, err := r.Carve(gran, 0); return err }); err != nil {
						errs <- err
						return
					}
					r.Detach(o)
					if err := r.Free(); err != nil {
						errs <- err
						return
					}
				}
			}
			for _, c := range mine {
				if err := shared.Uncarve(c); err != nil {
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
			if err := s.Check(); err != nil {
				errs <- err
				return
			}
			_ = s.Reservations()
		}
	}()
	wg.Wait()
	close(stop)
	<-checked
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Empty(t, shared.Carved())
	require.Equal(t, []*Reservation{shared}, s.Reservations())
	require.NoError(t, s.Check())
	require.NoError(t, s.Close())
	require.NoError(t, d.Check())
}

// TestCheckFindsCorruption breaks each invariant by hand and expects Check
// to report it.
func TestCheckFindsCorruption(t *testing.T) {
	for name, corrupt := range map[string]func(s *Space, r *Reservation){
		"order":    func(s *Space, r *Reservation) { s.rs.At(0).Val, s.rs.At(1).Val = s.rs.At(1).Val, s.rs.At(0).Val },
		"overlap":  func(s *Space, r *Reservation) { s.rs.At(1).Start = s.rs.At(0).Start },
		"closed":   func(s *Space, r *Reservation) { s.closed = true },
		"space":    func(s *Space, r *Reservation) { r.space = &Space{} },
		"freed":    func(s *Space, r *Reservation) { r.freed = true },
		"carved":   func(s *Space, r *Reservation) { r.carved.Delete(1, 2) },
		"outside":  func(s *Space, r *Reservation) { r.carved.At(1).End += 100 * gran },
		"unsorted": func(s *Space, r *Reservation) { r.carved.At(0).End = r.carved.At(1).End },
		"misalign": func(s *Space, r *Reservation) { r.carved.At(0).Start += 4096 },
		"gap":      func(s *Space, r *Reservation) { r.carved.At(0).Start += gran; r.carved.At(0).End += gran },
		"twice":    func(s *Space, r *Reservation) { o := &occupant{}; r.occupants = []Occupant{o, o} },
	} {
		t.Run(name, func(t *testing.T) {
			s, _ := newSpace(t)
			r, err := s.Reserve(8*gran, 0)
			require.NoError(t, err)
			_, err = s.Reserve(8*gran, 0)
			require.NoError(t, err)
			_, err = r.Carve(gran, 0)
			require.NoError(t, err)
			_, err = r.CarveAt(r.Base()+4*gran, 2*gran)
			require.NoError(t, err)
			require.NoError(t, s.Check())
			corrupt(s, r)
			err = s.Check()
			require.True(t, errors.HasAssertionFailure(err), "%v", err)
		})
	}
}

// TestReserveFreeAllocations: a reservation nothing is carved from costs
// two allocations, its record and the driver ledger's; the free extents
// are made only when something is carved. Skipped where the invariants
// tag runs the checks, which allocate.
func TestReserveFreeAllocations(t *testing.T) {
	if invariants.Enabled {
		t.Skip("the invariant checks allocate")
	}
	s, _ := newSpace(t)
	n := testing.AllocsPerRun(50, func() {
		r, err := s.Reserve(4*gran, 0)
		require.NoError(t, err)
		require.NoError(t, r.Free())
	})
	require.LessOrEqual(t, n, 2.0, "allocations a reserve and free")
}
