package bench

import (
	"context"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/replay"
)

// Replay budgets: how long a timed replay runs before it is stopped. The
// bundled traces and the synthetic workload replay in under a second at
// either granularity; the budget is the guard for a trace or a change
// that makes one run away (a replay at 64 KiB of the synthetic workload
// whose cost grew with what is live would run for hours). A replay is stopped between events
// (replay.Options.Deadline), so the event in flight at the budget
// finishes first, and then what it made is freed and closed. The budget
// is a lower bound of the time the whole replay takes: a replay stopped
// at a budget above its target misses the target.
const (
	// TraceBudget is for a bundled trace at 64 KiB (target 5 s).
	TraceBudget = 2 * time.Minute
	// SyntheticBudget is for the synthetic workload (targets 2 s at
	// 2 MiB, 20 s at 64 KiB).
	SyntheticBudget = time.Minute
)

// Timed is one replay timed by the wall clock.
type Timed struct {
	// Result is the replay's result; Finished says it replayed every
	// event, and the figures in Result are whole. A replay stopped at its
	// budget has Result.Events alone.
	Result   replay.Result
	Finished bool
	// Wall is the time the call took: the whole replay, or, for one
	// stopped, to the end of the event in flight at the budget and the
	// freeing and closing after it.
	Wall time.Duration
	// Bound is the time the whole replay takes, or at least takes: Wall
	// when it finished, the budget when it was stopped.
	Bound time.Duration
}

// TimedReplay replays events with opts on the sim driver, stopping the
// replay when budget has passed (0: never). Any error but the budget's is
// returned.
func TimedReplay(events []replay.Event, opts replay.Options, budget time.Duration) (Timed, error) {
	start := time.Now()
	if budget > 0 {
		opts.Deadline = start.Add(budget)
	}
	res, err := replay.Replay(events, opts)
	t := Timed{Result: res, Wall: time.Since(start), Finished: err == nil}
	t.Bound = t.Wall
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return t, err
	}
	if !t.Finished {
		t.Bound = budget
	}
	return t, nil
}
