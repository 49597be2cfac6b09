package multidev

import (
	"sync"
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

// listPlacement is a caller's own placement, naming devs for every chunk.
type listPlacement []driver.DeviceID

func (p listPlacement) Order(uint64, int, []uint64) []driver.DeviceID { return p }
func (p listPlacement) String() string                                { return "a caller's list" }

// TestHostileOptionsAndRanges: a caller's placement that names no device
// or only devices the machine lacks fails the grow (and maps nothing); a
// Max that overflows when rounded to chunks is refused at New; grants
// over ranges whose end overflows are refused; none changes the arena.
func TestHostileOptionsAndRanges(t *testing.T) {
	e := newEnv(t, 16*g, false)
	for _, c := range []struct {
		name     string
		pl       listPlacement
		sentinel error
		mentions string
	}{
		{"no device", listPlacement{}, driver.ErrInvalid, "named no device"},
		{"unknown devices", listPlacement{7, -3}, driver.ErrNoDevice, "device 7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := e.arena(t, Options{Max: 4 * g, ChunkSize: g, Placement: c.pl})
			drivertest.RequireIs(t, a.Grow(g), c.sentinel, c.mentions)
			require.Zero(t, a.Committed())
			require.NoError(t, a.Check())
		})
	}
	for _, max := range []uint64{^uint64(0), ^uint64(0) - g/2} {
		_, err := New(e.space, e.mem, Options{Max: max, ChunkSize: g})
		drivertest.RequireIs(t, err, driver.ErrInvalid, "overflows")
	}
	a := e.arena(t, Options{Max: 8 * g, ChunkSize: g})
	require.NoError(t, a.Grow(3*g))
	for _, off := range []uint64{g, 2 * g} {
		before := e.state(t, a)
		drivertest.RequireIs(t, a.Grant(1, off, ^uint64(0)-g+1, driver.AccessRead), driver.ErrNotMapped, "grant")
		require.Equal(t, before, e.state(t, a))
	}
}

// TestCloseRacesEveryCall: Close, twice, racing every other call from
// goroutines of their own (run it with -race): each call either runs or
// is refused (ErrClosed, or the refusal it would get anyway), none
// panics, and afterwards every device's memory and the address space are
// given back.
func TestCloseRacesEveryCall(t *testing.T) {
	e := newEnv(t, 16*g, false)
	for range 10 {
		a, err := New(e.space, e.mem, Options{Max: 8 * g, ChunkSize: g})
		require.NoError(t, err)
		require.NoError(t, a.Grow(4*g))
		calls := []func() error{
			func() error { return a.Grow(g) },
			func() error { return a.Shrink(g) },
			a.Trim,
			func() error { return a.Grant(1, 0, 2*g, driver.AccessReadWrite) },
			func() error { return a.Migrate(0, 2*g, 3) },
			func() error { return a.Write(0, 0, make([]byte, 100)) },
			func() error { return a.Read(0, 0, make([]byte, 100)) },
			func() error { _, err := a.DeviceAt(g); return err },
			func() error { _, err := a.Access(1, g); return err },
			func() error { _, err := a.Reachable(0, 1); return err },
			func() error { _ = a.Layout(); _ = a.Stats(); return nil },
			a.Check,
			a.Close,
			a.Close,
		}
		var wg sync.WaitGroup
		panics := make(chan any, len(calls))
		for _, call := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if r := recover(); r != nil {
						panics <- r
					}
				}()
				_ = call()
			}()
		}
		wg.Wait()
		close(panics)
		for r := range panics {
			t.Errorf("a call racing Close panicked: %v", r)
		}
		drivertest.RequireIs(t, a.Close(), driver.ErrClosed)
		require.NoError(t, a.Check())
	}
	require.Empty(t, e.space.Reservations())
	require.Equal(t, []uint64{0, 0, 0, 0}, e.used(t))
	require.NoError(t, e.mem.Check())
}
