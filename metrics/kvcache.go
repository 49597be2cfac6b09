package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
)

// NewKVCacheCollector makes the collector of the KV cache c, whose series
// carry the label name="name": vmarena_kvcache_*, the figures of
// kvcache.Stats. A nil cache, one not made by kvcache.New (ErrInvalid) and
// a closed one (ErrClosed) are refused.
func NewKVCacheCollector(name string, c *kvcache.Cache) (*Collector, error) {
	what := func() string { return "metrics: new kvcache collector" }
	if err := checkName(what, name); err != nil {
		return nil, err
	}
	switch {
	case c == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: the cache is nil", what(), name)
	case c.Config().MaxSeqs == 0:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: not a cache made by kvcache.New", what(), name)
	case c.Closed():
		return nil, errors.Wrapf(driver.ErrClosed, "%s %q: the cache is closed", what(), name)
	}
	cfg := c.Config()
	return newCollector("kvcache", name, kvcacheFigures(float64(cfg.PageSize), float64(cfg.BlockTokens)), c.Closed, always(c.Stats))
}

// kvcacheFigures are the metrics of a cache of pages of page bytes and
// prefix blocks of block tokens.
func kvcacheFigures(page, block float64) []figure[kvcache.Stats] {
	type st = kvcache.Stats
	f := func(n int) float64 { return float64(n) }
	b := func(n uint64) float64 { return float64(n) }
	ratio := func(n, d float64) float64 {
		if d == 0 {
			return 0
		}
		return n / d
	}
	return []figure[st]{
		gauge("page_size_bytes", "The cache's unit of commit: the pages the *_pages metrics count.",
			func(*st) float64 { return page }),
		gauge("budget_bytes", "The most memory the cache keeps committed (SetBudget changes it).",
			func(s *st) float64 { return b(s.Budget) }),
		gauge("committed_bytes", "Memory committed: the slots' own pages and the prefix store's; used + waste + cached pages.",
			func(s *st) float64 { return b(s.Committed) }),
		gauge("used_bytes", "Committed bytes that hold a token of a running sequence, each once however many sequences map it.",
			func(s *st) float64 { return b(s.UsedBytes) }),
		gauge("waste_bytes", "Committed bytes that hold no token of a running sequence, cached prefix pages aside (idle and surplus pages, the tails of pages).",
			func(s *st) float64 { return b(s.Waste) }),
		gauge("saved_bytes", "Memory that prefix sharing spares: a page for each extra mapping of a prefix store page.",
			func(s *st) float64 { return b(s.SavedBytes) }),
		gauge("usage_ratio", "used_bytes over budget_bytes: the budget's share holding running sequences' tokens (vLLM's kv_cache_usage_perc, SGLang's token_usage; cached prefix pages count as free, as evictable).",
			func(s *st) float64 { return ratio(b(s.UsedBytes), b(s.Budget)) }),
		gauge("slot_pages", "Committed pages that are the slots' own.",
			func(s *st) float64 { return f(s.SlotPages) }),
		gauge("store_pages", "Committed pages of the prefix store, mapped into slots or cached.",
			func(s *st) float64 { return f(s.StorePages) }),
		gauge("idle_pages", "Slot pages kept by free slots for their next sequence (deferred reclaim).",
			func(s *st) float64 { return f(s.IdlePages) }),
		gauge("surplus_pages", "Slot pages of running sequences beyond their tokens.",
			func(s *st) float64 { return f(s.SurplusPages) }),
		gauge("cached_pages", "Prefix store pages no sequence maps: evictable.",
			func(s *st) float64 { return f(s.CachedPages) }),
		gauge("shared_pages", "Prefix store pages two or more running sequences map.",
			func(s *st) float64 { return f(s.SharedPages) }),
		{name: "sequences", help: "Live sequences, by state: running, or preempted (swapped or dropped, waiting to resume).",
			typ: prometheus.GaugeValue, split: "state", series: []series[st]{
				{"running", func(s *st) float64 { return f(s.Running) }},
				{"preempted", func(s *st) float64 { return f(s.Preempted) }},
			}},
		gauge("slots", "Sequence slots: the most sequences the cache holds at once.",
			func(s *st) float64 { return f(s.Slots) }),
		gauge("stored_tokens", "Tokens of running sequences, a shared token counted in each.",
			func(s *st) float64 { return f(s.TokensStored) }),

		counter("admits_total", "Sequences admitted.",
			func(s *st) float64 { return f(s.Admits) }),
		counter("frees_total", "Sequences freed.",
			func(s *st) float64 { return f(s.Frees) }),
		counter("appends_total", "Appends: the steps of every sequence.",
			func(s *st) float64 { return f(s.Steps) }),
		counter("append_waits_total", "Appends that committed a page themselves or waited for one being mapped ahead.",
			func(s *st) float64 { return f(s.Waits) }),
		counter("commits_total", "Commits asked of the arena (one a region of a unit in the per-layer layout).",
			func(s *st) float64 { return f(s.Commits) }),
		counter("mapper_commits_total", "Commits the mapping-ahead goroutine made (part of commits_total).",
			func(s *st) float64 { return f(s.MapperCommits) }),
		counter("borrows_total", "Prefix store units mapped into slots.",
			func(s *st) float64 { return f(s.Borrows) }),
		counter("decommits_total", "Decommits asked of the arena.",
			func(s *st) float64 { return f(s.Decommits) }),
		counter("prefix_queried_tokens_total", "Prompt tokens looked up in the prefix store, in whole blocks, by every Admit and Resume (vLLM's prefix_cache_queries).",
			func(s *st) float64 { return f(s.PrefixQueries) * block }),
		counter("prefix_hit_tokens_total", "Prompt tokens found in the prefix store (vLLM's prefix_cache_hits).",
			func(s *st) float64 { return f(s.PrefixHits) * block }),
		gauge("prefix_hit_ratio", "prefix_hit_tokens_total over prefix_queried_tokens_total since the cache was made, 0 before any lookup (SGLang's cache_hit_rate); rate() of the two is the recent ratio.",
			func(s *st) float64 { return ratio(f(s.PrefixHits), f(s.PrefixQueries)) }),
		counter("copies_total", "Pages partly covered by a matched prefix, copied into a sequence's own.",
			func(s *st) float64 { return f(s.Copies) }),
		counter("copied_bytes_total", "Bytes those copies moved.",
			func(s *st) float64 { return b(s.CopiedBytes) }),
		counter("evictions_total", "Prefix store units given back.",
			func(s *st) float64 { return f(s.Evictions) }),
		counter("evicted_pages_total", "Pages of the prefix store units given back.",
			func(s *st) float64 { return f(s.EvictedPages) }),
		counter("reclaims_total", "Idle slots and surplus pages given back.",
			func(s *st) float64 { return f(s.Reclaims) }),
		counter("reclaimed_pages_total", "Pages those reclaims gave back.",
			func(s *st) float64 { return f(s.ReclaimedPages) }),
		{name: "preemptions_total", help: "Sequences preempted, by mode: swap (keys and values to host memory) or drop (recomputed at resume) (vLLM's num_preemptions).",
			typ: prometheus.CounterValue, split: "mode", series: []series[st]{
				{"swap", func(s *st) float64 { return f(s.Swaps) }},
				{"drop", func(s *st) float64 { return f(s.Drops) }},
			}},
		counter("swapped_bytes_total", "Bytes preemptions copied to host memory.",
			func(s *st) float64 { return b(s.SwappedBytes) }),
		counter("resumes_total", "Preempted sequences resumed.",
			func(s *st) float64 { return f(s.Resumes) }),
	}
}
