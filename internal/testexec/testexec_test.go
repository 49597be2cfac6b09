package testexec_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/testexec"
)

// fakeT has a deadline, as a *testing.T under go test -timeout.
type fakeT struct {
	end time.Time
	ok  bool
}

func (f fakeT) Deadline() (time.Time, bool) { return f.end, f.ok }

func TestContext(t *testing.T) {
	end := time.Now().Add(time.Hour)
	ctx, cancel := testexec.Context(fakeT{end, true})
	defer cancel()
	d, ok := ctx.Deadline()
	require.True(t, ok)
	require.True(t, d.Before(end), "the command ends before go test's -timeout")
	require.True(t, d.After(end.Add(-10*time.Minute)), "a twentieth of the hour left, not more")

	for _, tb := range []any{fakeT{}, &testing.B{}, nil} {
		ctx, cancel := testexec.Context(tb)
		_, ok := ctx.Deadline()
		require.False(t, ok, "no deadline without go test's -timeout: %T", tb)
		cancel()
		require.Error(t, ctx.Err())
	}
}
