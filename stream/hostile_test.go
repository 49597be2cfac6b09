package stream_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
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
