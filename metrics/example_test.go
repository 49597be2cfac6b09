package metrics_test

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// A KV cache's figures in a registry of the program's own, as promhttp
// would serve them (promhttp.HandlerFor(reg, promhttp.HandlerOpts{})):
// one sequence of 100 tokens runs in a cache of a 64 MiB budget (in the
// token-major layout, and without mapping ahead, so that nothing moves the
// figures while they print).
func ExampleNewKVCacheCollector() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	drv, err := sim.New(sim.Options{Capacity: 1 << 30})
	must(err)
	cfg, err := kvcache.Preset("llama3-8b")
	must(err)
	cfg.MaxContext, cfg.MaxSeqs, cfg.Budget, cfg.MapAhead, cfg.Layout = 4096, 8, 64<<20, -1, kvcache.TokenMajor
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	must(err)

	col, err := metrics.NewKVCacheCollector("llama3-8b", c)
	must(err)
	reg := prometheus.NewRegistry()
	must(metrics.Register(reg, col))

	s, err := c.Admit(make([]int, 100), 0)
	must(err)
	_, err = s.Append(make([]int, 100))
	must(err)

	mfs, err := reg.Gather()
	must(err)
	for _, mf := range mfs {
		switch mf.GetName() {
		case "vmarena_kvcache_usage_ratio", "vmarena_kvcache_sequences", "vmarena_kvcache_used_bytes":
			_, err := expfmt.MetricFamilyToText(os.Stdout, mf)
			must(err)
		}
	}
	fmt.Println(c.Stats().UsedBytes == 100*2*32*8*128*2) // tokens × K,V × layers × heads × dim × fp16
	must(s.Free())
	must(c.Close())
	must(drv.Close())
	// Output:
	// # HELP vmarena_kvcache_sequences Live sequences, by state: running, or preempted (swapped or dropped, waiting to resume).
	// # TYPE vmarena_kvcache_sequences gauge
	// vmarena_kvcache_sequences{name="llama3-8b",state="preempted"} 0
	// vmarena_kvcache_sequences{name="llama3-8b",state="running"} 1
	// # HELP vmarena_kvcache_usage_ratio used_bytes over budget_bytes: the budget's share holding running sequences' tokens (vLLM's kv_cache_usage_perc, SGLang's token_usage; cached prefix pages count as free, as evictable).
	// # TYPE vmarena_kvcache_usage_ratio gauge
	// vmarena_kvcache_usage_ratio{name="llama3-8b"} 0.1953125
	// # HELP vmarena_kvcache_used_bytes Committed bytes that hold a token of a running sequence, each once however many sequences map it.
	// # TYPE vmarena_kvcache_used_bytes gauge
	// vmarena_kvcache_used_bytes{name="llama3-8b"} 1.31072e+07
	// true
}
