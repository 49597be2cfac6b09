package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun grows to 20,000 rows and checks the output says what the example
// claims: a line per decade for both sides, a base that never moved, no
// row copied by the arena while append moved its slice, and row 0 intact.
func TestRun(t *testing.T) {
	old := *rows
	*rows = 20000
	t.Cleanup(func() { *rows = old })
	var out bytes.Buffer
	require.NoError(t, run(&out))
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

func TestRunRefusesNoRows(t *testing.T) {
	old := *rows
	*rows = 0
	t.Cleanup(func() { *rows = old })
	require.ErrorContains(t, run(&bytes.Buffer{}), "at least 1")
}
