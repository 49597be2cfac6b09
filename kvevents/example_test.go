package kvevents_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/kvevents"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// A cache whose events a router subscribes to as it would to vLLM's: a
// PUB socket for every batch, a ROUTER socket for replays.
func Example() {
	pub, err := kvevents.New(kvevents.Options{
		Endpoint:       "tcp://127.0.0.1:0", // PUB: every batch (port 0: a free one, pub.Endpoint())
		ReplayEndpoint: "tcp://127.0.0.1:0", // ROUTER: resends from a sequence number
		Topic:          "kv",
		Rank:           new(int), // data_parallel_rank 0, as vLLM's publisher
	})
	if err != nil {
		log.Fatal(err)
	}
	drv, err := host.New(host.Options{Capacity: 16 << 20, Granularity: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := kvcache.Preset("tiny")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.BlockTokens = 256, 2, 64<<10, 8
	cfg.Events = pub.Publish
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		log.Fatal(err)
	}
	prompt := make([]int, 40)
	s, err := c.Admit(prompt, 0)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Append(prompt); err != nil {
		log.Fatal(err)
	}
	if err := s.MarkWritten(s.Len()); err != nil { // BlockStored
		log.Fatal(err)
	}
	if err := c.Close(); err != nil { // AllBlocksCleared
		log.Fatal(err)
	}
	st := pub.Stats()
	fmt.Printf("%d batches, %d events published\n", st.Batches, st.Events)
	if err := pub.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 2 batches, 2 events published
}
