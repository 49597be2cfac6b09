package isnil

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

type thing struct{}

func (*thing) Read([]byte) (int, error) { return 0, nil }

func TestIs(t *testing.T) {
	var r io.Reader
	require.True(t, Is(nil))
	require.True(t, Is(r))
	r = (*thing)(nil)
	require.True(t, r != nil, "a typed nil in an interface is not == nil")
	require.True(t, Is(r))
	require.True(t, Is((func())(nil)))
	require.True(t, Is(map[int]int(nil)))
	require.False(t, Is(&thing{}))
	require.False(t, Is(0))
	require.False(t, Is(thing{}))
	require.False(t, Is(func() {}))
}
