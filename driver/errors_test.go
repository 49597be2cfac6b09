package driver_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// sliceDriver is a driver whose dynamic type is not comparable: a struct
// value holding a slice. Comparing two of them with == panics.
type sliceDriver struct {
	driver.Driver
	tags []string
}

func TestCheckComparable(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 1 << 30})
	require.NoError(t, err)
	defer d.Close()
	what := func() string { return "test" }
	require.NoError(t, driver.CheckComparable(what, d))
	require.NoError(t, driver.CheckComparable(what, &sliceDriver{Driver: d}), "a pointer is comparable")

	err = driver.CheckComparable(what, sliceDriver{Driver: d, tags: []string{"x"}})
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.Contains(t, err.Error(), "driver_test.sliceDriver is not comparable")
	require.Contains(t, errors.FlattenHints(err), "pointer")

	err = driver.CheckComparable(what, nil)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.Contains(t, err.Error(), "nil")
}

// TestChecksRefuseNonsense: the shared Check functions are exported, so a
// caller can reach them with a nil description or a zero granularity; they
// answer ErrInvalid (or their usual error) instead of dividing by zero or
// calling nil.
func TestChecksRefuseNonsense(t *testing.T) {
	is := func(err, want error, frag string) {
		t.Helper()
		require.True(t, errors.Is(err, want), "want %v, got %v", want, err)
		require.Contains(t, err.Error(), frag)
	}
	is(driver.CheckSize(nil, 4096, 0), driver.ErrInvalid, "check: the granularity is zero")
	is(driver.CheckSize(nil, 0, 4096), driver.ErrInvalid, "check: size is zero")
	is(driver.CheckSize(nil, 1, 4096), driver.ErrMisaligned, "check: size")
	is(driver.CheckAddr(nil, 4096, 0), driver.ErrInvalid, "the granularity is zero")
	is(driver.CheckAddr(nil, 1, 4096), driver.ErrMisaligned, "check: address")
	is(driver.CheckAlign(nil, 3), driver.ErrInvalid, "check: alignment 3")
	is(driver.CheckAccess(nil, 7), driver.ErrInvalid, "check: access value 7")
	is(driver.CheckDevice(nil, 0, 0), driver.ErrNoDevice, "there are no devices")
	is(driver.CheckDevice(nil, -1, 2), driver.ErrNoDevice, "numbered 0 to 1")
	is(driver.CheckComparable(nil, nil), driver.ErrInvalid, "the driver is nil")
	is(driver.CheckComparable(nil, (*sim.Driver)(nil)), driver.ErrInvalid, "the driver is a nil *sim.Driver")
	is(driver.CheckPIDs(nil, []int{42, 0}), driver.ErrInvalid, "process ID 0 on the allow-list")
	is(driver.CheckPIDs(nil, []int{-3}), driver.ErrInvalid, "process ID -3")
	require.NoError(t, driver.CheckPIDs(nil, []int{1, 42}))
	require.NoError(t, driver.CheckPIDs(nil, nil))
}
