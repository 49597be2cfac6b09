package metrics_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/metrics"
)

// newCache is a cache of the tiny preset (a row of 2 KiB: 32 tokens a page
// in each of the 8 regions of the per-layer layout, a unit of 512 KiB) with
// 64 KiB pages, 4 slots of 128 tokens, and no mapping ahead, so that
// nothing changes the figures between two reads but the test.
func newCache(t *testing.T, e *env) *kvcache.Cache {
	t.Helper()
	cfg, err := kvcache.Preset("tiny")
	require.NoError(t, err)
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.MapAhead = 128, 4, page, -1
	c, err := kvcache.New(e.space, e.mem, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if !c.Closed() {
			require.NoError(t, c.Close())
		}
	})
	return c
}

// tokens are n tokens from first on.
func tokens(first, n int) []int {
	t := make([]int, n)
	for i := range t {
		t[i] = first + i
	}
	return t
}

// serve runs a little of everything the cache counts: three sequences
// sharing a 64-token prompt (two whole units: the later ones map them
// from the prefix store), a swap, a drop, their resumes, a free, and a
// lower budget that gives back the pages of the idle slot.
func serve(t *testing.T, c *kvcache.Cache) {
	t.Helper()
	system := tokens(1, 64)
	first := append(system, tokens(100, 10)...)
	a, err := c.Admit(first, 0)
	require.NoError(t, err)
	_, err = a.Append(first[a.Len():]) // Admit leaves to Append what the store did not hold
	require.NoError(t, err)
	require.NoError(t, a.MarkWritten(a.Len())) // its rows computed: publishes a's prompt units to the store
	_, err = a.Append([]int{7})
	require.NoError(t, err)

	prompt := append(system, tokens(200, 20)...)
	b, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	require.Equal(t, 64, b.Matched(), "b found the system prompt in the store")
	_, err = b.Append(prompt[b.Len():])
	require.NoError(t, err)
	require.NoError(t, b.Preempt(kvcache.Swap))
	_, err = b.Resume()
	require.NoError(t, err)

	third := append(system, tokens(300, 5)...)
	d, err := c.Admit(third, 0) // b and d share the system prompt's pages
	require.NoError(t, err)
	_, err = d.Append(third[d.Len():])
	require.NoError(t, err)
	require.NoError(t, d.Preempt(kvcache.Drop))
	_, err = d.Resume() // hands back the positions to recompute
	require.NoError(t, err)
	require.NoError(t, a.Free()) // its slot keeps its own pages, idle

	// A budget one unit short gives back the idle slot's pages.
	st := c.Stats()
	pre, err := c.SetBudget(st.Committed-uint64(st.IdlePages)*page, kvcache.Swap)
	require.NoError(t, err)
	require.Empty(t, pre)
}

// TestKVCacheCollector: after the operations of serve, every series is the
// figure of the cache's Stats it says it is (the map below is the whole of
// what the collector sends), promlint finds nothing to report, and the
// text format of two metrics is as written out here.
func TestKVCacheCollector(t *testing.T) {
	c := newCache(t, hostEnv(t))
	col, err := metrics.NewKVCacheCollector("tiny", c)
	require.NoError(t, err)
	require.Equal(t, "tiny", col.Name())
	serve(t, c)

	st := c.Stats()
	t.Logf("%+v", st)
	require.Positive(t, st.PrefixHits)
	require.Positive(t, st.StorePages, "the system prompt is in the prefix store")
	require.Equal(t, 1, st.Swaps)
	block := float64(c.Config().BlockTokens)
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	want := map[string]float64{
		"vmarena_kvcache_page_size_bytes":                b(page),
		"vmarena_kvcache_budget_bytes":                   b(st.Budget),
		"vmarena_kvcache_committed_bytes":                b(st.Committed),
		"vmarena_kvcache_used_bytes":                     b(st.UsedBytes),
		"vmarena_kvcache_waste_bytes":                    b(st.Waste),
		"vmarena_kvcache_saved_bytes":                    b(st.SavedBytes),
		"vmarena_kvcache_usage_ratio":                    b(st.UsedBytes) / b(st.Budget),
		"vmarena_kvcache_slot_pages":                     f(st.SlotPages),
		"vmarena_kvcache_store_pages":                    f(st.StorePages),
		"vmarena_kvcache_idle_pages":                     f(st.IdlePages),
		"vmarena_kvcache_surplus_pages":                  f(st.SurplusPages),
		"vmarena_kvcache_cached_pages":                   f(st.CachedPages),
		"vmarena_kvcache_shared_pages":                   f(st.SharedPages),
		`vmarena_kvcache_sequences{state="running"}`:     f(st.Running),
		`vmarena_kvcache_sequences{state="preempted"}`:   f(st.Preempted),
		"vmarena_kvcache_slots":                          4,
		"vmarena_kvcache_stored_tokens":                  f(st.TokensStored),
		"vmarena_kvcache_admits_total":                   3,
		"vmarena_kvcache_frees_total":                    1,
		"vmarena_kvcache_appends_total":                  f(st.Steps),
		"vmarena_kvcache_append_waits_total":             f(st.Waits),
		"vmarena_kvcache_commits_total":                  f(st.Commits),
		"vmarena_kvcache_mapper_commits_total":           0,
		"vmarena_kvcache_borrows_total":                  f(st.Borrows),
		"vmarena_kvcache_decommits_total":                f(st.Decommits),
		"vmarena_kvcache_prefix_queried_tokens_total":    f(st.PrefixQueries) * block,
		"vmarena_kvcache_prefix_hit_tokens_total":        f(st.PrefixHits) * block,
		"vmarena_kvcache_prefix_hit_ratio":               f(st.PrefixHits) / f(st.PrefixQueries),
		"vmarena_kvcache_copies_total":                   f(st.Copies),
		"vmarena_kvcache_copied_bytes_total":             b(st.CopiedBytes),
		"vmarena_kvcache_evictions_total":                f(st.Evictions),
		"vmarena_kvcache_evicted_pages_total":            f(st.EvictedPages),
		"vmarena_kvcache_reclaims_total":                 f(st.Reclaims),
		"vmarena_kvcache_reclaimed_pages_total":          f(st.ReclaimedPages),
		`vmarena_kvcache_preemptions_total{mode="swap"}`: 1,
		`vmarena_kvcache_preemptions_total{mode="drop"}`: 1,
		"vmarena_kvcache_swapped_bytes_total":            b(st.SwappedBytes),
		"vmarena_kvcache_resumes_total":                  2,
	}
	require.Equal(t, want, scrape(t, col, "tiny"))
	lint(t, col)

	require.NoError(t, testutil.CollectAndCompare(col, strings.NewReader(`
# HELP vmarena_kvcache_sequences Live sequences, by state: running, or preempted (swapped or dropped, waiting to resume).
# TYPE vmarena_kvcache_sequences gauge
vmarena_kvcache_sequences{name="tiny",state="preempted"} 0
vmarena_kvcache_sequences{name="tiny",state="running"} 2
# HELP vmarena_kvcache_preemptions_total Sequences preempted, by mode: swap (keys and values to host memory) or drop (recomputed at resume) (vLLM's num_preemptions).
# TYPE vmarena_kvcache_preemptions_total counter
vmarena_kvcache_preemptions_total{mode="drop",name="tiny"} 1
vmarena_kvcache_preemptions_total{mode="swap",name="tiny"} 1
`), "vmarena_kvcache_sequences", "vmarena_kvcache_preemptions_total"))
}

// TestKVCacheCollectorFresh: a cache nothing has used yet reports zeros
// and a prefix hit ratio of 0 (not NaN) before any lookup.
func TestKVCacheCollectorFresh(t *testing.T) {
	c := newCache(t, simEnv(t))
	col, err := metrics.NewKVCacheCollector("fresh", c)
	require.NoError(t, err)
	got := scrape(t, col, "fresh")
	require.Zero(t, got["vmarena_kvcache_prefix_hit_ratio"])
	require.Zero(t, got["vmarena_kvcache_usage_ratio"])
	require.Zero(t, got["vmarena_kvcache_committed_bytes"])
	require.Equal(t, float64(c.Stats().Budget), got["vmarena_kvcache_budget_bytes"])
}

// TestScrapeWhileServing: scrapes run while sequences come and go on other
// goroutines (the race detector watches), and every scrape sees figures
// that agree with each other: they come from one Stats.
func TestScrapeWhileServing(t *testing.T) {
	c := newCache(t, hostEnv(t))
	col, err := metrics.NewKVCacheCollector("busy", c)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, col))

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for g := range 2 {
		wg.Go(func() {
			for i := range 20 {
				prompt := tokens(1000*g+i, 40)
				s, err := c.Admit(prompt, 0)
				if err == nil {
					_, err = s.Append(prompt[s.Len():])
					err = errors.CombineErrors(err, s.Free())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range 20 {
		got := scrape(t, col, "busy")
		require.LessOrEqual(t, got["vmarena_kvcache_frees_total"], got["vmarena_kvcache_admits_total"])
		require.Equal(t, got["vmarena_kvcache_committed_bytes"],
			got["vmarena_kvcache_used_bytes"]+got["vmarena_kvcache_waste_bytes"]+got["vmarena_kvcache_cached_pages"]*float64(page))
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got := scrape(t, col, "busy")
	require.Equal(t, 40.0, got["vmarena_kvcache_admits_total"])
	require.Equal(t, 40.0, got["vmarena_kvcache_frees_total"])
}
