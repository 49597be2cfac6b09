package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mooncake = "../../serving/testdata/requests/mooncake_synthetic_trace.jsonl"

// TestRun: a small matrix (8 requests a trace, one model) prints its
// header, one row for each trace and budget, and the totals.
func TestRun(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-mooncake", mooncake, "-requests", "8", "-models", "llama3-8b"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Empty(t, errOut.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Contains(t, lines[0], "kvtargets: 8 requests a trace (seed 1)")
	require.Contains(t, lines[2], "preempt cache/paged")
	for i, trace := range []string{"mooncake", "mooncake", "shared-prefix", "shared-prefix", "bursts", "bursts", "squeeze", "squeeze", "parallel-sampling", "parallel-sampling"} {
		require.True(t, strings.HasPrefix(lines[3+i], trace+" "), lines[3+i])
		require.Contains(t, lines[3+i], "llama3-8b")
	}
	require.Contains(t, lines[len(lines)-1], "10 cells in ")
}

// TestRunHeaders: -admit-ahead=false, -warm step and -wait-for-none each
// say in the header how the cells ran, and run them.
func TestRunHeaders(t *testing.T) {
	for _, tc := range []struct {
		flag, says string
	}{
		{"-admit-ahead=false", "both schemes scheduled each step after the last"},
		{"-warm=step", "warmed before serving with a step's tokens (-warm step)"},
		{"-wait-for-none", "no step waits for exposed driver time (-wait-for-none)"},
	} {
		var out, errOut bytes.Buffer
		code := run([]string{"-mooncake", mooncake, "-requests", "8", "-models", "llama3-8b", "-traces", "mooncake", tc.flag}, &out, &errOut)
		require.Equal(t, 0, code, errOut.String())
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Contains(t, lines[0], tc.says, tc.flag)
		require.Contains(t, lines[len(lines)-1], "2 cells in ", tc.flag)
	}
}

// TestRunRefuses: flags it cannot use exit 2, saying why.
func TestRunRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-prices", "b200"}, "-prices b200: want a100 or h100"},
		{[]string{"-requests", "0"}, "-requests 0: want at least 1"},
		{[]string{"-traces", "azure"}, `-traces: no trace "azure", want mooncake or shared-prefix, bursts, squeeze, parallel-sampling`},
		{[]string{"-models", "gpt2"}, `-models: serving: no model preset "gpt2"`},
		{[]string{"-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"-admit-ahead=maybe"}, `invalid boolean value "maybe" for -admit-ahead`},
		{[]string{"-warm", "half"}, "-warm half: want budget or step"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"-mooncake", mooncake}, tc.args...), &out, &errOut)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Contains(t, errOut.String(), tc.says, "%v", tc.args)
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 1, run([]string{"-mooncake", filepath.Join(t.TempDir(), "absent.jsonl")}, &out, &errOut))
	require.Contains(t, errOut.String(), "absent.jsonl")
}
