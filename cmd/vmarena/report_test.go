package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/cmd/vmarena/internal/browsertest"
	"github.com/vmarena/vmarena/cmd/vmarena/internal/report/reporttest"
)

// printedTable is the table a command printed after its header: each
// line's cells, split where the columns were padded.
func printedTable(t *testing.T, out string) [][]string {
	t.Helper()
	_, tbl, ok := strings.Cut(out, "\n\n")
	require.True(t, ok, "a header, a blank line, the table:\n%s", out)
	tbl, _ = cutLargest(tbl) // what follows the table: the largest allocations at each peak
	var rows [][]string
	// A table too wide for a terminal is printed a column at a time: a
	// block per column, each with the labels, joined here again.
	for b, block := range strings.Split(strings.TrimRight(tbl, "\n"), "\n\n") {
		for i, l := range strings.Split(block, "\n") {
			cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
			if b == 0 {
				rows = append(rows, cells)
				continue
			}
			require.Less(t, i, len(rows), "block %d is longer than the first", b)
			require.Equal(t, rows[i][0], cells[0], "block %d's labels are the first's", b)
			rows[i] = append(rows[i], cells[1:]...)
		}
	}
	return rows
}

// cell is the printed table's cell in the row labelled label, column col
// (1 is the first after the labels).
func cell(t *testing.T, table [][]string, label string, col int) string {
	t.Helper()
	for _, r := range table {
		if r[0] == label {
			return r[col]
		}
	}
	require.Failf(t, "no such row", "%q", label)
	return ""
}

// unitOf is the unit of a formatted size: "MiB" of "18.00 MiB".
func unitOf(size string) string {
	_, u, _ := strings.Cut(size, " ")
	return u
}

// TestReplayReport replays the hand-written two-device trace and
// silmont2000 with --report and reads the page as a reader would: the
// printed header and table, cell for cell; a section per column whose
// note gives the table's peaks; a chart of memory over the events with
// the allocated, committed and (both traces having segment events)
// reserved lines, its memory axis in the unit of the column's peak; a
// memory map at the peak, its caption giving the table's peak allocated.
// Then Chromium loads it (where installed): no console message, a
// screenshot with something on it.
func TestReplayReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "replay.html")
	code, stdout, errOut := runReplay(t,
		"--trace", filepath.Join(traceDir, "handmade_two_devices.csv"),
		"--trace", filepath.Join(traceDir, "silmont2000_mem_snapshot.csv"),
		"--report", out)
	require.Equal(t, 0, code, errOut)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	page := reporttest.Read(t, data)
	require.Equal(t, "vmarena replay", page.Title)
	header, _, _ := strings.Cut(stdout, "\n")
	require.Equal(t, header, page.Intro[0])

	printed := printedTable(t, stdout)
	figures := page.Section(t, "Figures")
	require.Len(t, figures.Tables, 1)
	require.Equal(t, printed, append([][]string{figures.Tables[0].Header}, figures.Tables[0].Rows...), "the report's table is the printed one")

	labels := printed[0][1:]
	require.Equal(t, []string{"handmade_two_devices [dev 0]", "handmade_two_devices [dev 1]", "silmont2000_mem_snapshot"}, labels)
	// The driver calls priced, PyTorch's beside vmarena's, and their target.
	require.Equal(t, "948.67 µs", cell(t, printed, "modelled driver time on A100 (PyTorch)", 2))
	require.Regexp(t, `^[0-9.]+ (s|ms|µs)$`, cell(t, printed, "modelled driver time on H100 (vmarena)", 3))
	require.Equal(t, "n/a", cell(t, printed, "target: modelled driver time ≤ PyTorch's", 1), "mid-run")
	for i, label := range labels {
		s := page.Section(t, label)
		allocated := cell(t, printed, "peak allocated (trace)", i+1)
		committed := cell(t, printed, "peak committed (vmarena)", i+1)
		reserved := cell(t, printed, "peak reserved (PyTorch)", i+1)
		require.Equal(t, []string{cell(t, printed, "events", i+1) + " events; peak allocated (trace) " + allocated +
			", peak committed (vmarena) " + committed + ", peak reserved (PyTorch) " + reserved + "."}, s.Notes)
		require.Len(t, s.Charts, 2)
		line, mm := s.Charts[0], s.Charts[1]
		require.Equal(t, "memory over the events: "+label, line.Label)
		for _, text := range []string{"memory over the events: " + label, "event",
			"allocated (trace)", "committed (vmarena)"} {
			require.True(t, line.Has(text), "%s: the chart draws %q: %q", label, text, line.Texts)
		}
		// PyTorch's reserved line is left out for a trace that starts
		// mid-run: its sum leaves out what was reserved before recording.
		if mid := cell(t, printed, "starts mid-run", i+1); mid != "no" {
			require.False(t, line.Has("reserved (PyTorch)"), "%s starts mid-run: %q", label, line.Texts)
			require.Equal(t, "The trace starts mid-run ("+mid+"): PyTorch's reserved memory is not drawn.", line.Caption)
		} else {
			require.True(t, line.Has("reserved (PyTorch)"), "%s: %q", label, line.Texts)
			require.True(t, line.Has("memory ("+unitOf(reserved)+")"), "%s: %q", label, line.Texts)
		}
		// The largest allocations live at the peak, as printed under the
		// table (the report shows up to ten).
		require.Len(t, s.Tables, 1)
		largest := s.Tables[0]
		require.True(t, strings.HasPrefix(largest.Caption, "largest allocations live at the peak: "+label+" — "+allocated+" allocated at line "), largest.Caption)
		require.Contains(t, stdout, "\n"+strings.TrimSuffix(largest.Caption, "; times from the device's first event")+"\n")
		require.Equal(t, []string{"size", "alloc_id", "allocated at", "time", "before the peak"}, largest.Header)
		require.NotEmpty(t, largest.Rows)
		require.LessOrEqual(t, len(largest.Rows), 10)
		require.Equal(t, "memory map at the peak: "+label, mm.Label)
		for _, text := range []string{"allocated", "free (committed)", "stitched", "not committed"} {
			require.True(t, mm.Has(text), "%s: the map's legend names %q: %q", label, text, mm.Texts)
		}
		require.Regexp(t, `^after event \d+ \(line \d+\): allocated `+regexp.QuoteMeta(allocated)+`, committed `, mm.Caption)
		var ranges []string
		for _, text := range mm.Texts {
			if strings.Contains(text, "requests, ") || strings.HasPrefix(text, "stitch range, ") {
				ranges = append(ranges, text)
			}
		}
		require.NotEmpty(t, ranges, "%s: the map names its ranges and what each holds", label)
	}
	browsertest.Load(t, out)
}

// TestKVReport serves the first 12 requests of the Azure conversation
// trace with --report and reads the page: the printed header lines and
// table, cell for cell; the three charts over simulated time, each with a
// line per scheme named as the table names it, KV memory in the unit of
// the largest peak committed. Then Chromium loads it (where installed).
func TestKVReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "kv.html")
	code, stdout, errOut := runKV(t, "simulate", "--trace", filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv"),
		"--model", "llama3-8b", "--memory", "4GiB", "--limit", "12", "--report", out)
	require.Equal(t, 0, code, errOut)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	page := reporttest.Read(t, data)
	require.Equal(t, "vmarena kv simulate", page.Title)
	header, _, _ := strings.Cut(stdout, "\n\n")
	require.Equal(t, strings.Split(header, "\n"), page.Intro)

	printed := printedTable(t, stdout)
	figures := page.Section(t, "Figures")
	require.Equal(t, printed, append([][]string{figures.Tables[0].Header}, figures.Tables[0].Rows...), "the report's table is the printed one")
	schemes := printed[0][1:]
	require.Equal(t, []string{"this cache (token-major)", "paged (vLLM)", "static"}, schemes)

	over := page.Section(t, "Over time")
	require.Len(t, over.Charts, 3)
	// Each scheme's line is drawn wider than the next's, over it, so
	// that one the next coincides with still shows: 3 charts, each line
	// and its legend's sample.
	for _, w := range []string{`4\.4`, `3`, `1\.6`} {
		require.Len(t, regexp.MustCompile(`stroke-width="`+w+`"`).FindAll(data, -1), 6, w)
	}
	unit := unitOf(cell(t, printed, "KV in use by running sequences, peak", 3)) // static holds most
	for i, want := range []struct{ title, y string }{
		{"sequences running", "sequences"},
		{"KV memory in use by running sequences", "KV memory (" + unit + ")"},
		{"KV waste: memory in use holding no token", "KV waste ("},
	} {
		c := over.Charts[i]
		require.Equal(t, want.title, c.Label)
		require.True(t, c.Has("simulated time (s)"), "%q", c.Texts)
		found := false
		for _, text := range c.Texts {
			found = found || strings.HasPrefix(text, want.y)
		}
		require.True(t, found, "%s: the y axis %q: %q", want.title, want.y, c.Texts)
		for _, s := range schemes {
			require.True(t, c.Has(s), "%s: a line for %s: %q", want.title, s, c.Texts)
		}
	}
	browsertest.Load(t, out)
}

// TestReportUsage: a --report that cannot be written is a usage error
// (exit status 2) saying why, before anything runs, and leaves no file
// behind; so is a --report with no file.
func TestReportUsage(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(traceDir, "handmade_two_devices.csv")
	for _, tc := range []struct {
		report, says string
	}{
		{filepath.Join(dir, "no", "such", "out.html"), "vmarena replay: --report " + filepath.Join(dir, "no", "such", "out.html") + ": there is no directory " + filepath.Join(dir, "no", "such") + " to write it in\n"},
		{dir, "vmarena replay: --report " + dir + ": a directory, want a file\n"},
	} {
		code, stdout, errOut := runReplay(t, "--trace", trace, "--report", tc.report)
		require.Equal(t, 2, code)
		require.Empty(t, stdout)
		require.True(t, strings.HasPrefix(errOut, tc.says), errOut)
		require.Contains(t, errOut, "\nrun 'vmarena replay --help' for usage\n")
	}
	code, _, errOut := runReplay(t, "--trace", trace, "--report")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "flag needs an argument: -report")

	code, _, errOut = runKV(t, "simulate", "--trace", filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv"), "--model", "llama3-8b",
		"--report", filepath.Join(dir, "no", "kv.html"))
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(errOut, "vmarena kv simulate: --report "+filepath.Join(dir, "no", "kv.html")+": there is no directory"), errOut)

	// Checked and removed again: a run that fails writes no report, and
	// leaves nothing in the directory.
	out := filepath.Join(dir, "out.html")
	code, _, _ = runReplay(t, "--trace", filepath.Join(dir, "missing.csv"), "--report", out)
	require.Equal(t, 1, code)
	require.NoFileExists(t, out)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, ents)
}
