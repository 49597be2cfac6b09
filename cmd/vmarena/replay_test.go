package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const traceDir = "../../testdata/alloc-traces"

func runReplay(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"replay"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// flatten joins a table's padded columns with single spaces.
func flatten(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// TestReplay runs the command on the three real traces in one table and
// checks the rows it promises. The targets' verdicts are printed, not
// asserted: only that each is one of met / not met / n/a.
func TestReplay(t *testing.T) {
	code, out, errOut := runReplay(t,
		"--trace", filepath.Join(traceDir, "cs336_kkaitlyn111_memory_ctx128_fullstep.csv"),
		"--trace", filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv"),
		"-trace="+filepath.Join(traceDir, "cs336_MAGMA27_memory_snapshot.csv"))
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	flat := flatten(out)
	for _, want := range []string{
		"sim driver, one device of 80 GiB, granularity 2 MiB, allocator policy default, stitching on",
		"trace cs336_kkaitlyn111_memory_ctx128_fullstep select_n_snapshot_v1f2f548 cs336_MAGMA27_memory_snapshot",
		"\nevents 19342 4496 5163\n",
		"\nallocs / frees replayed 6771 / 5894 1497 / 1493 1721 / 1719\n",
		"\nfrees of unknown alloc_id (skipped) 0 0 2\n",
		"\npeak allocated (trace) 38.35 GiB 1018.85 MiB 11.99 GiB\n",
		"\nreserved / allocated (PyTorch) 1.150 1.333 —\n",
		"\ntrace segment events 783 13 0\n",
	} {
		require.Contains(t, flat, want)
	}
	for _, label := range []string{"peak committed (vmarena)", "committed / allocated (vmarena)", "peak reserved (PyTorch)",
		"map calls", "unmap calls", "stitches", "grows"} {
		require.Regexp(t, `(?m)^`+regexp.QuoteMeta(label)+` \S.*\S$`, flat)
	}
	require.Regexp(t, `(?m)^target: ratio ≤ 1\.02 at 2 MiB( (met|not met|n/a)){3}$`, flat)
	require.Regexp(t, `(?m)^target: map calls ≤ segment events( (met|not met|n/a)){2} n/a$`, flat,
		"a trace with no segment events has nothing to compare map calls with")
}

func TestReplayFlags(t *testing.T) {
	small := filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv")

	code, out, errOut := runReplay(t, "--trace", small, "--granularity", "64KiB", "--capacity", "4g", "--no-stitch")
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "one device of 4 GiB, granularity 64 KiB, allocator policy default, stitching off")
	require.Contains(t, flat, "\nstitches 0\n")
	require.Contains(t, flat, "\ntarget: ratio ≤ 1.02 at 2 MiB n/a\n", "the ratio target is stated for 2 MiB")

	code, out, _ = runReplay(t, "-h")
	require.Equal(t, 0, code)
	require.Empty(t, out)

	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "no trace given"},
		{[]string{"--granularity", "2MiB"}, "no trace given"},
		{[]string{small}, `unexpected argument "` + small + `"`},
		{[]string{"--trace", small, "extra"}, `unexpected argument "extra"`},
		{[]string{"--trace"}, "flag needs an argument: -trace"},
		{[]string{"--trace", ""}, "empty file name"},
		{[]string{"--trace", small, "--granularity", "two"}, `invalid value "two" for flag -granularity`},
		{[]string{"--trace", small, "--capacity", "-1GiB"}, `invalid value "-1GiB" for flag -capacity`},
		{[]string{"--trace", small, "--capacity", "0"}, `"0" is zero`},
		{[]string{"--trace", small, "--bogus"}, "flag provided but not defined: -bogus"},
	} {
		code, out, errOut := runReplay(t, tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
		require.Contains(t, errOut, tc.says, "%v", tc.args)
		require.Contains(t, errOut, "usage: vmarena replay", "%v", tc.args)
	}
}

// TestReplayFailures: a trace that cannot be read or replayed exits 1 with
// the file and, for a malformed one, the line in the message, and prints no
// table.
func TestReplayFailures(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	header := "seq,device,op,size,addr,alloc_id,stream,time_us,device_free\n"
	good := write("good.csv", header+"0,0,alloc,512,0,0,0,,\n")
	for _, tc := range []struct {
		name string
		args []string
		says []string
	}{
		{"missing file", []string{"--trace", filepath.Join(dir, "absent.csv")}, []string{"absent.csv", "no such file"}},
		{"malformed file", []string{"--trace", good, "--trace", write("bad.csv", header+"0,0,alloc,512,0,0,0,,\n1,0,alloc,x,0,1,0,,\n")},
			[]string{"bad.csv: trace: line 3: column size: \"x\" is not an integer"}},
		{"no header", []string{"--trace", write("nohdr.csv", "0,0,alloc,512,0,0,0,,\n")}, []string{"nohdr.csv: trace: line 1: header"}},
		{"empty file", []string{"--trace", write("empty.csv", "")}, []string{"empty.csv: trace: empty input"}},
		{"out of memory", []string{"--capacity", "2MiB", "--trace", write("big.csv", header+"5,0,alloc,4194304,0,0,0,,\n")},
			[]string{"big.csv: trace: replay: line 2 (seq 5): alloc of 4 MiB", "out of memory"}},
		{"capacity not a multiple of the granularity", []string{"--capacity", "3MiB", "--trace", good}, []string{"good.csv", "3145728"}},
		{"granularity not a power of two", []string{"--granularity", "3MiB", "--trace", good}, []string{"good.csv", "not a power of two"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runReplay(t, tc.args...)
			require.Equal(t, 1, code)
			require.Empty(t, out)
			require.True(t, strings.HasPrefix(errOut, "vmarena replay: "), errOut)
			for _, s := range tc.says {
				require.Contains(t, errOut, s)
			}
		})
	}
}
