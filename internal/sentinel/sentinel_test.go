package sentinel

import (
	"context"
	stderrors "errors"
	"io/fs"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
)

var errThing = errors.New("thing failed")

// TestMarkSeenByBothIs: the standard library's errors.Is and internal/errors'
// find the sentinel and the marked error's own causes, through further
// wraps, and the message is the marked error's.
func TestMarkSeenByBothIs(t *testing.T) {
	inner := errors.Wrapf(syscall.ENOMEM, "mmap of %d bytes", 4096)
	err := errors.Wrap(Mark(inner, errThing), "outer")
	require.Equal(t, "outer: mmap of 4096 bytes: cannot allocate memory", err.Error())
	for name, is := range map[string]func(error, error) bool{"std": stderrors.Is, "internal/errors": errors.Is} {
		require.True(t, is(err, errThing), name)
		require.True(t, is(err, syscall.ENOMEM), name)
		require.False(t, is(err, context.DeadlineExceeded), name)
		require.False(t, is(err, fs.ErrNotExist), name)
	}
	var errno syscall.Errno
	require.True(t, stderrors.As(err, &errno))
	require.Equal(t, syscall.ENOMEM, errno)
	require.True(t, errors.As(err, &errno))

	require.NoError(t, Mark(nil, errThing))
	require.Same(t, inner, Mark(inner, nil))
}
