package stream

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
)

// waitHookDriver runs beforeWait, once, at the start of the next
// StreamWaitEvent: inside Stream.Wait, between its reading the event and
// the driver's reading it.
type waitHookDriver struct {
	*host.Driver
	beforeWait func()
}

func (d *waitHookDriver) StreamWaitEvent(s driver.Stream, ev driver.Event) error {
	if f := d.beforeWait; f != nil {
		d.beforeWait = nil
		f()
	}
	return d.Driver.StreamWaitEvent(s, ev)
}

// TestWaitRacesRecord: a Wait on an event while another goroutine
// records the same event on another stream learns the order of the
// record the driver waits for, never of an earlier one. The event is
// first recorded on a, after a's work; a goroutine re-records it on b at
// the moment Wait hands it to the driver, if Wait lets it. Were the
// re-record let in, the driver would wait for b's record while w's books
// said w ran after a's work — a pool would reuse memory a's work may still
// touch.
func TestWaitRacesRecord(t *testing.T) {
	hd, err := host.New(host.Options{Devices: 1, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, hd)
	d := &waitHookDriver{Driver: hd}
	var ss []*Stream
	for range 3 {
		s, err := New(d, 0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Destroy() })
		ss = append(ss, s)
	}
	a, b, w := ss[0], ss[1], ss[2]
	ev, err := NewEvent(d, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ev.Destroy() })
	require.NoError(t, a.Launch("work", func() error { return nil }))
	require.NoError(t, a.Record(ev))

	rerecorded := false
	d.beforeWait = func() {
		if !ev.mu.TryLock() {
			return // Wait holds the event: no record can slip in
		}
		ev.mu.Unlock()
		rerecorded = true
		done := make(chan error, 1)
		go func() { done <- b.Record(ev) }()
		require.NoError(t, <-done)
	}
	require.NoError(t, w.Wait(ev))
	if rerecorded {
		require.False(t, w.OrderedAfter(a, a.Position()),
			"the driver waited for the record on b, but w's clock says it runs after a's work")
	}
	require.False(t, rerecorded, "a record of the event slipped in between Wait's reading it and the driver's")
	require.True(t, w.OrderedAfter(a, a.Position()))
}
