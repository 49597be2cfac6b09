package stream_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
)

// TestElapsedZeroEvents: Elapsed between events not made by NewEvent
// (zero values, which share the nil driver) is ErrInvalid naming it, not a
// nil dereference.
func TestElapsedZeroEvents(t *testing.T) {
	d := newHost(t)
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ev.Destroy() })
	for _, c := range []struct {
		name       string
		start, end *stream.Event
	}{
		{"both zero", &stream.Event{}, &stream.Event{}},
		{"zero start", &stream.Event{}, ev},
		{"zero end", ev, &stream.Event{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := noPanic(func() error { _, err := stream.Elapsed(c.start, c.end); return err })
			drivertest.RequireIs(t, err, driver.ErrInvalid, "Elapsed", "nil or zero")
		})
	}
}

// TestAfterDriverClose: streams, events and hooks of a driver closed under
// them answer every call with ErrClosed (hooks register and cancel, twice
// too), none panics, and a stream already destroyed stays so.
func TestAfterDriverClose(t *testing.T) {
	d, err := host.New(host.Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	s, err := stream.New(d, 0)
	require.NoError(t, err)
	s2, err := stream.New(d, 0)
	require.NoError(t, err)
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Record(ev))
	require.NoError(t, s.Synchronize())
	hb, err := stream.NewHostBuffer(d, 4096)
	require.NoError(t, err)
	require.NoError(t, hb.Free())
	require.NoError(t, d.Close())
	pos := s.Position()
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Record", func() error { return s.Record(ev) }},
		{"Wait", func() error { return s2.Wait(ev) }},
		{"Launch", func() error { return s.Launch("late", func() error { return nil }) }},
		{"CopyHtoHSync", func() error { return s.CopyHtoHSync(make([]byte, 8), make([]byte, 8)) }},
		{"Synchronize", s.Synchronize},
		{"Query", func() error { _, err := s.Query(); return err }},
		{"Event.Synchronize", ev.Synchronize},
		{"Event.WaitDone", ev.WaitDone},
		{"Event.Query", func() error { _, err := ev.Query(); return err }},
		{"Elapsed", func() error { _, err := stream.Elapsed(ev, ev); return err }},
		{"HostBuffer.Free", hb.Free},
		{"Event.Destroy", ev.Destroy},
		{"Destroy", s.Destroy},
		{"New", func() error { _, err := stream.New(d, 0); return err }},
		{"NewEvent", func() error { _, err := stream.NewEvent(d, 0); return err }},
		{"NewHostBuffer", func() error { _, err := stream.NewHostBuffer(d, 64); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			drivertest.RequireIs(t, noPanic(c.call), driver.ErrClosed)
			require.Equal(t, pos, s.Position(), "nothing counted")
		})
	}
	require.True(t, s.Destroyed())
	require.Nil(t, hb.Bytes())
	cancel, err := stream.OnSynchronize(d, func() {})
	require.NoError(t, err)
	require.NotPanics(t, func() { cancel(); cancel() })
	drivertest.RequireIs(t, noPanic(s2.Destroy), driver.ErrClosed)
}
