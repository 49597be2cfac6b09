package serving

// What a request trace asks of a KV cache, before any scheme serves it.

import "time"

// RequestsSummary is what a request trace asks of a KV cache.
type RequestsSummary struct {
	// Requests is the number of requests; Span the time from the first
	// arrival to the last.
	Requests int
	Span     time.Duration
	// PromptTokens and OutputTokens add up the requests' Input and Output;
	// LongestContext is the largest Input+Output.
	PromptTokens, OutputTokens int64
	LongestContext             int
	// Blocks counts the prompt blocks the trace names (Mooncake's and
	// Bailian's hash_ids, BlockTokens tokens each, the last of a prompt
	// partial), and ReusedBlocks those that an earlier request named
	// already with the same ids before them; ReusedTokens is the prompt
	// tokens in them: the most an unbounded prefix cache of whole blocks
	// could find. All zero for a trace that names no blocks (Azure,
	// BurstGPT).
	Blocks, ReusedBlocks int
	ReusedTokens         int64
	// BlockTokens is the tokens of a block (Request.BlockSize) where the
	// trace names blocks, the first such request's; 0 where it names none.
	BlockTokens int
}

// SummarizeRequests sums up reqs.
func SummarizeRequests(reqs []Request) RequestsSummary {
	s := RequestsSummary{Requests: len(reqs)}
	if len(reqs) > 0 {
		s.Span = reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	}
	// A prefix of blocks is a chain: the chain before it (0: none) and
	// its last id; chains numbers each one seen, from 1.
	type link struct {
		before int
		id     int64
	}
	chains := map[link]int{}
	for _, r := range reqs {
		s.PromptTokens += int64(r.Input)
		s.OutputTokens += int64(r.Output)
		s.LongestContext = max(s.LongestContext, r.Input+r.Output)
		bt := r.BlockSize()
		if len(r.Blocks) > 0 && s.BlockTokens == 0 {
			s.BlockTokens = bt
		}
		chain := 0
		for i, id := range r.Blocks {
			s.Blocks++
			l := link{chain, id}
			if c, ok := chains[l]; ok {
				s.ReusedBlocks++
				s.ReusedTokens += int64(max(min(r.Input-i*bt, bt), 0)) // no more than the prompt, whatever Blocks say
				chain = c
				continue
			}
			chain = len(chains) + 1
			chains[l] = chain
		}
	}
	return s
}

// ReusedFraction is ReusedTokens over PromptTokens.
func (s RequestsSummary) ReusedFraction() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return float64(s.ReusedTokens) / float64(s.PromptTokens)
}
