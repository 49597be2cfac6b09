package multidev

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestNilArguments: New refuses nil arguments and a space or memory made
// without a driver (driver.ErrInvalid), instead of panicking; an explicit
// placement whose function panics fails the grow cleanly (ErrInvalid,
// naming the panic) and leaves the arena as it was.
func TestNilArguments(t *testing.T) {
	e := newEnv(t, 16*g, false)
	for name, c := range map[string]struct {
		space *vaspace.Space
		mem   *physical.Memory
	}{
		"nil space":             {nil, e.mem},
		"nil memory":            {e.space, nil},
		"space with no driver":  {vaspace.New(nil), e.mem},
		"memory with no driver": {e.space, physical.New(nil)},
	} {
		_, err := New(c.space, c.mem, Options{Max: 4 * g})
		require.Error(t, err, name)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "multidev: new arena")
	}
	_, err := New(e.space, e.mem, Options{Max: 4 * g, Placement: Explicit(nil)})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "no function")
	require.Empty(t, e.space.Reservations())

	calls := 0
	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g, Placement: Explicit(func(off uint64) driver.DeviceID {
		if calls++; off >= 3*g {
			panic("placement bug")
		}
		return driver.DeviceID(off / g % 4)
	})})
	require.NoError(t, a.Grow(2*g))
	before := e.state(t, a)
	drivertest.RequireIs(t, a.Grow(2*g), driver.ErrInvalid, "the placement's Order panicked: placement bug")
	require.Equal(t, before, e.state(t, a))
	require.NoError(t, a.Check())
	require.NoError(t, a.Shrink(2*g))
}
