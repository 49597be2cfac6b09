package physical

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/mapref"
)

// requireAssertion checks err is an assertion failure naming every
// fragment.
func requireAssertion(t *testing.T, err error, fragments ...string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.HasAssertionFailure(err), "want an assertion failure, got: %v", err)
	for _, f := range fragments {
		require.Contains(t, err.Error(), f)
	}
}

// TestReleasedThroughTheDriver: a chunk released by the caller through the
// driver (Driver.Release of a handle the Memory tracks) is seen by Check,
// which compares the books with the driver's; the chunk's own Release then
// says what happened, wraps driver.ErrBadHandle and lets the chunk go, so
// that Usage agrees with the driver, Check passes, and Close finishes.
// (Before, Check passed over the vanished chunk, Release failed forever
// and left it counted in Used, and Check after Close reported a chunk not
// released.)
func TestReleasedThroughTheDriver(t *testing.T) {
	m, d := newMemory(t)
	gone, err := m.Create(0, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	kept, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Check())

	require.NoError(t, d.Release(gone.Handle()))
	requireAssertion(t, m.Check(), "device 0", "6 MiB in 2 chunk(s)", "only 2 MiB", "behind the memory's back")
	requireAssertion(t, m.Check(), "Chunk.Release")

	err = gone.Release()
	requireIs(t, err, driver.ErrBadHandle, "physical: release", "no longer holds the handle")
	require.True(t, gone.Released())
	require.Equal(t, []*Chunk{kept}, m.Chunks())
	require.Equal(t, d.Used(0), usage(t, m, 0).Used)
	require.Equal(t, 1, usage(t, m, 0).Chunks)
	require.NoError(t, m.Check())
	requireIs(t, gone.Release(), driver.ErrBadHandle, "already released")

	// Mapped when released behind the memory's back: the memory stays
	// until the mapping goes, in both books.
	mapped, err := m.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	at, err := d.Reserve(gran, 0, 0)
	require.NoError(t, err)
	require.NoError(t, mapped.mapWith(mapref.OpFunc(func() error { return d.Map(at, mapped.Handle()) })))
	require.NoError(t, d.Release(mapped.Handle()))
	requireIs(t, mapped.Release(), driver.ErrBadHandle, "no longer holds the handle")
	require.True(t, mapped.Released())
	require.Equal(t, gran, int(usage(t, m, 1).Used))
	require.NoError(t, m.Check())
	require.NoError(t, mapped.unmapWith(mapref.OpFunc(func() error { return d.Unmap(at, gran) })))
	require.NoError(t, d.Unreserve(at, gran))
	require.Zero(t, usage(t, m, 1).Used)
	require.NoError(t, m.Check())

	// Close with a chunk released behind its back: the others are
	// released, the memory is closed, and its books are whole.
	other, err := m.Create(1, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Release(other.Handle()))
	requireIs(t, m.Close(), driver.ErrBadHandle, "physical: close", "no longer holds the handle")
	require.True(t, kept.Released())
	require.True(t, other.Released())
	require.Empty(t, m.Chunks())
	require.NoError(t, m.Check())
	require.NoError(t, d.Check())
}

// TestDriverClosedBehindTheMemory: Check reports the chunks of a driver
// closed behind the memory's back.
func TestDriverClosedBehindTheMemory(t *testing.T) {
	m, d := newMemory(t)
	c, err := m.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Check())
	require.NoError(t, d.Close())
	requireAssertion(t, m.Check(), "device 0", "behind the memory's back")
	requireIs(t, c.Release(), driver.ErrClosed)
	require.False(t, c.Released())
}
