package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/budget"
)

// TestTopAndBudgetSet: vmarena top --json lists a book's members as
// they are; budget set changes a member's floor and ceiling; bad
// arguments are usage errors and a refused change leaves the books as
// they were.
func TestTopAndBudgetSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "book")
	b, err := budget.Open(path, budget.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer b.Close()
	m, err := b.Join("prefill", 64<<20, 512<<20, nil)
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Acquire(100<<20))

	members := func() []budget.Info {
		t.Helper()
		code, out, errOut := runCmd(t, "top", "--book", path, "--json")
		require.Equal(t, 0, code, errOut)
		var doc struct {
			Book     string        `json:"book"`
			Capacity uint64        `json:"capacity_bytes"`
			Members  []budget.Info `json:"members"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
		require.Equal(t, uint64(1<<30), doc.Capacity)
		return doc.Members
	}
	in := members()
	require.Len(t, in, 1)
	require.Equal(t, "prefill", in[0].Name)
	require.Equal(t, uint64(100<<20), in[0].Committed)
	require.Equal(t, uint64(64<<20), in[0].Floor)

	code, out, errOut := runCmd(t, "top", "--book", path, "--count", "1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "prefill")

	code, out, errOut = runCmd(t, "budget", "set", "--book", path, "--member", "prefill", "--floor", "128MiB")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "prefill: floor 128 MiB, ceiling 512 MiB")
	require.Equal(t, uint64(128<<20), members()[0].Floor)

	before := members()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"budget", "set", "--book", path, "--member", "decode", "--floor", "1MiB"}, 1, `no member named "decode"`},
		{[]string{"budget", "set", "--book", path, "--member", "prefill", "--floor", "lots"}, 2, `--floor "lots"`},
		{[]string{"budget", "set", "--book", filepath.Join(t.TempDir(), "none"), "--member", "prefill", "--ceiling", "-1"}, 2, `--ceiling "-1"`},
		{[]string{"budget", "set", "--book", path, "--member", "prefill", "--floor", "600MiB"}, 1, "budget"},
		{[]string{"budget", "set", "--book", path, "--member", "prefill"}, 2, "nothing to set"},
		{[]string{"budget", "set", "--member", "prefill", "--floor", "1MiB"}, 2, "no book given"},
		{[]string{"budget", "set", "--book", path, "--floor", "1MiB"}, 2, "no member given"},
		{[]string{"budget"}, 2, "no subcommand"},
		{[]string{"budget", "grow"}, 2, `unknown subcommand "grow"`},
		{[]string{"budget", "simulate", "--steps", "0"}, 2, "--steps 0"},
		{[]string{"budget", "simulate", "--floor", "65"}, 2, "--floor 65"},
		{[]string{"budget", "simulate", "--floors", "0,x"}, 2, `"x" is not`},
		{[]string{"budget", "simulate", "--kinds", "cache"}, 2, "want two kinds"},
		{[]string{"budget", "simulate", "--kinds", "cache,paged"}, 2, `"paged" is neither cache nor hybrid`},
		{[]string{"top"}, 2, "no book given"},
		{[]string{"top", "--book", path, "--interval", "0s"}, 2, "not positive"},
		{[]string{"top", "--book", path, "--count", "-1"}, 2, "negative"},
		{[]string{"top", "--book", path, "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"top", "--book", filepath.Join(t.TempDir(), "none"), "--json"}, 1, "budget"},
	} {
		code, out, errOut := runCmd(t, c.args...)
		require.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.says, "%v", c.args)
		if c.code == 2 {
			require.Empty(t, out, "%v", c.args)
		}
	}
	require.Equal(t, before, members(), "refused changes change nothing")
}

// TestBudgetSimulate: the simulation runs both configurations in one
// run, its servers this test binary re-executed; neither over-commits
// and the elastic budget serves at least as many as the static halves;
// the servers are kvcache.Cache members, or a Cache and a Hybrid
// (--kinds cache,hybrid), which never preempt to give back. (The figure
// itself is the CLI's: vmarena budget simulate.)
func TestBudgetSimulate(t *testing.T) {
	for _, kinds := range []string{"cache,cache", "cache,hybrid"} {
		t.Run(kinds, func(t *testing.T) { checkBudgetSimulate(t, kinds) })
	}
}

func checkBudgetSimulate(t *testing.T, kinds string) {
	code, out, errOut := runCmd(t, "budget", "simulate", "--steps", "300", "--kinds", kinds, "--json")
	require.Equal(t, 0, code, errOut)
	var doc simDocument
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, strings.Split(kinds, ","), doc.Config.Kinds)
	require.Zero(t, doc.Static.OverCommits)
	require.Zero(t, doc.Elastic.OverCommits)
	require.Equal(t, doc.Static.Arrived, doc.Elastic.Arrived, "the same trace")
	require.GreaterOrEqual(t, doc.Elastic.Served, doc.Static.Served)
	require.LessOrEqual(t, doc.Elastic.PeakPages, doc.Config.Pages)
	for _, r := range []simResult{doc.Static, doc.Elastic} {
		for _, s := range r.Servers {
			require.Zero(t, s.Preemptions, "a give-back never preempts")
			require.LessOrEqual(t, s.PeakPages, doc.Config.Pages)
		}
	}
	require.Len(t, doc.Floors, 3)
	for _, f := range doc.Floors {
		require.Zero(t, f.OverCommits, "floor %d", f.Floor)
	}
	// One server of both traces on the whole device, the bound, where the
	// kinds are the same: the same arrivals, and the elastic budget's
	// served within 2% of it (the give-backs' steps, and the two servers'
	// queues apart where it has one).
	if kinds == "cache,hybrid" {
		require.Nil(t, doc.Pooled)
	} else {
		require.NotNil(t, doc.Pooled)
		require.Equal(t, doc.Elastic.Arrived, doc.Pooled.Arrived)
		require.Len(t, doc.Pooled.Servers, 1)
		require.Zero(t, doc.Pooled.OverCommits)
		require.InDelta(t, 1, doc.PooledRatio, 0.02)
		require.InDelta(t, float64(doc.Pooled.Served)/float64(doc.Static.Served), doc.BoundRatio, 1e-9)
	}
	t.Logf("served static %d, elastic %d of %d (ratio %.2f)", doc.Static.Served, doc.Elastic.Served, doc.Elastic.Arrived, doc.ServedRatio)
}

// refusingWriter fails every write, as /dev/full does, and fails the test
// once it has been asked for more than most writes: a command that goes
// on writing into output that cannot be written never ends by itself.
type refusingWriter struct {
	t      *testing.T
	most   int
	writes int
}

func (w *refusingWriter) Write([]byte) (int, error) {
	w.writes++
	if w.writes > w.most {
		w.t.Fatalf("still writing after %d failed writes", w.most)
	}
	return 0, syscall.ENOSPC
}

// TestTopOutputThatCannotBeWritten: vmarena top, redrawing until
// interrupted, stops at the first redraw it cannot write and exits 1
// saying so, rather than redrawing into the failing output for ever.
func TestTopOutputThatCannotBeWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "book")
	b, err := budget.Open(path, budget.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer b.Close()
	for _, args := range [][]string{
		{"top", "--book", path, "--interval", "1ms"},
		{"top", "--book", path, "--interval", "1ms", "--count", "1000"},
	} {
		var errOut strings.Builder
		w := &refusingWriter{t: t, most: 100}
		code := run(args, w, &errOut)
		require.Equal(t, 1, code, "%v", args)
		require.Equal(t, 1, w.writes, "%v: the writes tried", args)
		require.Contains(t, errOut.String(), "vmarena top: ", "%v", args)
		require.Contains(t, errOut.String(), "no space left on device", "%v", args)
	}
}
