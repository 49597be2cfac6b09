package stream

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
)

// destroyFirstDriver runs destroy, once, at the start of the next wait or
// query of a stream or event: a Destroy by another goroutine that wins
// the race between the stream package's check and the driver's call.
type destroyFirstDriver struct {
	*host.Driver
	destroy func()
}

func (d *destroyFirstDriver) first() {
	if f := d.destroy; f != nil {
		d.destroy = nil
		f()
	}
}

func (d *destroyFirstDriver) SyncStream(s driver.Stream) error {
	d.first()
	return d.Driver.SyncStream(s)
}

func (d *destroyFirstDriver) QueryStream(s driver.Stream) (bool, error) {
	d.first()
	return d.Driver.QueryStream(s)
}

func (d *destroyFirstDriver) SyncEvent(e driver.Event) error {
	d.first()
	return d.Driver.SyncEvent(e)
}

func (d *destroyFirstDriver) QueryEvent(e driver.Event) (bool, error) {
	d.first()
	return d.Driver.QueryEvent(e)
}

// TestDestroyedMeanwhile: a synchronize, wait or query that a Destroy of
// its stream or event overtakes on the way to the driver is ErrClosed,
// as it is when the Destroy came first, not the driver's ErrBadHandle.
func TestDestroyedMeanwhile(t *testing.T) {
	hd, err := host.New(host.Options{Devices: 1, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, hd)
	d := &destroyFirstDriver{Driver: hd}
	for name, call := range map[string]func(*Stream) error{
		"synchronize": func(s *Stream) error { return s.Synchronize() },
		"query":       func(s *Stream) error { _, err := s.Query(); return err },
	} {
		s, err := New(d, 0)
		require.NoError(t, err)
		d.destroy = func() { require.NoError(t, s.Destroy()) }
		drivertest.RequireIs(t, call(s), driver.ErrClosed, "destroyed meanwhile")
		require.Nil(t, d.destroy, name)
	}
	for name, call := range map[string]func(*Event) error{
		"synchronize": func(e *Event) error { return e.Synchronize() },
		"wait":        func(e *Event) error { return e.WaitDone() },
		"query":       func(e *Event) error { _, err := e.Query(); return err },
	} {
		e, err := NewEvent(d, 0)
		require.NoError(t, err)
		d.destroy = func() { require.NoError(t, e.Destroy()) }
		drivertest.RequireIs(t, call(e), driver.ErrClosed, "destroyed meanwhile")
		require.Nil(t, d.destroy, name)
	}
}
