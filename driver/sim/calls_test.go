package sim_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestTallyCountsEachCall: a known sequence of calls on two devices is
// counted exactly — one per call that succeeded, whatever it spans, on
// the device of the chunk (SetAccess: of the device granted), Reserve and
// Unreserve driver-wide — and failed calls are not counted.
func TestTallyCountsEachCall(t *testing.T) {
	const mib = units.MiB
	drv, err := sim.New(sim.Options{Devices: 2, Capacity: 64 * mib})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	require.Equal(t, sim.Tally{Costs: sim.A100, Devices: make([]sim.Calls, 2)}, drv.Tally())

	base, err := drv.Reserve(64*mib, 0, 0)
	require.NoError(t, err)
	h0, err := drv.Create(0, 4*mib, driver.ChunkOptions{})
	require.NoError(t, err)
	h1, err := drv.Create(1, 2*mib, driver.ChunkOptions{})
	require.NoError(t, err)
	h1b, err := drv.Create(1, 2*mib, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, drv.Map(base, h0))
	require.NoError(t, drv.Map(base+driver.Addr(4*mib), h1))
	require.NoError(t, drv.Map(base+driver.Addr(6*mib), h1b))
	// One call over three mappings of two devices' chunks, granted to
	// device 0: one SetAccess, device 0's.
	require.NoError(t, drv.SetAccess(base, 8*mib, 0, driver.AccessReadWrite))
	require.NoError(t, drv.SetAccess(base+driver.Addr(4*mib), 4*mib, 1, driver.AccessRead))
	// The same grant again is a call all the same.
	require.NoError(t, drv.SetAccess(base+driver.Addr(4*mib), 4*mib, 1, driver.AccessRead))
	// Released while mapped: device 1's release now, its memory with the
	// unmap.
	require.NoError(t, drv.Release(h1))
	require.NoError(t, drv.Unmap(base+driver.Addr(4*mib), 2*mib))

	// Failures, none counted.
	_, err = drv.Create(1, 128*mib, driver.ChunkOptions{})
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	_, err = drv.Create(2, 2*mib, driver.ChunkOptions{})
	require.True(t, errors.Is(err, driver.ErrNoDevice), "%v", err)
	require.True(t, errors.Is(drv.Map(base, h1b), driver.ErrOverlap))
	require.True(t, errors.Is(drv.Map(base, h1), driver.ErrBadHandle))
	require.True(t, errors.Is(drv.Unmap(base+driver.Addr(4*mib), 2*mib), driver.ErrNotMapped))
	require.True(t, errors.Is(drv.Release(h1), driver.ErrBadHandle))
	require.True(t, errors.Is(drv.SetAccess(base+driver.Addr(4*mib), 4*mib, 0, driver.AccessRead), driver.ErrNotMapped))
	require.True(t, errors.Is(drv.Unreserve(base, 64*mib), driver.ErrBusy))
	_, err = drv.Reserve(3*units.KiB, 0, 0)
	require.True(t, errors.Is(err, driver.ErrMisaligned), "%v", err)

	require.NoError(t, drv.Unmap(base, 4*mib))
	require.NoError(t, drv.Unmap(base+driver.Addr(6*mib), 2*mib))
	require.NoError(t, drv.Release(h0))
	require.NoError(t, drv.Release(h1b))
	require.NoError(t, drv.Unreserve(base, 64*mib))

	tally := drv.Tally()
	require.Equal(t, sim.Calls{Reserve: 1, Unreserve: 1}, tally.Space)
	require.Equal(t, []sim.Calls{
		{Create: 1, Release: 1, Map: 1, Unmap: 1, SetAccess: 1},
		{Create: 2, Release: 2, Map: 2, Unmap: 2, SetAccess: 2},
	}, tally.Devices)
	require.Equal(t, sim.Calls{Reserve: 1, Unreserve: 1, Create: 3, Release: 3, Map: 3, Unmap: 3, SetAccess: 3}, tally.Total())
	require.Equal(t, uint64(17), tally.Total().Total())
	require.Equal(t, tally.Total(), drv.Calls(), "Calls is Tally's Total")

	// Priced: counts times the table.
	want := 1*sim.A100.Reserve + 3*sim.A100.Create + 3*sim.A100.Map + 3*sim.A100.Unmap + 3*sim.A100.SetAccess
	require.Equal(t, want, tally.Time())
	require.Equal(t, 19*time.Microsecond+3*(193320+1450+25630+35990)*time.Nanosecond, tally.Time())
	require.Equal(t, 2*sim.A100.Create+2*sim.A100.Map+2*sim.A100.Unmap+2*sim.A100.SetAccess, tally.Devices[1].Time(tally.Costs))

	// The tally is a copy.
	tally.Devices[0].Map = 99
	require.Equal(t, uint64(1), drv.Tally().Devices[0].Map)
}

// TestTallyOwnCosts: Options.Costs prices the tally; a negative cost is
// refused, naming the call.
func TestTallyOwnCosts(t *testing.T) {
	costs := sim.CallCosts{Name: "round", Reserve: 1, Unreserve: 2, Create: 10, Release: 20, Map: 100, Unmap: 200, SetAccess: 1000}
	drv, err := sim.New(sim.Options{Costs: costs})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	base, err := drv.Reserve(8*units.MiB, 0, 0)
	require.NoError(t, err)
	for i := range 3 {
		h, err := drv.Create(0, 2*units.MiB, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, drv.Map(base+driver.Addr(uint64(i)*2*units.MiB), h))
		require.NoError(t, drv.Release(h))
	}
	require.NoError(t, drv.SetAccess(base, 6*units.MiB, 0, driver.AccessReadWrite))
	for i := range 3 {
		require.NoError(t, drv.Unmap(base+driver.Addr(uint64(i)*2*units.MiB), 2*units.MiB))
	}
	require.NoError(t, drv.Unreserve(base, 8*units.MiB))
	tally := drv.Tally()
	require.Equal(t, costs, tally.Costs)
	require.Equal(t, []sim.Calls{{Create: 3, Release: 3, Map: 3, Unmap: 3, SetAccess: 1}}, tally.Devices)
	require.Equal(t, time.Duration(1+2+3*10+3*20+3*100+3*200+1000), tally.Time())

	for _, bad := range []struct {
		name  string
		costs sim.CallCosts
	}{
		{"Reserve", sim.CallCosts{Reserve: -1}},
		{"Unreserve", sim.CallCosts{Map: 1, Unreserve: -time.Second}},
		{"Create", sim.CallCosts{Create: -1}},
		{"Release", sim.CallCosts{Release: -1}},
		{"Map", sim.CallCosts{Map: -1}},
		{"Unmap", sim.CallCosts{Unmap: -1}},
		{"SetAccess", sim.CallCosts{SetAccess: -1}},
	} {
		_, err := sim.New(sim.Options{Costs: bad.costs})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%s: %v", bad.name, err)
		require.Contains(t, err.Error(), "cost of a "+bad.name+" call")
	}
}

// TestCallsArithmetic: Time multiplies and sums, unpriced calls cost
// nothing, and a sum past the largest Duration stays there instead of
// wrapping.
func TestCallsArithmetic(t *testing.T) {
	c := sim.Calls{Reserve: 1, Unreserve: 2, Create: 3, Release: 4, Map: 5, Unmap: 6, SetAccess: 7}
	require.Equal(t, uint64(28), c.Total())
	require.Equal(t, c, c.Add(c).Sub(c))
	require.Equal(t, sim.Calls{}, c.Sub(c))
	require.Equal(t, 3*sim.A100.Create+5*sim.A100.Map+6*sim.A100.Unmap+7*sim.A100.SetAccess+sim.A100.Reserve, c.Time(sim.A100))
	require.Zero(t, sim.A100.Release, "no published figure for cuMemRelease")
	require.Zero(t, sim.A100.Unreserve, "no published figure for cuMemAddressFree")
	require.Equal(t, time.Duration(0), c.Time(sim.CallCosts{}))
	require.Equal(t, time.Duration(0), c.Time(sim.CallCosts{Map: -time.Second}))
	huge := sim.Calls{Map: math.MaxUint64}
	require.Equal(t, time.Duration(math.MaxInt64), huge.Time(sim.A100))
	require.Equal(t, time.Duration(math.MaxInt64), sim.Calls{Map: 1 << 62, Unmap: 1 << 62}.Time(sim.CallCosts{Map: 1, Unmap: 1}))
	require.Equal(t, time.Duration(math.MaxInt64), sim.Calls{Map: 1 << 62, Unmap: 1 << 62}.Time(sim.CallCosts{Map: 2, Unmap: 1}))
}

// TestTallyConcurrent: calls from many goroutines are each counted once,
// on their own device (run with -race).
func TestTallyConcurrent(t *testing.T) {
	const devices, rounds = 4, 200
	drv, err := sim.New(sim.Options{Devices: devices, Capacity: 64 * units.MiB})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	var wg sync.WaitGroup
	errs := make(chan error, devices)
	for dev := range driver.DeviceID(devices) {
		wg.Go(func() {
			errs <- func() error {
				base, err := drv.Reserve(4*units.MiB, 0, 0)
				if err != nil {
					return err
				}
				for range rounds {
					h, err := drv.Create(dev, 2*units.MiB, driver.ChunkOptions{})
					if err != nil {
						return err
					}
					err = errors.CombineErrors(drv.Map(base, h), drv.SetAccess(base, 2*units.MiB, dev, driver.AccessReadWrite))
					err = errors.CombineErrors(err, drv.Release(h))
					if err = errors.CombineErrors(err, drv.Unmap(base, 2*units.MiB)); err != nil {
						return err
					}
					_ = drv.Tally()
				}
				return drv.Unreserve(base, 4*units.MiB)
			}()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	<-done
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	tally := drv.Tally()
	require.Equal(t, sim.Calls{Reserve: devices, Unreserve: devices}, tally.Space)
	for dev, c := range tally.Devices {
		require.Equal(t, sim.Calls{Create: rounds, Release: rounds, Map: rounds, Unmap: rounds, SetAccess: rounds}, c, "device %d", dev)
	}
}

// TestCostTable: the tables by name, and an unknown name refused with an
// error that lists the known ones.
func TestCostTable(t *testing.T) {
	for _, name := range sim.CostTableNames() {
		c, err := sim.CostTable(name)
		require.NoError(t, err)
		require.NotEmpty(t, c.Name)
	}
	c, err := sim.CostTable("a100")
	require.NoError(t, err)
	require.Equal(t, sim.A100, c)
	c, err = sim.CostTable("h100")
	require.NoError(t, err)
	require.Equal(t, sim.H100, c)
	for _, bad := range []string{"", "A100", "b200", "h100 "} {
		_, err := sim.CostTable(bad)
		require.True(t, errors.Is(err, driver.ErrInvalid), "%q: %v", bad, err)
		require.ErrorContains(t, err, "want a100 or h100")
	}
	require.Equal(t, sim.Calls{}, (&sim.Driver{}).Calls(), "an unmade driver counts nothing")
}
