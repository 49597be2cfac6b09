package kvcache_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// A KV cache for a small model: each sequence has address space for its
// whole context, and pages are committed as its tokens arrive. A second
// sequence with the same prompt maps the first one's prompt pages at its
// own addresses instead of computing them again.
func Example() {
	drv, err := host.New(host.Options{Capacity: 16 << 20, Granularity: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := kvcache.Preset("tiny") // 4 layers, 8 KV heads of 64, float32
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxContext, cfg.MaxSeqs = 1024, 4
	cfg.PageSize = 64 << 10 // 32 tokens a page in each layer's K and V
	cfg.MapAhead = -1       // no mapping ahead: the figures below are exact
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		log.Fatal(err)
	}

	prompt := make([]int, 40) // the token IDs of a system prompt
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	a, err := c.Admit(prompt, 0)
	if err != nil {
		log.Fatal(err)
	}
	step, err := a.Append(prompt[a.Len():]) // room for the prompt's keys and values
	if err != nil {
		log.Fatal(err)
	}
	for _, layer := range step.Layers {
		for _, rows := range layer {
			for _, t := range []*tensor.Tensor{rows.K, rows.V} {
				d, err := tensor.Data[float32](t) // the cache's memory, no copy
				if err != nil {
					log.Fatal(err)
				}
				for i := range d {
					d[i] = 0.5 // what the model computed
				}
			}
		}
	}
	if err := a.MarkWritten(a.Len()); err != nil { // written: its whole prompt pages can be shared
		log.Fatal(err)
	}
	k, err := a.K(0) // layer 0's keys, [tokens, heads, dim]
	if err != nil {
		log.Fatal(err)
	}
	// 40 tokens: 2 pages of 32 tokens in each of 8 regions (K and V of 4 layers).
	fmt.Println(k.Shape(), c.Stats().PagesCommitted, "pages")

	if _, err := a.Append([]int{7}); err != nil { // a decode step
		log.Fatal(err)
	}

	b, err := c.Admit(prompt, 0) // the same prompt: its whole pages are shared
	if err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Println(b.Matched(), "tokens matched,", st.SharedPages, "pages shared")

	if err := b.Free(); err != nil {
		log.Fatal(err)
	}
	if err := a.Free(); err != nil {
		log.Fatal(err)
	}
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// [40 8 64] 16 pages
	// 32 tokens matched, 8 pages shared
}
