package serving

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// TestStaticByHand: 128 KiB hold two reservations of 64 tokens of 1 KiB;
// a third request is refused until one is given back, and no sequence
// grows past its reservation.
func TestStaticByHand(t *testing.T) {
	const K = units.KiB
	_, err := NewStaticReservation(Config{Model: tinyModel, Budget: 128 * units.KiB, MaxContext: 129, MaxSeqs: 4})
	require.ErrorIs(t, err, driver.ErrInvalid, "Config.Check refuses it")
	s, err := NewStaticReservation(tinyConfig)
	require.NoError(t, err)
	require.Equal(t, 2, s.Slots())
	a, b, c := simReq(0, 40, 30), simReq(1, 10, 5), simReq(2, 10, 5)
	for _, r := range []*SimRequest{a, b} {
		require.True(t, s.CanAdmit(r))
		held, err := s.Admit(r)
		require.NoError(t, err)
		require.Zero(t, held)
	}
	require.NoError(t, s.Append(a, 40))
	require.NoError(t, s.Append(b, 10))
	require.Equal(t, Stats{InUse: 128 * K, Stored: 50 * K, Logical: 50 * K, Commits: 2}, s.Stats())
	require.Equal(t, 78*K, s.Stats().Waste())

	// The refusal: both reservations are taken.
	before := s.String()
	require.False(t, s.CanAdmit(c))
	_, err = s.Admit(c)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.ErrorContains(t, err, "serving: static: admit request 2: all 2 reservations of 64 tokens (64 KiB) are taken")
	require.Equal(t, before, s.String())

	// a fills its reservation, and cannot go past it.
	require.NoError(t, s.Append(a, 24))
	err = s.Append(a, 1)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.ErrorContains(t, err, "append 1 tokens to request 0: 64 held of its reservation of 64")
	require.Equal(t, "static: 2 of 2 reservations of 64 tokens taken, 74 tokens stored", s.String())
	require.NoError(t, s.Check())

	// A request longer than a reservation is never admitted.
	require.False(t, s.CanAdmit(simReq(3, 65, 1)))

	require.NoError(t, s.Finish(a))
	require.True(t, s.CanAdmit(c))
	recompute, err := s.Preempt(b)
	require.NoError(t, err)
	require.True(t, recompute)
	require.Equal(t, Stats{Commits: 2}, s.Stats())
	held, err := s.Resume(b)
	require.NoError(t, err)
	require.Zero(t, held)
	require.Equal(t, Stats{InUse: 64 * K, Commits: 3}, s.Stats())
	require.NoError(t, s.Check())

	// Misuse changes nothing.
	before = s.String()
	for _, tc := range []struct {
		call func() error
		says string
	}{
		{func() error { _, err := s.Admit(b); return err }, "admit request 1: it is running already"},
		{func() error { return s.Append(c, 1) }, "append to request 2: it is not running"},
		{func() error { return s.Append(b, -1) }, "append -1 tokens to request 1"},
		{func() error { return s.Finish(c) }, "finish request 2: it is not running"},
		{func() error { _, err := s.Preempt(c); return err }, "preempt request 2: it is not running"},
		{func() error { return s.Append(nil, 1) }, "append: the request is nil"},
	} {
		err := tc.call()
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
		require.Equal(t, before, s.String())
	}
}
