// Package testexec is for tests that run a command (a go build, a C
// program, a browser): the command runs as long as it needs, bounded by
// go test's -timeout and nothing else. How long a build or a program takes
// on a loaded machine is no failure; a hang is, and go test's -timeout
// reports it.
package testexec

import (
	"context"
	"time"
)

// deadliner is what *testing.T has and testing.TB lacks.
type deadliner interface{ Deadline() (time.Time, bool) }

// Context is the context to run a test's command under: it ends a
// twentieth of the time left before go test's -timeout would (so that the
// command is killed and the test reports its output, instead of the test
// binary panicking with the command still running), and never for a
// benchmark or a run without -timeout. tb is a *testing.T, *testing.B or
// *testing.F.
func Context(tb any) (context.Context, context.CancelFunc) {
	if d, ok := tb.(deadliner); ok {
		if end, ok := d.Deadline(); ok {
			return context.WithDeadline(context.Background(), end.Add(-time.Until(end)/20))
		}
	}
	return context.WithCancel(context.Background())
}
