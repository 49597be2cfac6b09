package serving_test

import (
	"fmt"
	"log"
	"time"

	"github.com/vmarena/vmarena/serving"
)

// Serve three requests with the paged baseline on a model preset and a
// 1 GiB KV budget: each a prompt arriving at its time, generating its
// output tokens, steps priced as on an A100. llama3-8b's KV is 128 KiB a
// token, so 1 GiB holds 8,192 tokens: the third request waits until the
// first two have finished, and at most two run at once.
func Example() {
	reqs := []serving.Request{
		{Arrival: 0, Input: 2000, Output: 100},
		{Arrival: 10 * time.Millisecond, Input: 500, Output: 300},
		{Arrival: 20 * time.Millisecond, Input: 8000, Output: 50},
	}
	m, err := serving.ModelPreset("llama3-8b")
	if err != nil {
		log.Fatal(err)
	}
	cfg := serving.Config{Model: m, Budget: 1 << 30, MaxSeqs: 16, BlockTokens: serving.DefaultBlockTokens}
	cfg.MaxContext = serving.FitMaxContext(reqs, cfg)
	paged, err := serving.NewBlockTable(cfg)
	if err != nil {
		log.Fatal(err)
	}
	res, err := serving.Simulate(reqs, paged, serving.Options{Config: cfg, Steps: serving.A100})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Scheme, res.Finished, "finished,", res.Preemptions, "preempted, peak", res.PeakSeqs, "running")
	// Output:
	// paged (vLLM) 3 finished, 0 preempted, peak 2 running
}
