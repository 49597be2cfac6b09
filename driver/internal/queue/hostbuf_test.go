package queue

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestHostBuffers: whole live buffers only come back once; Busy while any
// is live; Close hands back the live ones and takes no more.
func TestHostBuffers(t *testing.T) {
	var h HostBuffers
	a, b := make([]byte, 64), make([]byte, 128)
	require.True(t, h.Add(a))
	require.True(t, h.Add(b))
	require.True(t, errors.Is(h.Busy("test"), driver.ErrBusy))
	require.True(t, errors.Is(h.Remove("test", a[:32]), driver.ErrInvalid), "part of a buffer")
	require.True(t, errors.Is(h.Remove("test", make([]byte, 64)), driver.ErrInvalid), "a buffer never added")
	require.NoError(t, h.Remove("test", a))
	require.True(t, errors.Is(h.Remove("test", a), driver.ErrInvalid), "freed twice")
	live := h.Close()
	require.Len(t, live, 1)
	require.Equal(t, &b[0], &live[0][0])
	require.Len(t, live[0], 128)
	require.NoError(t, h.Busy("test"))
	require.False(t, h.Add(a), "closed")
	require.True(t, errors.Is(h.Remove("test", b), driver.ErrClosed))
}
