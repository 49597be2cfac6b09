package vmarena_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// TestFirstRefusalsSayWhatToDo: the refusals a newcomer meets first, on
// the path Open makes, say what is in use and (as a hint) what to do, and
// change nothing.
func TestFirstRefusalsSayWhatToDo(t *testing.T) {
	m, err := vmarena.Open(vmarena.Options{Capacity: 64 * vmarena.MiB, Max: 32 * vmarena.MiB})
	require.NoError(t, err)
	al := m.Allocator()
	x, err := tensor.Empty(al, tensor.Float32, 4, 4)
	require.NoError(t, err)
	require.NoError(t, x.Set(1.5, 3, 3))
	a, err := m.NewArena(16 * vmarena.MiB)
	require.NoError(t, err)
	v, err := a.Append(vmarena.MiB, 0)
	require.NoError(t, err)
	c, err := m.NewKVCache(small)
	require.NoError(t, err)
	s, err := c.Admit([]int{1, 2}, 0)
	require.NoError(t, err)
	require.NoError(t, s.Free())

	p, err := al.Alloc(vmarena.KiB, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(p))

	live := func() uint64 { return al.Stats().Allocated }
	before := live()
	for _, tc := range []struct {
		name      string
		call      func() error
		sentinel  error
		msg, hint string
	}{
		{"free of a tensor's memory", func() error { return al.Free(x.Addr()) }, driver.ErrBusy,
			"the allocation is owned by its holder (a tensor?)", "release the tensor (or the Owned handle) instead"},
		{"free twice", func() error { return al.Free(p) }, driver.ErrNotAllocated,
			"that memory is free (freed twice?)", "free each allocation once"},
		{"close of an allocator with live allocations", al.Close, driver.ErrBusy,
			"1 allocation(s) still live, 64 B in all", "free every allocation (release the tensors that hold theirs)"},
		{"close of a driver with live mappings", m.Driver().Close, driver.ErrBusy,
			"host: close: 2 mapping(s) still live", "release them and close the tables, arenas, allocators and pools that map it first"},
		{"shrink under a view", func() error { return a.Shrink(vmarena.MiB) }, driver.ErrBusy,
			"arena: shrink to 0 B: the live", "release the views of the memory being given up first"},
		{"free of a sequence twice", s.Free, driver.ErrClosed,
			"kvcache: free a sequence: the sequence was freed", "drop it (a second Free has nothing to do), or Admit a new one"},
		{"an allocation past the allocator's maximum", func() error { _, err := al.Alloc(33*vmarena.MiB, 0); return err }, driver.ErrOutOfMemory,
			"larger than the allocator's maximum 32 MiB", "create the allocator with a larger Max"},
		{"close of the Memory while in use", m.Close, driver.ErrBusy,
			"vmarena: close an arena", "call Close again once what holds them is released"},
	} {
		err := tc.call()
		drivertest.RequireIs(t, err, tc.sentinel, tc.msg)
		require.Contains(t, hint(err), tc.hint, tc.name)
		// Nothing changed: the tensor, the view and the allocator still work.
		require.Equal(t, before, live(), tc.name)
		got, err := x.At(3, 3)
		require.NoError(t, err, tc.name)
		require.Equal(t, 1.5, got)
		b, err := v.Bytes()
		require.NoError(t, err, tc.name)
		b[0] = 1
		require.Equal(t, vmarena.MiB, a.Len())
	}
	require.NoError(t, x.Release())
	require.NoError(t, v.Release())
	require.NoError(t, m.Close())
}

// TestHintsOfPlainErrors: an error without hints, and no error, have none.
func TestHintsOfPlainErrors(t *testing.T) {
	require.Nil(t, vmarena.Hints(nil))
	require.Nil(t, vmarena.Hints(vmarena.ErrInvalid))
}
