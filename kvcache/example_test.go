package kvcache_test

import (
	"fmt"
	"log"
	"os"
	"time"

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

// KV events for a router, as JSON lines: a prompt's whole page is stored
// once written, and Close clears everything.
func ExampleEventWriter() {
	drv, err := host.New(host.Options{Capacity: 16 << 20, Granularity: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := kvcache.Preset("tiny")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.BlockTokens = 256, 2, 64<<10, 8 // 32 tokens a page
	w := &kvcache.EventWriter{W: os.Stdout}
	cfg.Events = func(b kvcache.EventBatch) {
		b.TS = time.Unix(1764219600, 0) // a fixed time for the example's output
		w.Write(b)
	}
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		log.Fatal(err)
	}
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = i
	}
	s, err := c.Admit(prompt, 0)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Append(prompt); err != nil {
		log.Fatal(err)
	}
	// ... the model writes the rows ...
	if err := s.MarkWritten(s.Len()); err != nil {
		log.Fatal(err)
	}
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// {"ts":1764219600.000000,"events":[{"type":"BlockStored","block_hashes":[6387597345427159372],"parent_block_hash":null,"token_ids":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31],"block_size":32,"lora_id":null,"medium":"GPU","lora_name":null}]}
	// {"ts":1764219600.000000,"events":[{"type":"AllBlocksCleared"}]}
}
