package main

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// servedLine is the line -metrics prints, with the URL it serves.
var servedLine = regexp.MustCompile(`(?m)^The cache's metrics are served at (http://127\.0\.0\.1:\d+/metrics) while the example runs\.$`)

// scrapeMetrics gets url and parses the text format: every series by
// `family` or `family{label="value"}`, the name label left out. Every
// family must be a vmarena_kvcache_ one, every series carry
// name="tiny", and every counter's name end in _total.
func scrapeMetrics(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.Newf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, errors.Wrapf(err, "GET %s: the text format", url)
	}
	got := map[string]float64{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "vmarena_kvcache_") {
			return nil, errors.Newf("%s: not a family of the cache's", name)
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() != "name":
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				case l.GetValue() != metricsName:
					return nil, errors.Newf("%s: name=%q, not %q", name, l.GetValue(), metricsName)
				}
			}
			key := name
			if len(labels) > 0 {
				slices.Sort(labels)
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil && strings.HasSuffix(name, "_total"):
				got[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil && !strings.HasSuffix(name, "_total"):
				got[key] = m.GetGauge().GetValue()
			default:
				return nil, errors.Newf("%s: %s, a counter if and only if its name ends in _total", key, mf.GetType())
			}
		}
	}
	return got, nil
}

// TestServeMetrics: serveMetrics serves a cache's figures over HTTP as
// they are at each scrape, and stops serving when told to. (The model
// does not run here: a sequence is admitted and appended directly.)
func TestServeMetrics(t *testing.T) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: capacity, Granularity: page})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	kc, err := kvcache.Preset("tiny")
	require.NoError(t, err)
	kc.MaxContext, kc.MaxSeqs, kc.PageSize, kc.Budget, kc.MapAhead = maxContext, maxSeqs, page, budget, -1
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), kc)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	var out bytes.Buffer
	url, stop, err := serveMetrics(&out, "127.0.0.1:0", c)
	require.NoError(t, err)
	require.Equal(t, []string{out.String()[:len(out.String())-1], url}, servedLine.FindStringSubmatch(out.String()))

	got, err := scrapeMetrics(url)
	require.NoError(t, err)
	require.Zero(t, got["vmarena_kvcache_admits_total"])
	require.Equal(t, float64(budget), got["vmarena_kvcache_budget_bytes"])

	prompt := make([]int, 40)
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	_, err = s.Append(prompt)
	require.NoError(t, err)
	st := c.Stats()
	got, err = scrapeMetrics(url)
	require.NoError(t, err)
	require.Equal(t, 1.0, got["vmarena_kvcache_admits_total"])
	require.Equal(t, 1.0, got[`vmarena_kvcache_sequences{state="running"}`])
	require.Equal(t, 40.0, got["vmarena_kvcache_stored_tokens"])
	require.Equal(t, float64(st.Committed), got["vmarena_kvcache_committed_bytes"])
	require.Equal(t, float64(st.UsedBytes)/float64(budget), got["vmarena_kvcache_usage_ratio"])
	require.Positive(t, got["vmarena_kvcache_usage_ratio"])
	require.NoError(t, s.Free())

	require.NoError(t, stop())
	_, err = scrapeMetrics(url)
	require.Error(t, err, "no longer served")

	_, _, err = serveMetrics(&out, "127.0.0.1:-1", c)
	require.ErrorContains(t, err, "-metrics 127.0.0.1:-1")
}

// checkScraped checks the metrics TestRunSmall scraped at the end of its
// run, every request served and the budget cut to one unit, against the
// kvcache.Stats the run printed (field reads one of them): every family of
// the cache is there, and says what the Stats say.
func checkScraped(t *testing.T, got map[string]float64, requests int, field func(name string) int) {
	t.Helper()
	f := func(name string) float64 { return float64(field(name)) }
	for _, key := range []string{
		"page_size_bytes", "budget_bytes", "committed_bytes", "used_bytes", "waste_bytes", "saved_bytes", "usage_ratio",
		"slot_pages", "store_pages", "idle_pages", "surplus_pages", "cached_pages", "shared_pages",
		`sequences{state="running"}`, `sequences{state="preempted"}`, "slots", "stored_tokens",
		"admits_total", "frees_total", "appends_total", "append_waits_total", "commits_total", "mapper_commits_total",
		"borrows_total", "decommits_total", "prefix_queried_tokens_total", "prefix_hit_tokens_total", "prefix_hit_ratio",
		"copies_total", "copied_bytes_total", "evictions_total", "evicted_pages_total", "reclaims_total",
		"reclaimed_pages_total", `preemptions_total{mode="swap"}`, `preemptions_total{mode="drop"}`,
		"swapped_bytes_total", "resumes_total",
	} {
		require.Contains(t, got, "vmarena_kvcache_"+key)
	}
	require.Len(t, got, 38, "no other series")
	m := func(name string) float64 { return got["vmarena_kvcache_"+name] }

	require.Equal(t, float64(page), m("page_size_bytes"))
	require.Equal(t, float64(unit), m("budget_bytes"), "the budget of one unit at the end")
	require.LessOrEqual(t, m("committed_bytes"), m("budget_bytes"))
	require.Equal(t, m("committed_bytes"), m("used_bytes")+m("waste_bytes")+m("cached_pages")*float64(page))
	require.Equal(t, float64(maxSeqs), m("slots"))
	require.Zero(t, m(`sequences{state="running"}`))
	require.Zero(t, m(`sequences{state="preempted"}`))
	require.Zero(t, m("usage_ratio"), "nothing runs")

	require.Equal(t, float64(requests), m("admits_total"))
	require.Equal(t, float64(requests), m("frees_total"))
	for metric, stat := range map[string]string{
		"appends_total": "Steps", "append_waits_total": "Waits", "commits_total": "Commits",
		"mapper_commits_total": "MapperCommits", "borrows_total": "Borrows", "decommits_total": "Decommits",
		"copies_total": "Copies", "evictions_total": "Evictions", "evicted_pages_total": "EvictedPages",
		"reclaims_total": "Reclaims", "reclaimed_pages_total": "ReclaimedPages", "resumes_total": "Resumes",
		`preemptions_total{mode="swap"}`: "Swaps", `preemptions_total{mode="drop"}`: "Drops",
		"slot_pages": "SlotPages", "store_pages": "StorePages", "cached_pages": "CachedPages",
	} {
		require.Equal(t, f(stat), m(metric), "%s is Stats.%s", metric, stat)
	}
	// Prefix lookups are in blocks of 16 tokens (the default BlockTokens).
	require.Equal(t, 16*f("PrefixQueries"), m("prefix_queried_tokens_total"))
	require.Equal(t, 16*f("PrefixHits"), m("prefix_hit_tokens_total"))
	require.Positive(t, m("prefix_hit_tokens_total"))
	require.Equal(t, f("PrefixHits")/f("PrefixQueries"), m("prefix_hit_ratio"))
	require.LessOrEqual(t, m("prefix_hit_ratio"), 1.0)
}
