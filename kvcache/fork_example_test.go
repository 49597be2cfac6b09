package kvcache_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Two samples of one prompt: the fork maps the parent's pages at its own
// slot instead of copying them, and the partly written last page is
// copied once, by the first side to append there.
func ExampleSeq_Fork() {
	drv, err := host.New(host.Options{Capacity: 16 << 20, Granularity: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	cfg, err := kvcache.Preset("tiny")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.Layout = 256, 2, 64<<10, kvcache.TokenMajor
	cfg.MapAhead = -1 // no mapping ahead: the figures below are exact
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	prompt := []int{1, 2, 3, 4, 5}
	s, err := c.Admit(prompt, 0)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Append(prompt[s.Len():]); err != nil {
		log.Fatal(err)
	}
	// ... the prefill writes the rows Append handed out ...
	if err := s.MarkWritten(s.Len()); err != nil { // a fork shares written rows only
		log.Fatal(err)
	}
	kid, err := s.Fork() // same tokens, same bytes, its own slot
	if err != nil {
		log.Fatal(err)
	}
	if _, err := kid.Append([]int{6}); err != nil { // each side goes on on its own
		log.Fatal(err)
	}
	if _, err := s.Append([]int{7}); err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Println(kid.Len(), s.Len(), "tokens;", st.Forks, "fork,", st.CowCopies, "page copied on write")
	// Output:
	// 6 6 tokens; 1 fork, 1 page copied on write
}
