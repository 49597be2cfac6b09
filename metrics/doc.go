// Package metrics exposes the figures of the library's arenas, allocators,
// stream-ordered pools and KV caches as Prometheus collectors
// (github.com/prometheus/client_golang), so that a serving process shows
// its memory next to its other metrics.
//
// # What it owns
//
// Collectors and their descriptions, nothing else. A Collector watches one
// object, named by the caller: NewKVCacheCollector, NewAllocatorCollector,
// NewArenaCollector (and NewSparseCollector, the same metrics for a bare
// range) and NewPoolCollector. At every scrape it reads the object's Stats
// (a pool's attributes) once and hands them out as constant metrics: it
// keeps no figures of its own, so two scrapes never disagree with the
// object. The name is the value of the "name" label of every series, so
// one registry holds the caches, allocators, arenas and pools of a process
// side by side; Register registers collectors and says which one a
// registry refused, and why.
//
// # The metrics
//
// Names follow Prometheus's conventions: vmarena_<kind>_<figure>_<unit>,
// bytes and ratios in base units (_bytes, _ratio: 1 is 100%), counters of
// events since the object was made end in _total, a count of things says
// what it counts (_pages, _chunks, _tokens). A figure a Stats splits in
// parts that sum to a whole is one metric with a label (sequences by state,
// preemptions by mode). The KV cache's figures include the ones serving
// engines publish: vmarena_kvcache_usage_ratio (vLLM's kv_cache_usage_perc,
// SGLang's token_usage), the prefix cache's queried and hit tokens (vLLM's
// prefix_cache_queries and prefix_cache_hits) and hit ratio (SGLang's
// cache_hit_rate), and preemptions (vLLM's num_preemptions). The Metrics
// section of docs/cli.md lists them all.
//
// # Invariants
//
// Every series a collector sends matches a description it described (it is
// a checked collector: a pedantic registry finds nothing to report); one
// object's figures in a scrape come from one call of its Stats, so they
// agree with each other (a pool's attributes are read one by one); and a
// name is given to at most one object of a kind in a registry: Register
// refuses a second, with an error saying so.
//
// # What it never does
//
// It never changes an object: it calls nothing but the accessors that
// read figures (Stats, Attribute, Closed, Config, Max, Props), which take
// the object's lock only as long as any caller's read does. It never
// panics in a scrape: a constructor refuses a nil, unmade or closed object
// and a name that cannot be a label value, and a collector whose object
// was closed since sends nothing (its series go, as a stopped process's
// do). A destroyed pool cannot be told from a live one through its
// accessors; its figures read what Attribute says, no memory. A collector
// keeps its object reachable: unregister it when the object is closed. No
// package of the library imports this one: it sits above them all, beside
// kvcache and ipc, and only programs (examples/kvcache serves /metrics)
// choose to expose what it collects.
package metrics
