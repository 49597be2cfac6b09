package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// savedOutput is real go test -bench output of a few of the suite's
// benchmarks (where it came from is its first lines).
const savedOutput = "testdata/bench-output.txt"

func parseSaved(t *testing.T) output {
	t.Helper()
	f, err := os.Open(savedOutput)
	require.NoError(t, err)
	defer f.Close()
	out, err := parse(f)
	require.NoError(t, err)
	return out
}

// TestParse reads the saved output: every result line, its name less
// the GOMAXPROCS suffix (a sub-benchmark's own dashes kept), its
// iterations and its value and unit pairs in order, each value with the
// digits go test wrote; and the header's cpu, goos and goarch.
func TestParse(t *testing.T) {
	out := parseSaved(t)
	var names []string
	for _, r := range out.results {
		names = append(names, r.name)
	}
	require.Equal(t, []string{
		"BenchmarkMapAccessUnmap/populate", "BenchmarkMapAccessUnmap/no-populate", "BenchmarkCreateRelease", "BenchmarkReserveFree1TiB",
		"BenchmarkAllocFree/1K", "BenchmarkArenaGrowStep/2_MiB",
		"BenchmarkMigrate1GiB", "BenchmarkPoolAllocFree/1-stream", "BenchmarkPoolAllocFree/4-streams", "BenchmarkPoolReleaseAfterThreshold",
		"BenchmarkReplay/silmont2000_mem_snapshot",
		"BenchmarkReplay/cs336_MAGMA27_memory_snapshot", "BenchmarkReplay64KiB/select_n_snapshot_v1f2f548",
		"BenchmarkReplay64KiB/cs336_MAGMA27_memory_snapshot", "BenchmarkReplay64KiB/silmont2000_mem_snapshot",
		"BenchmarkReplaySynthetic/random-lifetimes/2_MiB",
		"BenchmarkDecodeAttention/llama3-8b/T=4k",
	}, names)
	require.Equal(t, "AMD EPYC", out.cpu)
	require.Equal(t, "linux", out.goos)
	require.Equal(t, "amd64", out.goarch)

	rf := out.results[3]
	require.Equal(t, int64(50), rf.iterations)
	require.Equal(t, []metric{
		{10490, "10490", "bare-ns/op"}, {12024, "12024", "lib-ns/op"}, {1.146, "1.146", "lib/bare"},
		{533, "533", "B/op"}, {3, "3", "allocs/op"},
	}, rf.metrics)
	m, ok := out.results[8].metric("streams/one")
	require.True(t, ok)
	require.Equal(t, metric{2, "2.000", "streams/one"}, m)
	_, ok = out.results[7].metric("streams/one")
	require.False(t, ok, "the one-stream case reports no streams/one")
	m, ok = out.results[10].metric("decommitted-B")
	require.True(t, ok)
	require.Equal(t, 1061158912.0, m.value)
}

// TestParseLines: what is a result line and what is not.
func TestParseLines(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *result
	}{
		{"BenchmarkReserveFree1TiB-2   \t      50\t     10490 bare-ns/op\t         1.146 lib/bare",
			&result{name: "BenchmarkReserveFree1TiB", iterations: 50, metrics: []metric{{10490, "10490", "bare-ns/op"}, {1.146, "1.146", "lib/bare"}}}},
		// GOMAXPROCS 1: no suffix.
		{"BenchmarkGrowTo1GiB \t 1 \t 52.00 speedup",
			&result{name: "BenchmarkGrowTo1GiB", iterations: 1, metrics: []metric{{52, "52.00", "speedup"}}}},
		{"BenchmarkArenaGrowStep/4_GiB-8 3 0 ns/op",
			&result{name: "BenchmarkArenaGrowStep/4_GiB", iterations: 3, metrics: []metric{{0, "0", "ns/op"}}}},
		{"BenchmarkArenaGrowStep/4_GiB-2", nil}, // the name alone, before a benchmark's logs or skip
		{"--- SKIP: BenchmarkArenaGrowStep/4_GiB", nil},
		{"    arena_test.go:33: bench: 4 GiB is more than the host driver holds", nil},
		{"BenchmarkX-2 \t 10 \t 3 ns/op \t 4", nil}, // a value without a unit
		{"BenchmarkX-2 \t ten \t 3 ns/op", nil},
		{"BenchmarkX-2 \t 10 \t three ns/op", nil},
		{"PASS", nil},
		{"ok  \tgithub.com/vmarena/vmarena/bench\t0.473s", nil},
		{"", nil},
	} {
		got, ok := parseResult(tc.line)
		if tc.want == nil {
			require.False(t, ok, "%q", tc.line)
			continue
		}
		require.True(t, ok, "%q", tc.line)
		require.Equal(t, *tc.want, got, "%q", tc.line)
	}
}

// TestEntries: each row of the suite is a line of the report; a row for
// every sub-benchmark is repeated for each the output has (sizes with
// their space back), or stands once, unmeasured, when it has none — a
// where row only for those that report its metric; a measured ratio is
// held to its bound in its direction.
func TestEntries(t *testing.T) {
	es := entries(suite, parseSaved(t))
	// A benchmark may be held to several targets, one a metric.
	byName := map[string]entry{}
	for _, e := range es {
		byName[e.name+" "+e.row.metric] = e
	}
	require.Len(t, byName, len(es), "each benchmark's metric once")
	for _, c := range []struct {
		name, metric, label, verdict, text string
	}{
		{"ReserveFree1TiB", "lib/bare", "reserve + free 1 TiB ÷ bare", "no", "1.146"},
		{"MapAccessUnmap/no-populate", "lib/bare", "map + access + unmap 2 MiB, no populate ÷ bare", "yes", "0.1713"},
		{"AllocFree/1M", "vmarena/go", "Alloc+Free at 1 M live ÷ Go make", "not measured", "—"},
		{"ArenaGrowStep/2_MiB", "lib/bare", "one growth step ÷ its bare calls, 2 MiB", "yes", "1.009"},
		{"Replay/silmont2000_mem_snapshot", "committed/allocated", "replay: committed ÷ allocated, silmont2000_mem_snapshot", "yes", "1.004"},
		{"PoolAllocFree/4-streams", "streams/one", "pool pairs on four streams ÷ on one", "no", "2.000"},
		{"DecodeAttention/llama3-8b/T=4k", "x-contiguous-vs-paged", "decode attention: paged ÷ contiguous, llama3-8b/T=4k", "no", "1.099"}, // ≥ 1.10
		{"SequenceGrowth/…", "x-cache-vs-copying", "sequence growth to 32k: copying ÷ cache", "not measured", "—"},
		{"GrowTo1GiB", "speedup", "growth to 1 GiB: Go append ÷ arena", "not measured", "—"},
		{"Replay/cs336_MAGMA27_memory_snapshot", "committed/allocated", "replay: committed ÷ allocated, cs336_MAGMA27_memory_snapshot", "yes", "1.004"},
		// Neither trace of BenchmarkReplay in the output reports
		// driver/pytorch (MAGMA27 has no segment events; the silmont2000
		// line predates it): the row stands once, unmeasured.
		{"Replay/…", "driver/pytorch", "replay: modelled driver time ÷ PyTorch's", "not measured", "—"},
		{"Replay64KiB/select_n_snapshot_v1f2f548", "replay-s", "replay at 64 KiB: seconds, select_n_snapshot_v1f2f548", "yes", "0.1128"},
		{"Replay64KiB/cs336_MAGMA27_memory_snapshot", "replay-s", "replay at 64 KiB: seconds, cs336_MAGMA27_memory_snapshot", "no", "15.26"},
		{"Replay64KiB/silmont2000_mem_snapshot", "driver/pytorch", "replay at 64 KiB: modelled driver time ÷ PyTorch's, silmont2000_mem_snapshot", "no", "375.7"},
		{"ReplaySynthetic/random-lifetimes/2_MiB", "replay-s", "random-lifetimes replay at 2 MiB: seconds", "no", "3.000"},
		{"ReplaySynthetic/random-lifetimes/2_MiB", "committed/allocated", "random-lifetimes at 2 MiB: committed ÷ allocated", "not measured", "—"},
		{"ReplaySynthetic/random-lifetimes/64_KiB", "replay-s", "random-lifetimes replay at 64 KiB: seconds", "not measured", "—"},
		{"Scale/map-unmap", "largest/smallest", "map + unmap, 10³ to 10⁶ mapped: largest ÷ smallest", "not measured", "—"},
		{"KVAppend/…", "append-128k/1k", "KV Append of one token: 128k ÷ 1k context", "not measured", "—"},
		{"KVDecodeStep/…", "step-32k/1k", "KV decode step of 256 sequences: 32k ÷ 1k context", "not measured", "—"},
		{"KVDecodeStep/…", "step-32k/50us", "KV decode step of 256 sequences at 32k ÷ 50 µs", "not measured", "—"},
	} {
		e, ok := byName[c.name+" "+c.metric]
		require.True(t, ok, c.name)
		require.Equal(t, c.label, e.label, c.name)
		require.Equal(t, c.verdict, e.verdict(), c.name)
		require.Equal(t, c.text, e.measuredText(), c.name)
	}
	require.Len(t, es, 36)
	_, ok := byName["Replay64KiB/cs336_MAGMA27_memory_snapshot driver/pytorch"]
	require.False(t, ok, "a trace without segment events is outside the driver-time target")
	require.Equal(t, "≥ 20", byName["GrowTo1GiB speedup"].row.bound())
	require.Equal(t, "≤ 1.10", byName["ArenaGrowStep/2_MiB lib/bare"].row.bound())
	require.Equal(t, "≤ 1.00", byName["Replay/… driver/pytorch"].row.bound())
	require.Equal(t, "≤ 20", byName["ReplaySynthetic/random-lifetimes/64_KiB replay-s"].row.bound())
	require.Equal(t, "≤ 1.00", byName["KVDecodeStep/… step-32k/50us"].row.bound())
}

// TestRender: the markdown has the commands, a line for each entry with
// its figures and verdict, the count met and the chart's link; the SVG
// is well-formed XML whose text has each measured entry's label and
// figure, and the title saying the scale.
func TestRender(t *testing.T) {
	out := parseSaved(t)
	es := entries(suite, out)

	var md bytes.Buffer
	src := source{intro: "The commands:", commands: []string{"go test ./bench -bench X", "go test ./bench -bench Y"}}
	require.NoError(t, writeMarkdown(&md, src, out, es, []string{"`go test ./bench -bench X`: exit status 1"}, chartFile))
	s := md.String()
	require.Contains(t, s, "from a run on AMD EPYC, linux/amd64.")
	require.Contains(t, s, "\nThe commands:\n\n    go test ./bench -bench X\n    go test ./bench -bench Y\n\n")
	require.Contains(t, s, "| path | benchmark | metric | measured | target | met? |\n")
	for _, e := range es {
		require.Contains(t, s, "| "+e.label+" | `"+e.name+"` | `"+e.row.metric+"` | "+e.measuredText()+" | "+e.row.bound()+" ("+e.row.source+") | "+e.verdict()+" |\n")
	}
	require.Contains(t, s, "\n6 of 36 targets met (21 not measured).\n")
	require.Contains(t, s, "\nFailed: `go test ./bench -bench X`: exit status 1\n")
	require.True(t, strings.HasSuffix(s, "\n![benchmark ratios against targets](benchmarks.svg)\n"), s)

	var svg bytes.Buffer
	require.NoError(t, writeChart(&svg, es))
	texts := svgText(t, svg.Bytes())
	require.Contains(t, texts, chartTitle)
	require.Contains(t, chartTitle, "log scale")
	shown := 0
	for _, e := range es {
		if !e.measured {
			require.NotContains(t, texts, e.label)
			continue
		}
		shown++
		require.Contains(t, texts, e.label)
		require.Contains(t, texts, e.measuredText()+"  ("+e.row.bound()+")")
	}
	require.Equal(t, 15, shown)

	require.Error(t, writeChart(io.Discard, es[2:3]), "AllocFree/1M alone: nothing measured")
}

// svgText checks that b is well-formed XML and returns the text of its
// <text> elements.
func svgText(t *testing.T, b []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	in := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch tok := tok.(type) {
		case xml.StartElement:
			in = tok.Name.Local == "text"
		case xml.CharData:
			if in {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			in = false
		}
	}
	require.NotEmpty(t, texts)
	return texts
}

// TestSuiteIsTheDocs: every command the report runs is one
// docs/benchmarks.md lists, as it writes it.
func TestSuiteIsTheDocs(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "benchmarks.md"))
	require.NoError(t, err)
	var listed []string
	for _, line := range strings.Split(string(page), "\n") {
		if cmd, ok := strings.CutPrefix(line, "    go test ./bench "); ok {
			cmd, _, _ = strings.Cut(cmd, " #")
			listed = append(listed, "go test ./bench "+strings.TrimSpace(cmd))
		}
	}
	require.NotEmpty(t, listed)
	for _, c := range suite {
		require.Contains(t, listed, c.String())
	}
}

// TestSelected: -bench-filter keeps the rows whose benchmark it matches,
// level by level as go test does, and the commands left with one; it
// refuses one that matches none.
func TestSelected(t *testing.T) {
	rowsOf := func(cmds []command) (names []string) {
		for _, c := range cmds {
			for _, r := range c.rows {
				names = append(names, c.bench+" "+r.bench+"/"+r.sub)
			}
		}
		return names
	}
	for _, c := range []struct {
		filter string
		want   []string
	}{
		{"ReserveFree", []string{"MapAccess|CreateRelease|ReserveFree BenchmarkReserveFree1TiB/"}},
		{"AllocFree/1K", []string{"Arena|GrowTo|^BenchmarkAllocFree$ BenchmarkAllocFree/1K"}},
		{"AllocFree", []string{"Arena|GrowTo|^BenchmarkAllocFree$ BenchmarkAllocFree/1M", "Arena|GrowTo|^BenchmarkAllocFree$ BenchmarkAllocFree/1K",
			"Pool BenchmarkPoolAllocFree/4-streams"}},
		{"ArenaGrowStep/^64", []string{"Arena|GrowTo|^BenchmarkAllocFree$ BenchmarkArenaGrowStep/*"}},
		{"Migrate/anything", []string{"Migrate BenchmarkMigrate1GiB/"}},
	} {
		cmds, err := selected(c.filter)
		require.NoError(t, err, c.filter)
		require.Equal(t, c.want, rowsOf(cmds), c.filter)
	}
	_, err := selected("NoSuchBenchmark")
	require.ErrorContains(t, err, `-bench-filter "NoSuchBenchmark" matches no benchmark the report holds to a target`)
	_, err = selected("(")
	require.Error(t, err)
	cmds, err := selected("")
	require.NoError(t, err)
	require.Equal(t, suite, cmds)
}

// TestFlags: a flag it cannot use is one line and status 2.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "report: no -out DIR: the directory to write the report in\n"},
		{[]string{"-out", t.TempDir(), "extra"}, "report: unexpected argument \"extra\"; the flags are -out DIR [-bench-filter REGEXP] [-benchtime D] [-from FILE] [-v]\n"},
		{[]string{"-out", t.TempDir(), "-from", savedOutput, "-benchtime", "5x"}, "report: -benchtime 5x with -from: a saved output was run with its own\n"},
		{[]string{"-out", t.TempDir(), "-bench-filter", "Nothing"}, "report: -bench-filter \"Nothing\" matches no benchmark"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, realMain(c.args, &stdout, &stderr), "%v", c.args)
		require.True(t, strings.HasPrefix(stderr.String(), c.want), "%v: %s", c.args, stderr.String())
		require.Empty(t, stdout.String())
	}
}

// TestFrom builds the report from the saved output: both files written,
// nothing run, nothing on standard error.
func TestFrom(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, realMain([]string{"-out", dir, "-from", savedOutput}, &stdout, &stderr), stderr.String())
	require.Empty(t, stderr.String())
	require.Equal(t, "report: 6 of 36 targets met; wrote "+filepath.Join(dir, tableFile)+" and "+filepath.Join(dir, chartFile)+"\n", stdout.String())
	md, err := os.ReadFile(filepath.Join(dir, tableFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "| reserve + free 1 TiB ÷ bare | `ReserveFree1TiB` | `lib/bare` | 1.146 | ≤ 1.05 (docs/benchmarks.md) | no |\n")
	require.Contains(t, string(md), "\nFrom the saved output `"+savedOutput+"` of docs/benchmarks.md's commands:\n\n")
	for _, c := range suite {
		require.Contains(t, string(md), "\n    "+c.String()+"\n")
	}
	svg, err := os.ReadFile(filepath.Join(dir, chartFile))
	require.NoError(t, err)
	svgText(t, svg)
	_, err = os.Stat(filepath.Join(dir, outputFile))
	require.True(t, os.IsNotExist(err), "-from keeps no output of its own")
}

// fakeGo puts a stand-in for the go command in goCommand for the test: it
// answers go env GOMOD with the module's go.mod, and any other command by
// recording its arguments (returned: the file it appends them to) and
// printing the saved output's ReserveFree result, or, for -benchtime
// bogus, what go test prints for a bad flag, with exit status 1.
func fakeGo(t *testing.T) (argsFile string) {
	t.Helper()
	mod, err := filepath.Abs("../../go.mod")
	require.NoError(t, err)
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	script := `#!/bin/sh
if [ "$1" = env ]; then echo '` + mod + `'; exit 0; fi
echo "$@" >> '` + argsFile + `'
case "$*" in
*bogus*) printf 'invalid value "bogus" for flag -test.benchtime\nFAIL\tgithub.com/vmarena/vmarena/bench\t0.01s\n'; exit 1 ;;
esac
printf 'goos: linux\ngoarch: amd64\npkg: github.com/vmarena/vmarena/bench\ncpu: AMD EPYC\n'
printf 'BenchmarkReserveFree1TiB-2   \t      50\t     10490 bare-ns/op\t     12024 lib-ns/op\t         1.146 lib/bare\t     533 B/op\t       3 allocs/op\n'
printf 'PASS\nok  \tgithub.com/vmarena/vmarena/bench\t0.5s\n'
`
	goPath := filepath.Join(dir, "go")
	require.NoError(t, os.WriteFile(goPath, []byte(script), 0o755))
	old := goCommand
	goCommand = goPath
	t.Cleanup(func() { goCommand = old })
	return argsFile
}

// TestRunOneBenchmark: the run path, with the go command stood in for
// (fakeGo): the command the filter and benchtime make is the one run, in
// the module's root, and what it prints becomes the saved output, the
// table and the chart. (A real run: go run ./bench/report -out DIR
// -bench-filter ReserveFree -benchtime 50x.)
func TestRunOneBenchmark(t *testing.T) {
	argsFile := fakeGo(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, realMain([]string{"-out", dir, "-bench-filter", "ReserveFree", "-benchtime", "50x"}, &stdout, &stderr), stderr.String())
	require.Empty(t, stderr.String(), "no terminal: no bar")
	require.Contains(t, stdout.String(), " of 1 targets met; wrote ")
	args, err := os.ReadFile(argsFile)
	require.NoError(t, err)
	require.Equal(t, "test ./bench -run ^$ -bench ReserveFree -benchtime 50x\n", string(args), "the one command run")

	raw, err := os.ReadFile(filepath.Join(dir, outputFile))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(raw), "# go test ./bench -run '^$' -bench ReserveFree -benchtime 50x\n"), string(raw))
	out, err := parse(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Len(t, out.results, 1, string(raw))
	require.Equal(t, "BenchmarkReserveFree1TiB", out.results[0].name)
	require.Equal(t, int64(50), out.results[0].iterations)

	md, err := os.ReadFile(filepath.Join(dir, tableFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "The commands it ran (docs/benchmarks.md's, under The commands, with -bench ReserveFree and -benchtime 50x):\n\n"+
		"    go test ./bench -run '^$' -bench ReserveFree -benchtime 50x\n\n")
	require.Contains(t, string(md), "| reserve + free 1 TiB ÷ bare | `ReserveFree1TiB` | `lib/bare` | 1.146 | ≤ 1.05 (docs/benchmarks.md) | no |\n")
	require.NotContains(t, string(md), "MapAccessUnmap", "a row the filter does not run is not in the report")
	svg, err := os.ReadFile(filepath.Join(dir, chartFile))
	require.NoError(t, err)
	require.Contains(t, svgText(t, svg), "reserve + free 1 TiB ÷ bare")
}

// TestRunFailedCommand: a command that fails is named on standard error
// with its last lines and in the report, which is still written; the
// status is 1.
func TestRunFailedCommand(t *testing.T) {
	fakeGo(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, realMain([]string{"-out", dir, "-bench-filter", "ReserveFree", "-benchtime", "bogus"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "report: go test ./bench -run '^$' -bench ReserveFree -benchtime bogus: exit status 1")
	require.Contains(t, stderr.String(), "\nFAIL\tgithub.com/vmarena/vmarena/bench\t")
	require.Contains(t, stderr.String(), "report: 1 of 1 commands failed: ")
	md, err := os.ReadFile(filepath.Join(dir, tableFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "\nFailed: `go test ./bench -run '^$' -bench ReserveFree -benchtime bogus`: exit status ")
	require.Contains(t, string(md), "0 of 1 targets met (1 not measured).")
}

// FuzzParse: any text parses or is refused, never a panic, and builds no
// more results than it has lines.
func FuzzParse(f *testing.F) {
	data, err := os.ReadFile(savedOutput)
	require.NoError(f, err)
	f.Add(string(data[:min(len(data), 4096)]))
	f.Add("BenchmarkX-8   \t 100\t 12.5 ns/op\t 3 B/op\n")
	f.Add("cpu: AMD EPYC\nBenchmarkY\nBenchmarkY-2 1 x\n")
	f.Fuzz(func(t *testing.T, s string) {
		out, err := parse(strings.NewReader(s))
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(out.results), strings.Count(s, "\n")+1)
	})
}

// endless is output that never ends: one result line over and over.
type endless struct{ at int }

func (e *endless) Read(p []byte) (int, error) {
	const line = "BenchmarkX-8   \t 100\t 12.5 ns/op\n"
	for i := range p {
		p[i] = line[e.at%len(line)]
		e.at++
	}
	return len(p), nil
}

// TestParseIsBounded: output past maxOutput bytes — a file that never
// ends, here — is refused with an error naming the bound, and no results
// come back; output just within it parses whole.
func TestParseIsBounded(t *testing.T) {
	defer func(m int64) { maxOutput = m }(maxOutput)
	maxOutput = 1 << 20
	out, err := parse(&endless{})
	require.ErrorContains(t, err, "more than 1048576 bytes of benchmark output")
	require.Empty(t, out.results)
	const line = "BenchmarkX-8   \t 100\t 12.5 ns/op\n"
	n := int(maxOutput) / len(line)
	out, err = parse(strings.NewReader(strings.Repeat(line, n)))
	require.NoError(t, err)
	require.Len(t, out.results, n)
}
