package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestNilArguments: the constructors refuse nil arguments, and a space or
// memory made without a driver, with driver.ErrInvalid; none panics and
// none reserves anything.
func TestNilArguments(t *testing.T) {
	e := newEnv(t, 16*g)
	noSpace, noMem := vaspace.New(nil), physical.New(nil)
	for _, c := range []struct {
		name  string
		space *vaspace.Space
		mem   *physical.Memory
		frag  string
	}{
		{"nil space", nil, e.mem, "nil"},
		{"nil memory", e.space, nil, "nil"},
		{"space without a driver", noSpace, e.mem, "no driver"},
		{"memory without a driver", e.space, noMem, "no driver"},
		{"zero space", &vaspace.Space{}, e.mem, "no driver"},
		{"zero memory", e.space, &physical.Memory{}, "no driver"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.space, c.mem, Options{Max: g})
			drivertest.RequireIs(t, err, driver.ErrInvalid, c.frag)
			_, err = NewSparse(c.space, c.mem, SparseOptions{Max: g})
			drivertest.RequireIs(t, err, driver.ErrInvalid, c.frag)
			_, err = NewAllocator(c.space, c.mem, AllocatorOptions{Max: g})
			drivertest.RequireIs(t, err, driver.ErrInvalid, c.frag)
		})
	}
	_, err := New(e.space, e.mem, Options{Max: g, Placement: (*panicky)(nil)})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the placement is a nil *arena.panicky")
	require.Empty(t, e.space.Reservations())
}

// panicky is a placement that puts chunks on device 0 until it panics at
// chunk index at.
type panicky struct{ at int }

func (p *panicky) Order(_ uint64, i int, _ []uint64) []driver.DeviceID {
	if i >= p.at {
		panic("placement bug")
	}
	return []driver.DeviceID{0}
}

func (p *panicky) String() string { panic("String bug") }

// TestPanickingPlacement: a placement is the caller's code; when it
// panics in the middle of a commit of several chunks, the grow fails with
// driver.ErrInvalid naming the panic, and the arena, its range and the
// device are exactly as before (the chunks made for the commit are
// undone). The arena keeps working afterwards.
func TestPanickingPlacement(t *testing.T) {
	e := newEnv(t, 16*g)
	p := &panicky{at: 3}
	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g, MaxChunk: g, Placement: p, Access: []driver.DeviceID{0}})
	require.NoError(t, a.Grow(2*g))
	before, used := a.Stats(), e.used(t, 0)
	layout := a.Layout()

	err := a.Grow(3 * g) // chunks 2 (fine), 3 (panics)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "placement's Order panicked: placement bug", "whose String panicked")
	require.Equal(t, before, a.Stats())
	require.Equal(t, layout, a.Layout())
	require.Equal(t, used, e.used(t, 0))
	require.NoError(t, a.Check())

	p.at = 100
	require.NoError(t, a.Grow(3*g))
	require.Equal(t, 5*g, a.Committed())
	require.NoError(t, a.Check())
}
