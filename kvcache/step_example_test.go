package kvcache_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// A serving engine's decode loop: one Cache.Step a step for the whole
// batch, handing back per sequence the address of its slot, its length
// and the row the step writes; the kernels write token p of layer l's K
// at Base + RowOffset(l, 0, p).
func ExampleCache_Step() {
	drv, err := host.New(host.Options{Capacity: 16 << 20, Granularity: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	cfg, err := kvcache.Preset("tiny")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.Layout = 256, 3, 64<<10, kvcache.TokenMajor
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var batch []kvcache.StepRequest
	for i := range 3 { // three requests, prefilled
		prompt := []int{100 * (i + 1), 100*(i+1) + 1, 100*(i+1) + 2}
		s, err := c.Admit(prompt, 0)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := s.Append(prompt[s.Len():]); err != nil {
			log.Fatal(err)
		}
		batch = append(batch, kvcache.StepRequest{Seq: s, Tokens: make([]int, 1)})
	}
	var out []kvcache.SeqStep
	for token := range 20 { // twenty decode steps
		for i := range batch {
			batch[i].Tokens[0] = 7000 + token // the token each sampled
		}
		if out, err = c.Step(batch, out); err != nil {
			log.Fatal(err)
		}
	}
	for _, s := range out {
		fmt.Printf("slot %d (Cache.Base%+#x): %d tokens; the step wrote position %d, layer 0's K at SeqStep.Base%+#x\n",
			s.Seq.Slot(), uint64(s.Base-c.Base()), s.Len, s.Pos, c.RowOffset(0, 0, s.Pos))
	}
	// Output:
	// slot 0 (Cache.Base+0x0): 23 tokens; the step wrote position 22, layer 0's K at SeqStep.Base+0x51000
	// slot 1 (Cache.Base+0x400000): 23 tokens; the step wrote position 22, layer 0's K at SeqStep.Base+0x51000
	// slot 2 (Cache.Base+0x800000): 23 tokens; the step wrote position 22, layer 0's K at SeqStep.Base+0x51000
}
