package main

import (
	"bytes"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/serving"
)

// snapshotLine is a line of the memory map: step, done, running, swapped,
// waiting, a character a unit for each of the 8 slots, committed and store.
var snapshotLine = regexp.MustCompile(`(?m)^ *(\d+) +(\d+) +(\d+) +(\d+) +(\d+)  ((?:[#*+~s.-]{8} ){7}[#*+~s.-]{8})  +([\d.]+) MiB +([\d.]+) MiB$`)

// TestRunSmall serves a dozen requests, scaled down further, and checks
// that the output says what the example claims: the header with the
// scaling, a memory map that grows and shrinks (the budget halved,
// restored, and cut to one unit at the end), the logits check, and every
// field of kvcache.Stats with prefix hits, which the metrics -metrics
// serves agree with, scraped at the end. run returning nil means the
// cache and the driver closed, which the driver refuses while anything is
// still mapped: nothing leaked.
func TestRunSmall(t *testing.T) {
	if race.Enabled {
		// 25 s under the detector for 6 requests, too few to share a
		// prefix: the model's arithmetic on one goroutine per sequence.
		// The cache's concurrency has race tests of its own.
		t.Skip("a long computation; run without -race")
	}
	// Scaled 32 times, not 64: more requests generate two tokens or more,
	// one of which is the request whose logits are checked.
	cfg := config{requests: 12, scale: 32}
	// With -metrics, scraped at the end of the run (checkScraped).
	var scraped map[string]float64
	cfg.metrics, cfg.served = "127.0.0.1:0", func(url string) (err error) {
		scraped, err = scrapeMetrics(url)
		return err
	}
	var out bytes.Buffer
	require.NoError(t, run(&out, cfg))
	s := out.String()
	t.Log("\n" + s)
	served, s, _ := strings.Cut(s, "\n") // -metrics's line comes first
	require.Regexp(t, servedLine, served)

	require.Regexp(t, `^A transformer of 4 layers, 8 heads of 64 and a vocabulary of 256 \(weights from seed 11\) serves the first\n`+
		strconv.Itoa(cfg.requests)+` requests of the Azure LLM conversation trace through a KV cache on the host driver.\n`, s)
	require.Contains(t, s, "Lengths are scaled down 32 times")
	require.Contains(t, s, "each prompt is one of 4 system prompts of 64 tokens")
	require.Contains(t, s, "kvcache: 8 slots of 4 MiB, per-layer, 8 regions of 512 KiB (8 pages of 64 KiB) a slot; budget 10 MiB.")

	snaps := snapshotLine.FindAllStringSubmatch(s, -1)
	require.NotEmpty(t, snaps, "memory map lines")
	mib := func(m []string) float64 {
		f, err := strconv.ParseFloat(m[7], 64)
		require.NoError(t, err)
		return f
	}
	peak, grew := 0.0, false
	for _, m := range snaps {
		peak = max(peak, mib(m))
		grew = grew || strings.ContainsAny(m[6], "#*")
	}
	require.True(t, grew, "some snapshot shows a running sequence's pages")
	last := snaps[len(snaps)-1]
	require.Equal(t, strconv.Itoa(cfg.requests), last[2], "all served at the last snapshot")
	require.Less(t, mib(last), peak, "the map shrinks")
	require.Equal(t, "0.5", last[7], "one unit left at the end: %s", last[0])
	require.NotContains(t, last[6], "#", "no running sequence at the end")
	for _, why := range []string{"6 MiB (another model needs 4 MiB)", "10 MiB (restored)", "512 KiB (all served)"} {
		require.Contains(t, s, "-- budget "+why)
	}

	require.Regexp(t, `\nServed `+strconv.Itoa(cfg.requests)+` requests in \d+ steps: \d+ prompt tokens \(\d+ of them found in the prefix store, not computed\)\n`+
		`and \d+ generated\. The model computed \d+ positions in [\d.]+ s`, s)
	check := regexp.MustCompile(`Request \d+ \((\d+) of its \d+ prompt tokens from the prefix store\): its logits at the (\d+) positions it computed\n` +
		`match the full recomputation without a cache: max \|diff\| = 0\.`).FindStringSubmatch(s)
	require.NotNil(t, check, "the logits check, equal bit for bit")
	require.NotEqual(t, "0", check[1], "the checked request shared a prefix")

	stats := s[strings.Index(s, "kvcache.Stats at the end:"):]
	ty := reflect.TypeOf(kvcache.Stats{})
	for i := range ty.NumField() {
		require.Regexp(t, `  `+ty.Field(i).Name+` +\S`, stats, "every field of Stats is printed")
	}
	field := func(name string) int {
		m := regexp.MustCompile(`  ` + name + ` +(\d+)`).FindStringSubmatch(stats)
		require.NotNil(t, m, name)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	require.Positive(t, field("PrefixHits"))
	require.Positive(t, field("PrefixQueries"))
	require.Equal(t, cfg.requests, field("Admits"))
	require.Equal(t, cfg.requests, field("Frees"))
	require.Zero(t, field("Sequences"))
	checkScraped(t, scraped, cfg.requests, field)
}

// TestTrace: the embedded trace is the header and 300 requests, and its
// first lines are serving's copy of the same file, byte for byte.
func TestTrace(t *testing.T) {
	reqs, err := serving.ParseAzure(bytes.NewReader(traceCSV))
	require.NoError(t, err)
	require.Len(t, reqs, 300)
	theirs, err := os.ReadFile("../../serving/testdata/requests/AzureLLMInferenceTrace_conv.csv")
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(traceCSV, theirs), "serving's 200 lines begin ours")
}

// TestFlags: a flag the example cannot use is one line on stderr and
// exit status 2; -h is the usage and status 0.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-requests", "0"}, "kvcache: -requests 0: the embedded trace has requests 1 to 300\n"},
		{[]string{"-requests", "301"}, "kvcache: -requests 301: the embedded trace has requests 1 to 300\n"},
		{[]string{"-scale", "0"}, "kvcache: -scale 0: lengths are divided by at least 1\n"},
		{[]string{"-scale", "-3"}, "kvcache: -scale -3: lengths are divided by at least 1\n"},
		{[]string{"-requests", "x"}, "kvcache: invalid value \"x\" for flag -requests: parse error\n"},
		{[]string{"-budget", "1"}, "kvcache: flag provided but not defined: -budget\n"},
		{[]string{"extra"}, "kvcache: unexpected argument \"extra\"; the flags are -requests N, -scale S, -svg DIR and -metrics ADDR\n"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, realMain(c.args, &stdout, &stderr), "%v", c.args)
		require.Equal(t, c.want, stderr.String())
		require.Empty(t, stdout.String())
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, realMain([]string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "-requests")
	require.Contains(t, stderr.String(), "-scale")
	require.Empty(t, stdout.String())
}
