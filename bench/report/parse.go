package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// result is one benchmark's line of `go test -bench` output:
//
//	BenchmarkReserveFree1TiB-2   50   10490 bare-ns/op   12024 lib-ns/op   1.146 lib/bare
//
// the name (with the GOMAXPROCS suffix go test adds when it is above 1),
// the iterations, then value and unit pairs in the order printed.
type result struct {
	// name is the benchmark's name less the -GOMAXPROCS suffix.
	name       string
	iterations int64
	metrics    []metric
}

// metric is one value and unit pair of a result: the value, and the
// value as go test wrote it (to the digits it chose to show).
type metric struct {
	value      float64
	text, unit string
}

// metric is the result's figure in unit, if it has one.
func (r result) metric(unit string) (metric, bool) {
	for _, m := range r.metrics {
		if m.unit == unit {
			return m, true
		}
	}
	return metric{}, false
}

// output is what the report reads of `go test -bench` output: the results
// in order, and the header lines that say where they ran.
type output struct {
	results []result
	// cpu, goos and goarch are from the header lines ("cpu: AMD EPYC");
	// the last of each wins.
	cpu, goos, goarch string
}

// procsSuffix is the -GOMAXPROCS suffix of a benchmark's name. (A
// sub-benchmark whose own name ends in a dash and digits, run with
// GOMAXPROCS 1, would lose them too; none of the suite's does.)
var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// parse reads `go test -bench` output. Lines that are not results or
// header lines (PASS, ok, logs, --- SKIP) are passed over; so is a
// benchmark's name printed alone before its logs.
func parse(r io.Reader) (output, error) {
	var out output
	br := &boundedOutput{r: r}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		out.line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		return output{}, err
	}
	return out, nil
}

// maxOutput bounds the benchmark output the report reads in all, from a
// file or from the suite it runs (a variable so that a test can lower
// it): the suite's whole output is about 8 KB (testdata/bench-output.txt),
// a run with -count 10 and verbose logs a few MB. The results it builds
// are bounded with it: each takes a line of at least a name and a figure.
var maxOutput int64 = 64 << 20

// boundedOutput reads r, failing once more than maxOutput bytes would
// have been read.
type boundedOutput struct {
	r    io.Reader
	read int64
}

func (b *boundedOutput) Read(p []byte) (int, error) {
	if left := maxOutput - b.read + 1; int64(len(p)) > left {
		p = p[:left] // one past the bound: enough to see it passed
	}
	n, err := b.r.Read(p)
	if b.read += int64(n); b.read > maxOutput {
		return n, fmt.Errorf("report: more than %d bytes of benchmark output (maxOutput)", maxOutput)
	}
	return n, err
}

// line takes in one line of output, and returns the result it is, if
// it is one.
func (o *output) line(s string) (result, bool) {
	if k, v, ok := strings.Cut(s, ":"); ok && !strings.HasPrefix(s, "Benchmark") {
		switch v = strings.TrimSpace(v); k {
		case "cpu":
			o.cpu = v
		case "goos":
			o.goos = v
		case "goarch":
			o.goarch = v
		}
		return result{}, false
	}
	r, ok := parseResult(s)
	if ok {
		o.results = append(o.results, r)
	}
	return r, ok
}

// parseResult parses a result line; ok is false for any other line.
func parseResult(s string) (r result, ok bool) {
	f := strings.Fields(s)
	if len(f) < 2 || len(f)%2 != 0 || !strings.HasPrefix(f[0], "Benchmark") {
		return r, false
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || n < 0 {
		return r, false
	}
	r = result{name: procsSuffix.ReplaceAllString(f[0], ""), iterations: n}
	for i := 2; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return result{}, false
		}
		r.metrics = append(r.metrics, metric{value: v, text: f[i], unit: f[i+1]})
	}
	return r, true
}
