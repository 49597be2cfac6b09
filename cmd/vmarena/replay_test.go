package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/race"
)

const traceDir = "../../testdata/alloc-traces"

func runReplay(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"replay"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// flatten joins a table's padded columns with single spaces, and a table
// printed a column at a time (a block per column, too wide for a
// terminal side by side) back into one.
func flatten(s string) string {
	lines := strings.Split(unwrapBlocks(s), "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// unwrapBlocks joins the blocks after out's header back into one table
// when there are several and each has the first's row labels (the labels
// end at two spaces); anything else it leaves as it is.
// What follows the table (the largest allocations at each peak) is kept
// as it is, after it.
func unwrapBlocks(out string) string {
	out, rest := cutLargest(out)
	parts := strings.Split(strings.TrimSuffix(out, "\n"), "\n\n")
	if len(parts) < 3 {
		return out + rest
	}
	split := regexp.MustCompile(`^(.*?\S)\s{2,}(\S.*)$`)
	var labels, rows []string
	for b, block := range parts[1:] {
		for i, l := range strings.Split(block, "\n") {
			m := split.FindStringSubmatch(l)
			switch {
			case m == nil:
				return out + rest
			case b == 0:
				labels, rows = append(labels, m[1]), append(rows, l)
			case i >= len(labels) || labels[i] != m[1]:
				return out + rest
			default:
				rows[i] += "  " + m[2]
			}
		}
	}
	return parts[0] + "\n\n" + strings.Join(rows, "\n") + "\n" + rest
}

// cutLargest splits the replay's output before the largest allocations at
// each peak, which follow its table after a blank line.
func cutLargest(out string) (table, rest string) {
	if i := strings.Index(out, "\n\nlargest allocations live at the peak"); i >= 0 {
		return out[:i+1], out[i+1:]
	}
	return out, ""
}

// TestReplay runs the command on the small real traces and the
// hand-written two-device trace in one table and checks the rows it
// promises: one column per device of each trace. The hand-written trace's
// figures are the ones replay's TestReplayHandmade works out; the real
// traces' verdicts are printed, not asserted: only that each is one of met
// / not met / n/a.
func TestReplay(t *testing.T) {
	code, out, errOut := runReplay(t,
		"--trace", filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv"),
		"--trace", filepath.Join(traceDir, "handmade_two_devices.csv"),
		"-trace="+filepath.Join(traceDir, "cs336_MAGMA27_memory_snapshot.csv"))
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	flat := flatten(out)
	for _, want := range []string{
		"sim driver, one 80 GiB device per trace device, granularity 2 MiB, allocator policy default, stitching on, slack live/256, driver calls priced by A100 (kvcached benchmarks/bench_vmm)",
		"\ntrace select_n_snapshot_v1f2f548 handmade_two_devices [dev 0] handmade_two_devices [dev 1] cs336_MAGMA27_memory_snapshot\n",
		"\nevents 4496 17 14 5163\n",
		"\nallocs / frees replayed 1497 / 1493 4 / 3 4 / 2 1721 / 1719\n",
		"\nfrees of unknown alloc_id (skipped) 0 1 0 2\n",
		"\nstarts mid-run no 1 free of an allocation made before recording no 2 frees of allocations made before recording\n",
		"\nfrees disagreeing with their alloc (addr or size) 0 1 0 0\n",
		"\nPyTorch out of memory at (vmarena) none line 20 (seq 18): not served line 19 (seq 17): served none\n",
		"\npeak allocated (trace) 1018.85 MiB 16.00 MiB 30.00 MiB 11.99 GiB\n",
		"\nreserved / allocated (PyTorch) 1.333 n/a 1.200 n/a\n",
		"\npeak reserved (PyTorch) 1.33 GiB 32.00 MiB 36.00 MiB unknown\n",
		"\nsegment events (PyTorch) 13 4 5 0\n",
		// PyTorch's calls, from the segment events alone (replay's
		// TestSummarySegmentCalls), priced by the A100 table.
		"\ndriver calls (PyTorch, modelled): create / map / set access / unmap / release 72 / 72 / 13 / 0 / 0 3 / 3 / 3 / 1 / 1 4 / 4 / 4 / 1 / 1 unknown\n",
		"\nmodelled driver time on A100 (PyTorch) 14.49 ms 717.91 µs 948.67 µs unknown\n",
		"\nmodelled driver time on H100 (PyTorch) 1.90 ms 194.70 µs 246.72 µs unknown\n",
	} {
		require.Contains(t, flat, want)
	}
	// The hand-written trace's columns, as worked out in replay's test.
	for _, want := range []string{
		"peak committed \\(vmarena\\) \\S+ \\S+ 18\\.00 MiB 32\\.00 MiB \\S+ \\S+",
		"committed / allocated \\(vmarena\\) \\S+ 1\\.1250 1\\.0667 \\S+",
		"map events \\(vmarena\\) \\d+ 5 6 \\d+",
		"unmap events \\(vmarena\\) \\d+ 1 3 \\d+",
		"map \\+ unmap events \\(vmarena\\) \\d+ 6 9 \\d+",
		"chunk maps \\(driver calls\\) \\d+ 7 11 \\d+",
		"chunk unmaps \\(driver calls\\) \\d+ 1 3 \\d+",
		"decommit calls \\d+ 0 2 \\d+",
		"decommitted \\S+ \\S+ 0 B 18\\.00 MiB \\S+ \\S+",
		"stitches \\d+ 0 0 \\d+",
		"grows \\(commits\\) \\d+ 4 4 \\d+",
		"OOM retries \\d+ 0 0 \\d+",
		"target: committed / allocated ≤ 1\\.01 at 2 MiB (met|not met) not met not met (met|not met)",
		"target: map \\+ unmap events ≤ segment events (met|not met) n/a not met n/a",
		"driver calls \\(vmarena\\): create / map / set access / unmap / release" + strings.Repeat(` \d+ / \d+ / \d+ / \d+ / \d+`, 4),
		"address reserves / frees \\(vmarena, all the trace's devices\\) 3 / 0 6 / 0 6 / 0 3 / 0",
		"modelled driver time on A100 \\(vmarena\\)" + strings.Repeat(` [0-9.]+ (s|ms|µs)`, 4),
		"modelled driver time on H100 \\(vmarena\\)" + strings.Repeat(` [0-9.]+ (s|ms|µs)`, 4),
		"modelled driver time on A100, vmarena ÷ PyTorch [0-9.]+ n/a \\(mid-run\\) [0-9.]+ unknown",
		"modelled driver time on H100, vmarena ÷ PyTorch [0-9.]+ n/a \\(mid-run\\) [0-9.]+ unknown",
		"target: modelled driver time ≤ PyTorch's (met|not met) n/a (met|not met) n/a",
	} {
		require.Regexp(t, `(?m)^`+want+`$`, flat)
	}
}

// TestReplayDirectory: a directory stands for the .csv files in it, in name
// order, beside files given one by one.
func TestReplayDirectory(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"silmont2000_mem_snapshot.csv", "handmade_two_devices.csv"} {
		b, err := os.ReadFile(filepath.Join(traceDir, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a trace"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub.csv"), 0o755))
	code, out, errOut := runReplay(t, "--trace", dir, "--trace", filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv"))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "\ntrace handmade_two_devices [dev 0] handmade_two_devices [dev 1] silmont2000_mem_snapshot select_n_snapshot_v1f2f548\n")
	require.Contains(t, flatten(out), "\nevents 17 14 97 4496\n")

	code, out, errOut = runReplay(t, "--trace", filepath.Join(dir, "sub.csv"))
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "sub.csv: a directory with no .csv or .pickle file in it")
}

func TestReplayFlags(t *testing.T) {
	small := filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv")

	code, out, errOut := runReplay(t, "--trace", small, "--granularity", "64KiB", "--capacity", "4g", "--no-stitch", "--policy", "ascend")
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "one 4 GiB device per trace device, granularity 64 KiB, allocator policy ascend, stitching off, slack live/256")
	require.Contains(t, flat, "\nstitches 0\n")
	require.Contains(t, flat, "\ntarget: committed / allocated ≤ 1.01 at 2 MiB n/a\n", "the ratio target is stated for 2 MiB")

	code, out, errOut = runReplay(t, "--trace", small, "--slack-divisor", "64")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "stitching on, slack live/64")

	code, out, _ = runReplay(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: vmarena replay")

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
		{[]string{"--trace", small, "--policy", "best-fit"}, `invalid value "best-fit" for flag -policy: replay: unknown allocator policy "best-fit"`},
		{[]string{"--trace", small, "--slack-divisor", "0"}, "--slack-divisor 0: give a divisor of at least 1"},
		{[]string{"--trace", small, "--slack-divisor", "-3"}, `invalid value "-3" for flag -slack-divisor`},
		// Sizes the sim driver or the allocator cannot use are usage errors
		// that say what would be valid (they were exit 1 with a driver
		// message).
		{[]string{"--trace", small, "--capacity", "3MiB"},
			"vmarena replay: --capacity 3 MiB: want a multiple of the granularity 2 MiB from 2 MiB to 1 TiB, such as 80GiB\n"},
		{[]string{"--trace", small, "--capacity", "2TiB"}, "--capacity 2 TiB: want a multiple of the granularity 2 MiB from 2 MiB to 1 TiB"},
		{[]string{"--trace", small, "--capacity", "1MiB"}, "--capacity 1 MiB: want a multiple of the granularity 2 MiB"},
		{[]string{"--trace", small, "--granularity", "3MiB"},
			"vmarena replay: --granularity 3 MiB: want a power of two from 4 KiB to 1 GiB, such as 64KiB or 2MiB\n"},
		{[]string{"--trace", small, "--granularity", "1KiB"}, "--granularity 1 KiB: want a power of two from 4 KiB to 1 GiB"},
		{[]string{"--trace", small, "--granularity", "2GiB"}, "--granularity 2 GiB: want a power of two from 4 KiB to 1 GiB"},
	} {
		code, out, errOut := runReplay(t, tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
		require.Contains(t, errOut, tc.says, "%v", tc.args)
		require.Contains(t, errOut, "\nrun 'vmarena replay --help' for usage\n", "%v", tc.args)
	}
}

// TestReplayFailures: a trace that cannot be read or replayed exits 1 with
// the file and, for a malformed one, the line in the message. The run
// stops there, and the table shows what was replayed before (nothing
// when no trace was): the traces before it, and the failed one up to its
// last event.
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
		name  string
		args  []string
		says  []string
		table string // the table's first row, flattened; empty: no table
	}{
		{"missing file", []string{"--trace", filepath.Join(dir, "absent.csv")}, []string{"absent.csv", "no such file"}, ""},
		{"malformed file", []string{"--trace", good, "--trace", write("bad.csv", header+"0,0,alloc,512,0,0,0,,\n1,0,alloc,x,0,1,0,,\n"), "--trace", good},
			[]string{"bad.csv: replay: line 3: column size: \"x\" is not an integer"}, "trace good"},
		{"no header", []string{"--trace", write("nohdr.csv", "0,0,alloc,512,0,0,0,,\n")}, []string{"nohdr.csv: replay: line 1: header"}, ""},
		{"empty file", []string{"--trace", write("empty.csv", "")}, []string{"empty.csv: replay: empty input"}, ""},
		{"a device", []string{"--trace", "/dev/zero"}, []string{"/dev/zero: replay: trace: /dev/zero is a character device, not a regular file"}, ""},
		{"a header alone", []string{"--trace", write("header.csv", header)},
			[]string{"header.csv: the trace holds no events, nothing to replay: a CSV trace needs rows after its header"}, ""},
		{"out of memory", []string{"--capacity", "2MiB", "--trace", good, "--trace", write("big.csv", header+"4,0,alloc,1024,0,0,0,,\n5,0,alloc,4194304,0,1,0,,\n6,0,alloc,512,0,2,0,,\n")},
			[]string{"big.csv: replay: line 3 (seq 5), device 0: alloc of 4 MiB", "out of memory"},
			"trace good big (stopped after 1 of 3 events)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runReplay(t, tc.args...)
			require.Equal(t, 1, code)
			require.True(t, strings.HasPrefix(errOut, "vmarena replay: "), errOut)
			for _, s := range tc.says {
				require.Contains(t, errOut, s)
			}
			if tc.table == "" {
				require.Empty(t, out)
				return
			}
			require.Contains(t, flatten(out), "\n"+tc.table+"\n")
		})
	}
	t.Run("the report of a failed run", func(t *testing.T) {
		report := filepath.Join(dir, "failed.html")
		code, out, errOut := runReplay(t, "--capacity", "2MiB", "--report", report, "--trace",
			write("fails.csv", header+"0,0,alloc,1024,0,0,0,,\n1,0,alloc,4194304,0,1,0,,\n"))
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "fails.csv: replay: line 3 (seq 1)")
		require.Contains(t, flatten(out), "\ntrace fails (stopped after 1 of 2 events)\n")
		require.Contains(t, flatten(out), "\nallocs / frees replayed 1 / 0\n")
		page, err := os.ReadFile(report)
		require.NoError(t, err)
		require.Contains(t, string(page), "fails (stopped after 1 of 2 events)")
	})
}

// TestReplayPickles: each PyTorch snapshot pickle prints the same table
// as the CSV made from it, column for column, and a directory's pickles
// are replayed beside its CSVs. The largest (22,332 events, replayed twice
// with the allocator checked every 1,000) is left out under the race
// detector, where it takes seconds and can find nothing: replay's
// TestSnapshotEqualsCSV shows its events are the CSV's, event for event.
func TestReplayPickles(t *testing.T) {
	for _, name := range []string{"silmont2000_mem_snapshot", "select_n_snapshot_v1f2f548", "wedsonlin_medium_512_training"} {
		t.Run(name, func(t *testing.T) {
			if race.Enabled && name == "wedsonlin_medium_512_training" {
				t.Skip("one goroutine's long replay: run without -race")
			}
			code, out, errOut := runReplay(t, "--trace", filepath.Join(traceDir, name+".csv"), "--trace", filepath.Join(traceDir, "pickles", name+".pickle"))
			require.Equal(t, 0, code, errOut)
			table := printedTable(t, out)
			require.Equal(t, []string{"trace", name, name}, table[0])
			for _, row := range table {
				require.Len(t, row, 3, "%q", row)
				require.Equal(t, row[1], row[2], "row %q: the pickle's figures are the CSV's", row[0])
			}
			// The largest allocations at the peak, printed twice alike.
			_, after, ok := strings.Cut(out, "\nlargest allocations live at the peak: "+name)
			require.True(t, ok, out)
			first, second, ok := strings.Cut(after, "\nlargest allocations live at the peak: "+name)
			require.True(t, ok, out)
			require.Equal(t, first, second)
		})
	}
	dir := t.TempDir()
	for _, f := range []string{"silmont2000_mem_snapshot.csv", "pickles/silmont2000_mem_snapshot.pickle"} {
		b, err := os.ReadFile(filepath.Join(traceDir, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	code, out, errOut := runReplay(t, "--trace", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "\ntrace silmont2000_mem_snapshot silmont2000_mem_snapshot\n")
}

// TestReplaySynthetic replays the random-lifetimes workload, alone and
// beside a trace: a column of its own named with its seed, PyTorch's side
// modelled (its segment events those of internal/cachingmodel, priced as
// a trace's), the same figures for the same seed, others for another;
// its flags' bad values are usage errors.
func TestReplaySynthetic(t *testing.T) {
	code, out, errOut := runReplay(t, "--synthetic", "random-lifetimes", "--seed", "3", "--events", "150")
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "\ntrace random-lifetimes (seed 3, PyTorch modelled)\n")
	require.Contains(t, flat, "\nevents 211\n", "150 events and the model's 61 segments")
	require.Contains(t, flat, "\nallocs / frees replayed 150 / 0\n")
	require.Contains(t, flat, "\nstarts mid-run no\n")
	require.Contains(t, flat, "\nsegment events (PyTorch) 61\n")
	require.Contains(t, flat, "\nreserved / allocated (PyTorch) 1.002\n")
	require.Contains(t, flat, "\ndriver calls (PyTorch, modelled): create / map / set access / unmap / release 1512 / 1512 / 61 / 0 / 0\n")
	require.Regexp(t, `(?m)^modelled driver time on H100, vmarena ÷ PyTorch \d+\.\d+$`, flat)
	require.Regexp(t, `(?m)^target: modelled driver time ≤ PyTorch's (met|not met)$`, flat)
	require.Regexp(t, `(?m)^driver calls \(vmarena\): create / map / set access / unmap / release [1-9]\d* / [1-9]\d* / [1-9]\d* / \d+ / \d+$`, flat)

	code, js, errOut := runReplay(t, "--synthetic", "random-lifetimes", "--seed", "3", "--events", "150", "--json")
	require.Equal(t, 0, code, errOut)
	var doc ReplayJSON
	require.NoError(t, json.Unmarshal([]byte(js), &doc))
	require.Len(t, doc.Devices, 1)
	require.True(t, doc.Devices[0].PyTorchModelled)
	require.Equal(t, 61, doc.Devices[0].SegmentEvents)

	_, again, _ := runReplay(t, "--synthetic", "random-lifetimes", "--seed", "3", "--events", "150")
	require.Equal(t, out, again, "the same seed, the same table")
	_, other, _ := runReplay(t, "--synthetic", "random-lifetimes", "--seed", "4", "--events", "150")
	require.NotEqual(t, flatten(other)[strings.Index(flatten(other), "\npeak allocated"):], flat[strings.Index(flat, "\npeak allocated"):])

	small := filepath.Join(traceDir, "silmont2000_mem_snapshot.csv")
	code, out, errOut = runReplay(t, "--trace", small, "--synthetic", "random-lifetimes", "--events", "50")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "\ntrace silmont2000_mem_snapshot random-lifetimes (seed 1, PyTorch modelled)\n")
	require.Contains(t, flatten(out), "\nevents 97 69\n")

	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--synthetic", "random"}, `--synthetic "random": unknown workload, want random-lifetimes`},
		{[]string{"--synthetic", ""}, "no trace given (--trace FILE|DIR, or --synthetic WORKLOAD)"},
		{[]string{"--trace", small, "--seed", "2"}, "--seed is for --synthetic, and no synthetic workload is given"},
		{[]string{"--trace", small, "--events", "20"}, "--events is for --synthetic"},
		{[]string{"--trace", small, "--seed", "2", "--events", "20"}, "--seed and --events are for --synthetic"},
		{[]string{"--synthetic", "random-lifetimes", "--seed", "-1"}, `invalid value "-1" for flag -seed`},
		{[]string{"--synthetic", "random-lifetimes", "--seed", "x"}, `invalid value "x" for flag -seed`},
		{[]string{"--synthetic", "random-lifetimes", "--events", "0"}, "--events 0: want 1 to 16777216"},
		{[]string{"--synthetic", "random-lifetimes", "--events", "-4"}, "--events -4: want 1 to 16777216"},
		{[]string{"--synthetic", "random-lifetimes", "--events", "16777217"}, "--events 16777217: want 1 to 16777216"},
		{[]string{"--synthetic", "random-lifetimes", "--events", "many"}, `invalid value "many" for flag -events`},
	} {
		code, out, errOut := runReplay(t, tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
		require.Contains(t, errOut, tc.says, "%v", tc.args)
		require.Contains(t, errOut, "\nrun 'vmarena replay --help' for usage\n", "%v", tc.args)
	}

	// A workload larger than the devices is a failure that names it; the
	// table shows what was replayed.
	code, out, errOut = runReplay(t, "--synthetic", "random-lifetimes", "--events", "50", "--capacity", "1GiB")
	require.Equal(t, 1, code)
	require.Contains(t, flatten(out), "\ntrace random-lifetimes (seed 1, PyTorch modelled) (stopped after 6 of 69 events)\n")
	require.Contains(t, flatten(out), "\nPyTorch out of memory at (vmarena) line 7 (seq 5): not served\n", "the model's oom, probed")
	require.Contains(t, errOut, "vmarena replay: random-lifetimes (seed 1, PyTorch modelled): replay: line ")
	require.Contains(t, errOut, "out of memory")
}
