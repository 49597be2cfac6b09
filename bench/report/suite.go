package main

import (
	"regexp"
	"slices"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"
)

// suite is the benchmark commands of docs/benchmarks.md, in that page's
// order, each with the rows of the report its output fills: the one list
// of what a full run runs and what it is held to.
var suite = []command{
	{bench: "MapAccess|CreateRelease|ReserveFree", benchtime: "3000x", rows: []row{
		{path: "map + access + unmap 2 MiB, no populate ÷ bare", bench: "BenchmarkMapAccessUnmap", sub: "no-populate", metric: "lib/bare", target: 1.05, source: "docs/benchmarks.md"},
		{path: "reserve + free 1 TiB ÷ bare", bench: "BenchmarkReserveFree1TiB", metric: "lib/bare", target: 1.05, source: "docs/benchmarks.md"},
	}},
	{bench: "Arena|GrowTo|^BenchmarkAllocFree$", rows: []row{
		{path: "Alloc+Free at 1 M live ÷ Go make", bench: "BenchmarkAllocFree", sub: "1M", metric: "vmarena/go", target: 0.25, source: "docs/benchmarks.md"},
		{path: "Alloc+Free at 1 K live ÷ Go make", bench: "BenchmarkAllocFree", sub: "1K", metric: "vmarena/go", target: 0.25, source: "docs/benchmarks.md"},
		{path: "one growth step ÷ its bare calls", bench: "BenchmarkArenaGrowStep", sub: anySub, metric: "lib/bare", target: 1.10, source: "docs/benchmarks.md"},
		{path: "growth to 1 GiB: Go append ÷ arena", bench: "BenchmarkGrowTo1GiB", metric: "speedup", target: 20, atLeast: true, source: "docs/benchmarks.md"},
	}},
	{bench: "Scale", benchtime: "200x", rows: []row{
		{path: "alloc + free, 10³ to 10⁶ live: largest ÷ smallest", bench: "BenchmarkScale", sub: "alloc-free", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "the same, freeing at random", bench: "BenchmarkScale", sub: "alloc-free-random", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "map + unmap, 10³ to 10⁶ mapped: largest ÷ smallest", bench: "BenchmarkScale", sub: "map-unmap", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "the same, at random places", bench: "BenchmarkScale", sub: "map-unmap-random", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "commit + decommit, 10³ to 10⁶ committed: largest ÷ smallest", bench: "BenchmarkScale", sub: "commit-decommit", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "the same, at random places", bench: "BenchmarkScale", sub: "commit-decommit-random", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
		{path: "the floor of the random rows: Go's map at random places, 10³ to 10⁶ keys", bench: "BenchmarkScale", sub: "hash-floor-random", metric: "largest/smallest", target: 1.5, source: "docs/benchmarks.md"},
	}},
	{bench: "Replay", benchtime: "1x", rows: []row{
		{path: "replay: committed ÷ allocated", bench: "BenchmarkReplay", sub: anySub, metric: "committed/allocated", target: 1.01, source: "docs/benchmarks.md"},
		{path: "replay: modelled driver time ÷ PyTorch's", bench: "BenchmarkReplay", sub: anySub, metric: "driver/pytorch", target: 1, source: "docs/benchmarks.md", where: true},
		{path: "replay at 64 KiB: seconds", bench: "BenchmarkReplay64KiB", sub: anySub, metric: "replay-s", target: 5, source: "docs/benchmarks.md"},
		{path: "replay at 64 KiB: modelled driver time ÷ PyTorch's", bench: "BenchmarkReplay64KiB", sub: anySub, metric: "driver/pytorch", target: 1, source: "docs/benchmarks.md", where: true},
		{path: "random-lifetimes replay at 2 MiB: seconds", bench: "BenchmarkReplaySynthetic", sub: "random-lifetimes/2_MiB", metric: "replay-s", target: 2, source: "docs/benchmarks.md"},
		{path: "random-lifetimes replay at 64 KiB: seconds", bench: "BenchmarkReplaySynthetic", sub: "random-lifetimes/64_KiB", metric: "replay-s", target: 20, source: "docs/benchmarks.md"},
		{path: "random-lifetimes at 2 MiB: committed ÷ allocated", bench: "BenchmarkReplaySynthetic", sub: "random-lifetimes/2_MiB", metric: "committed/allocated", target: 1.01, source: "docs/benchmarks.md"},
	}},
	{bench: "Pool", benchtime: "2000x", rows: []row{
		{path: "pool pairs on four streams ÷ on one", bench: "BenchmarkPoolAllocFree", sub: "4-streams", metric: "streams/one", target: 1.2, source: "docs/benchmarks.md"},
	}},
	{bench: "IPC", benchtime: "10x", rows: []row{
		{path: "IPC share of 1 GiB ÷ of 2 MiB", bench: "BenchmarkIPCShare", sub: "1_GiB", metric: "share-to-2MiB", target: 1.2, source: "docs/benchmarks.md"},
	}},
	{bench: "Migrate", benchtime: "3x", rows: []row{
		{path: "migrate 1 GiB ÷ copy into a new arena", bench: "BenchmarkMigrate1GiB", metric: "migrate/copy", target: 1.15, source: "docs/benchmarks.md"},
	}},
	{bench: "DecodeAttention|SequenceGrowth", benchtime: "10x", rows: []row{
		{path: "decode attention: paged ÷ contiguous", bench: "BenchmarkDecodeAttention", sub: anySub, metric: "x-contiguous-vs-paged", target: 1.1, atLeast: true, source: "docs/benchmarks.md"},
		{path: "sequence growth to 32k: copying ÷ cache", bench: "BenchmarkSequenceGrowth", sub: anySub, metric: "x-cache-vs-copying", target: 10, atLeast: true, source: "docs/benchmarks.md"},
	}},
	{bench: "KVAppend|KVDecodeStep", benchtime: "1024x", rows: []row{
		{path: "KV Append of one token: 128k ÷ 1k context", bench: "BenchmarkKVAppend", sub: anySub, metric: "append-128k/1k", target: 1.5, source: "docs/benchmarks.md"},
		{path: "KV decode step of 256 sequences: 32k ÷ 1k context", bench: "BenchmarkKVDecodeStep", sub: anySub, metric: "step-32k/1k", target: 1.5, source: "docs/benchmarks.md"},
		{path: "KV decode step of 256 sequences at 32k ÷ 50 µs", bench: "BenchmarkKVDecodeStep", sub: anySub, metric: "step-32k/50us", target: 1, source: "docs/benchmarks.md"},
	}},
	{bench: "SleepWake", benchtime: "3x", rows: []row{
		{path: "sleep + wake of 1 GiB, Host mode ÷ a copy out and back", bench: "BenchmarkSleepWake1GiB", metric: "sleepwake/copy", target: 1.2, source: "docs/benchmarks.md"},
		{path: "sleep/wake cycles: device and backup bytes grown a cycle", bench: "BenchmarkSleepWakeCycles", metric: "bytes-growth/cycle", target: 0, source: "docs/benchmarks.md"},
		{path: "sleep/wake cycles: descriptors grown a cycle", bench: "BenchmarkSleepWakeCycles", metric: "fds-growth/cycle", target: 0, source: "docs/benchmarks.md"},
		{path: "sleep/wake cycles: mappings grown a cycle", bench: "BenchmarkSleepWakeCycles", metric: "maps-growth/cycle", target: 0, source: "docs/benchmarks.md"},
	}},
}

// anySub as a row's sub stands for each sub-benchmark of its benchmark:
// the row is repeated for every one the output has.
const anySub = "*"

// command is one `go test ./bench -run '^$' -bench B [-benchtime T]`.
type command struct {
	// bench is the -bench pattern; benchtime the -benchtime, "" for go
	// test's default.
	bench, benchtime string
	// rows are the ratios of its output the report holds to a target.
	rows []row
}

// args are the go command's arguments that run c, with benchtime in
// place of c's own when it is not "".
func (c command) args(bench, benchtime string) []string {
	if bench == "" {
		bench = c.bench
	}
	if benchtime == "" {
		benchtime = c.benchtime
	}
	a := []string{"test", "./bench", "-run", "^$", "-bench", bench}
	if benchtime != "" {
		a = append(a, "-benchtime", benchtime)
	}
	return a
}

// String is c as docs/benchmarks.md writes it, quoted for a shell.
func (c command) String() string { return "go " + shellJoin(c.args("", "")) }

// shellJoin quotes each argument that a shell would otherwise read
// differently, docs/benchmarks.md's way: in single quotes.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if !plainWord.MatchString(a) {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./=:-]+$`)

// row is one ratio of one benchmark and the target it is held to.
type row struct {
	// path is what the ratio measures, in docs/benchmarks.md's words.
	path string
	// bench is the benchmark's top-level name; sub its sub-benchmark
	// ("" for none, anySub for each), as go test names it.
	bench, sub string
	// metric is the unit the benchmark reports the ratio with
	// (b.ReportMetric).
	metric string
	// target is the bound: the ratio is at most target, or at least it
	// when atLeast.
	target  float64
	atLeast bool
	// source is the docs page that states the target ("docs/benchmarks.md").
	source string
	// where says the benchmark reports the metric only where the target
	// applies (an anySub row's sub-benchmarks that lack it are left out,
	// not unmeasured): driver/pytorch, for traces with segment events
	// that do not start mid-run.
	where bool
}

// matches says whether the benchmark named name (less its -GOMAXPROCS
// suffix) is r's, and the sub-benchmark it is.
func (r row) matches(name string) (sub string, ok bool) {
	top, rest, _ := strings.Cut(name, "/")
	if top != r.bench {
		return "", false
	}
	switch r.sub {
	case anySub:
		return rest, rest != ""
	default:
		return rest, rest == r.sub
	}
}

// met says whether v meets r's target.
func (r row) met(v float64) bool {
	if r.atLeast {
		return v >= r.target
	}
	return v <= r.target
}

// bound is r's target as the report writes it, as docs/benchmarks.md does: "≤
// 1.05", "≤ 1.10", "≥ 20".
func (r row) bound() string {
	t := formatFloat(r.target, -1)
	if r.target < 10 {
		t = formatFloat(r.target, max(2, len(t)-strings.Index(t+".", ".")-1))
	}
	if r.atLeast {
		return "≥ " + t
	}
	return "≤ " + t
}

// selected is the suite as a -bench-filter leaves it: each command with
// only the rows whose benchmark the filter matches, and only the commands
// left with a row. The filter matches as go test's -bench does: split at
// each '/', each part an unanchored regexp matched against that level of
// the benchmark's name, a level it does not reach matching all. (A '/'
// inside brackets splits here too, where go test keeps it.) An empty
// filter keeps the suite whole.
func selected(filter string) ([]command, error) {
	if filter == "" {
		return suite, nil
	}
	var levels []*regexp.Regexp
	for _, part := range strings.Split(filter, "/") {
		re, err := regexp.Compile(part)
		if err != nil {
			return nil, errors.Wrapf(err, "-bench-filter %q", filter)
		}
		levels = append(levels, re)
	}
	var out []command
	for _, c := range suite {
		kept := c
		kept.rows = nil
		for _, r := range c.rows {
			if r.selectedBy(levels) {
				kept.rows = append(kept.rows, r)
			}
		}
		if len(kept.rows) > 0 {
			out = append(out, kept)
		}
	}
	if len(out) == 0 {
		return nil, errors.Newf("-bench-filter %q matches no benchmark the report holds to a target (%s)", filter, strings.Join(benchNames(), ", "))
	}
	return out, nil
}

// selectedBy says whether a -bench-filter split into levels may run r's
// benchmark: each level matches its part of the name, and an anySub row
// is kept whatever its sub-benchmark level says (which of its
// sub-benchmarks run is go test's to say).
func (r row) selectedBy(levels []*regexp.Regexp) bool {
	parts := []string{r.bench}
	if r.sub != "" {
		parts = append(parts, strings.Split(r.sub, "/")...)
	}
	for i, re := range levels {
		switch {
		case i >= len(parts) || parts[i] == anySub:
			return true
		case !re.MatchString(parts[i]):
			return false
		}
	}
	return true
}

// benchNames are the benchmarks the suite's rows name, once each.
func benchNames() []string {
	var names []string
	for _, c := range suite {
		for _, r := range c.rows {
			if !slices.Contains(names, r.bench) {
				names = append(names, r.bench)
			}
		}
	}
	return names
}
