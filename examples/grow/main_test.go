package main

import (
	"bytes"
	"io"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun grows to 20,000 rows and checks the output says what the example
// claims: a line per decade for both sides, a base that never moved, no
// row copied by the arena while append moved its slice, and row 0 intact.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, io.Discard, 20000))
	s := out.String()
	t.Log("\n" + s)

	line := regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+(\d+)\s+[\d.e+-]+\s+\S+\s+\S+$`)
	var checkpoints []int
	for _, m := range line.FindAllStringSubmatch(s, -1) {
		n, _ := strconv.Atoi(m[1])
		checkpoints = append(checkpoints, n)
		for _, f := range m[2:4] {
			ns, _ := strconv.Atoi(f)
			require.Positive(t, ns, "a step takes time: %s", m[0])
		}
	}
	require.Equal(t, []int{1, 10, 100, 1000, 10000, 20000}, checkpoints)

	base := regexp.MustCompile(`moved nothing: its base stayed at (0x[0-9a-f]+) for all 20000 steps`).FindStringSubmatch(s)
	require.NotNil(t, base, s)
	require.Contains(t, s, "Row 0, through the tensor the first step returned, still reads its values at "+base[1]+"; row 19999 reads 19999.")
	require.Regexp(t, `The arena mapped 10 chunks \(20 MiB committed\)`, s)
	moves := regexp.MustCompile(`append moved the slice (\d+) times, copying ([\d.]+) MiB`).FindStringSubmatch(s)
	require.NotNil(t, moves, s)
	n, _ := strconv.Atoi(moves[1])
	require.Greater(t, n, 10, "append outgrows its capacity many times on the way to 20,000 rows")
	require.Regexp(t, `Total: arena \S+, append \S+ \(append/arena [\d.]+\)`, s)
}

// TestFlags: a flag the example cannot use is one line on stderr (no
// stack, no doubled "grow: grow:" prefix) and exit status 2; -h is the
// usage and status 0 (-rows 0 included: an error line, not a stack dump).
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-rows", "0"}, "grow: -rows 0: at least 1 row is needed\n"},
		{[]string{"-rows", "-5"}, "grow: -rows -5: at least 1 row is needed\n"},
		{[]string{"-rows", "99999999999999999"}, "grow: -rows 99999999999999999: 99999999999999999 rows of 1 KiB do not fit in the address space\n"},
		{[]string{"extra"}, "grow: unexpected argument \"extra\"; the only flag is -rows N\n"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, realMain(c.args, &stdout, &stderr), "%v", c.args)
		require.Equal(t, c.want, stderr.String())
		require.Empty(t, stdout.String())
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, realMain([]string{"-rows", "x"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), `invalid value "x" for flag -rows`)
	require.Equal(t, 0, realMain([]string{"-h"}, &stdout, &stderr))
}

// TestRunSmall: a run through realMain prints the memory it needs first.
func TestRunSmall(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, realMain([]string{"-rows", "100"}, &stdout, &stderr), stderr.String())
	require.Regexp(t, `^This run needs about [\d.]+ MiB of memory: 0.1 MiB committed in the arena, and up to about 0.4 MiB on the Go heap for append.\n`, stdout.String())
	require.Empty(t, stderr.String())
}
