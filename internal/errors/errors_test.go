package errors

import (
	stderrors "errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

var errSentinel = New("sentinel")

func TestMessages(t *testing.T) {
	require.Equal(t, "sentinel", errSentinel.Error())
	require.Equal(t, "a 3: sentinel", Wrapf(errSentinel, "a %d", 3).Error())
	require.Equal(t, "outer: a: sentinel", Wrap(Wrap(errSentinel, "a"), "outer").Error())
	require.Equal(t, "sentinel", Wrap(errSentinel, "").Error())
	require.Equal(t, "x 7", Newf("x %d", 7).Error())
	require.Equal(t, "broken 1", AssertionFailedf("broken %d", 1).Error())
	err := WithHint(WithDetailf(Wrap(errSentinel, "ctx"), "d %d", 1), "h")
	require.Equal(t, "ctx: sentinel", err.Error(), "hints and details leave the message alone")
	require.Equal(t, "ctx: sentinel", fmt.Sprintf("%v", err))
	require.Equal(t, "ctx: sentinel", fmt.Sprintf("%s", err))
	require.Equal(t, `"ctx: sentinel"`, fmt.Sprintf("%q", err))
	require.Equal(t, "what: sentinel", NewAssertionErrorWithWrappedErrf(errSentinel, "what").Error())
	require.Equal(t, "sentinel", Handled(errSentinel).Error())
}

func TestNil(t *testing.T) {
	require.NoError(t, Wrap(nil, "x"))
	require.NoError(t, Wrapf(nil, "x %d", 1))
	require.NoError(t, WithHint(nil, "x"))
	require.NoError(t, WithHintf(nil, "x"))
	require.NoError(t, WithDetailf(nil, "x"))
	require.NoError(t, WithAssertionFailure(nil))
	require.NoError(t, Handled(nil))
	require.NoError(t, WithSecondaryError(nil, errSentinel))
	require.NoError(t, CombineErrors(nil, nil))
	require.NoError(t, Mark(nil, errSentinel))
	require.Same(t, errSentinel, CombineErrors(nil, errSentinel))
	require.Same(t, errSentinel, CombineErrors(errSentinel, nil))
	require.Same(t, errSentinel, WithSecondaryError(errSentinel, nil))
	require.False(t, HasAssertionFailure(nil))
	require.Empty(t, GetAllHints(nil))
	require.Nil(t, UnwrapAll(nil))
}

func TestIsAndAs(t *testing.T) {
	other := New("other")
	err := WithHint(Wrapf(Wrap(syscall.ENOMEM, "mmap"), "grow"), "h")
	for name, is := range map[string]func(error, error) bool{"std": stderrors.Is, "here": Is} {
		require.True(t, is(err, syscall.ENOMEM), name)
		require.False(t, is(err, fs.ErrNotExist), name)
		combined := CombineErrors(Wrap(errSentinel, "first"), Wrap(other, "second"))
		require.True(t, is(combined, errSentinel), name)
		require.False(t, is(combined, other), "%s: a secondary error is not a cause", name)
		require.False(t, is(Handled(errSentinel), errSentinel), "%s: a handled error is not a cause", name)
		require.False(t, is(NewAssertionErrorWithWrappedErrf(errSentinel, "x"), errSentinel), name)
		require.True(t, is(Mark(Wrap(other, "m"), errSentinel), errSentinel), name)
		require.True(t, is(Mark(Wrap(other, "m"), errSentinel), other), name)
	}
	require.False(t, Is(New("sentinel"), errSentinel), "two errors of one message are two errors")
	require.True(t, IsAny(err, fs.ErrNotExist, syscall.ENOMEM))
	require.False(t, IsAny(err))
	var errno syscall.Errno
	require.True(t, As(err, &errno))
	require.Equal(t, syscall.ENOMEM, errno)
	require.Equal(t, syscall.ENOMEM, UnwrapAll(err))
	joined := Join(Wrap(errSentinel, "a"), other)
	require.True(t, Is(joined, other))
}

func TestAssertions(t *testing.T) {
	require.True(t, HasAssertionFailure(AssertionFailedf("x")))
	require.True(t, HasAssertionFailure(Wrap(WithAssertionFailure(errSentinel), "y")))
	require.True(t, Is(WithAssertionFailure(errSentinel), errSentinel))
	require.True(t, IsAssertionFailure(Wrap(AssertionFailedf("x"), "y")))
	require.False(t, HasAssertionFailure(Wrap(errSentinel, "y")))
	require.True(t, HasAssertionFailure(Join(errSentinel, AssertionFailedf("x"))))
	require.True(t, HasAssertionFailure(NewAssertionErrorWithWrappedErrf(errSentinel, "x")))
}

func TestHintsAndDetails(t *testing.T) {
	err := WithHint(Wrap(WithHintf(WithDetailf(errSentinel, "inner %d", 1), "first %s", "h"), "ctx"), "second")
	err = WithHint(err, "first h")
	require.Equal(t, []string{"first h", "second"}, GetAllHints(err), "innermost first, each once")
	require.Equal(t, "first h\n--\nsecond", FlattenHints(err))
	require.Equal(t, "inner 1", FlattenDetails(err))
	require.Empty(t, FlattenHints(errSentinel))
}

func TestVerbose(t *testing.T) {
	rollback := WithHint(Wrap(New("rollback failed"), "undo"), "inner hint")
	err := CombineErrors(WithHint(Wrap(errSentinel, "do"), "try less"), rollback)
	v := fmt.Sprintf("%+v", err)
	require.Contains(t, v, "do: sentinel")
	require.Contains(t, v, "hint: try less")
	require.Contains(t, v, "secondary error: undo: rollback failed")
	require.Contains(t, v, "inner hint")
	h := fmt.Sprintf("%+v", Handled(Wrap(errSentinel, "gone")))
	require.Contains(t, h, "handled error: gone: sentinel")
	require.Contains(t, fmt.Sprintf("%+v", AssertionFailedf("broke")), "assertion failure")
	require.Equal(t, 5, Safe(5))
	require.Equal(t, "s {A:1 B:2}", fmt.Sprintf("s %+v", Safe(struct{ A, B int }{1, 2})))
}

func BenchmarkWrapf(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = Wrapf(errSentinel, "op %d", i)
	}
}
