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
	// Blocks counts the prompt blocks the trace names (Mooncake's
	// hash_ids, BlockTokens tokens each, the last of a prompt partial), and
	// ReusedBlocks those whose id an earlier request named already;
	// ReusedTokens is the prompt tokens in them: the most an unbounded
	// prefix cache of whole BlockTokens blocks could find. All zero for a
	// trace that names no blocks (Azure).
	Blocks, ReusedBlocks int
	ReusedTokens         int64
}

// SummarizeRequests sums up reqs.
func SummarizeRequests(reqs []Request) RequestsSummary {
	s := RequestsSummary{Requests: len(reqs)}
	if len(reqs) > 0 {
		s.Span = reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	}
	seen := map[int64]bool{}
	for _, r := range reqs {
		s.PromptTokens += int64(r.Input)
		s.OutputTokens += int64(r.Output)
		s.LongestContext = max(s.LongestContext, r.Input+r.Output)
		for i, id := range r.Blocks {
			s.Blocks++
			if seen[id] {
				s.ReusedBlocks++
				s.ReusedTokens += int64(min(r.Input-i*BlockTokens, BlockTokens))
			}
			seen[id] = true
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
