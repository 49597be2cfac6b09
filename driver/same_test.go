package driver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// TestSame: Same is == where == can be asked, and false without a panic
// for drivers of a type == cannot compare.
func TestSame(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 1 << 30})
	require.NoError(t, err)
	defer d.Close()
	e, err := sim.New(sim.Options{Devices: 1, Capacity: 1 << 30})
	require.NoError(t, err)
	defer e.Close()
	require.True(t, driver.Same(d, d))
	require.False(t, driver.Same(d, e))
	require.True(t, driver.Same(nil, nil))
	require.False(t, driver.Same(d, nil))
	require.False(t, driver.Same(nil, d))
	p := &sliceDriver{Driver: d}
	require.True(t, driver.Same(p, p))
	v := sliceDriver{Driver: d, tags: []string{"x"}}
	require.NotPanics(t, func() { require.False(t, driver.Same(v, v)) })
	require.False(t, driver.Same(v, d))
	require.False(t, driver.Same(d, v))
}
