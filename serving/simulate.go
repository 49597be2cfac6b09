package serving

// The serving simulation: continuous batching over a request trace, one KV
// scheme at a time.

import (
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/isnil"
)

// DefaultMaxBatchedTokens is the tokens one step computes at most: vLLM
// V1's max_num_batched_tokens for its OpenAI server on a large GPU.
const DefaultMaxBatchedTokens = 8192

// maxBatchedTokens bounds Options.MaxBatchedTokens.
const maxBatchedTokens = 1 << 24

// Options configure Simulate.
type Options struct {
	// Config is the model, budget and limits the scheme was built from.
	Config Config
	// MaxBatchedTokens is the most tokens a step computes, prompt chunks
	// and decodes together (0: DefaultMaxBatchedTokens).
	MaxBatchedTokens int
	// Steps prices the steps (the zero value: A100).
	Steps StepModel
	// Prices prices the driver calls of a scheme on the sim driver
	// (Result.Driver); the zero value makes every call free (counted
	// all the same). vmarena kv simulate prices by sim.A100, or sim.H100.
	Prices sim.CallCosts
	// Progress, if set, is called every ProgressSteps steps and once at the
	// end, on Simulate's goroutine. A panic in it ends the simulation with
	// an error (driver.ErrInvalid).
	Progress func(Progress)
	// CheckEvery runs the scheme's Check every CheckEvery steps and at the
	// end; 0 never does.
	CheckEvery int
	// Record keeps, for reports, what the scheme held at each step
	// (Result.Timeline).
	Record bool
	// AdmitAhead schedules a step ahead, as an engine whose scheduler
	// runs while the GPU computes (vLLM's async scheduling): when a
	// step's token budget ran out with requests waiting, the request at
	// the front of the queue is admitted (or resumed) during that step,
	// if the scheme agrees, and scheduled from the next; and a scheme
	// that can reserve (Cache: kvcache's Seq.Reserve) commits, during
	// the step, the pages of the next prompt chunk of that request and of
	// every sequence the step prefills. Those calls are made before the
	// step's end — before its sequences finish or publish what it
	// computed — and their driver time is background, behind the step's
	// GPU time (what exceeds it, with the next decodes' mapping ahead,
	// is exposed). The requests that finish at a step's end are freed
	// during the next step, behind its GPU time too, and such a scheme
	// warms its page pool (Cache.Warm) with a step's tokens' memory
	// while the step's time, or an idle gap, lasts (as a scheme that maps
	// ahead does without AdmitAhead too, as its own background work,
	// after the step's Appends). Both schemes run
	// the same scheduler; the paged scheme reserves nothing (its blocks
	// cost no driver call, and its pool is allocated before serving).
	AdmitAhead bool
	// WarmBudget has a scheme that warms its page pool (mapping ahead, or
	// with AdmitAhead) fill it before serving with the whole budget's
	// memory, as vLLM allocates its KV tensors at start-up and as the
	// paged and static schemes allocate their pools then — at most the
	// memory of every token of every request (the most the run can hold;
	// a step's tokens' if that is more), so a budget larger than the
	// trace creates nothing it never maps. A hybrid cache's groups share
	// it by the bytes a token keeps in each, a window group's at most
	// its slots' windows (kvcache's Hybrid.WarmBudget): a share the mix
	// of sequences proves wrong is taken back by the group that needs
	// it, as the free budget would be. Serving then maps pages the pool
	// holds rather than create them, whatever the page size. The CLI
	// gives the hybrid cache this only with --warm budget. False warms a step's tokens' memory before serving,
	// and the rest as steps and idle gaps pay for it: memory is created
	// as the load first needs it (an engine that shares the device).
	// The calls are in Result.Driver.Startup either way.
	WarmBudget bool
	// WaitForNone has steps wait for none of the driver time that would
	// be exposed: it is priced and counted (Result.Driver.Exposed) as
	// ever, but the simulated clock does not move for it. No engine runs
	// so; it is for telling what of a gap in TTFT or output rate the
	// exposed time makes, since a step that starts a fraction of a
	// millisecond later can take a request that arrived meanwhile and so
	// change every step after it.
	WaitForNone bool
}

// ProgressSteps is how many steps pass between calls of
// Options.Progress.
const ProgressSteps = 1 << 12

// Progress is how far a simulation has got.
type Progress struct {
	Scheme string
	// Done counts the requests finished or refused, of Total.
	Done, Total int
	// Now is the simulated time.
	Now time.Duration
	// Running and Waiting are the requests running and queued.
	Running, Waiting int
	// Steps counts the steps run.
	Steps int
}

// Result is what a simulation measured of one scheme. Means are over
// simulated time, from the first arrival to the end of the last step
// (idle gaps between requests included, as the scheme holds them), peaks
// are the largest value any step saw.
type Result struct {
	// Scheme is the scheme's Name.
	Scheme string
	// Requests is the sequences served: one a trace request, n for a
	// request of n samples (Request.N), Samples of them the samples beyond
	// the first. Finished ran to their last output token, Refused never
	// ran (longer than MaxContext, or an empty prompt).
	Requests, Samples, Finished, Refused int
	// Forks counts the samples started as forks of their request's first
	// (a scheme that forks), FailedForks those the scheme refused to fork,
	// queued as requests of their own.
	Forks, FailedForks int
	// Preemptions counts the sequences preempted to make room.
	Preemptions int
	// Steps counts the steps run.
	Steps int
	// SimTime is the simulated time, WallTime what the simulation took.
	SimTime, WallTime time.Duration
	// PeakSeqs and MeanSeqs are the sequences running (holding KV) at once.
	PeakSeqs int
	MeanSeqs float64
	// The scheme's Stats over time: the memory in use by running
	// sequences, its waste (InUse - Stored), what sharing saved (Logical -
	// Stored) and the memory kept for reuse (Cached), in bytes.
	PeakInUse, PeakWaste, PeakSaved, PeakCached uint64
	MeanInUse, MeanWaste, MeanSaved, MeanCached float64
	// PeakAhead and MeanAhead are the bytes the calls made a step ahead
	// (Options.AdmitAhead) committed during a step for the next one:
	// the scheme's Stats are sampled as a step starts, so that memory is
	// in the InUse of the step whose tokens it holds, not of the step
	// during which it was committed; these say how much that was.
	PeakAhead uint64
	MeanAhead float64
	// TTFT is each request's time to first token (arrival to the end of the
	// step that produced it), for the requests that produced one: mean,
	// median and 99th percentile.
	MeanTTFT, MedianTTFT, P99TTFT time.Duration
	// ComputedTokens counts the tokens whose KV a step computed: prompts
	// (less their cached prefixes), recomputations and decodes.
	ComputedTokens int64
	// OutputTokens counts the output tokens produced.
	OutputTokens int64
	// Stats is the scheme's at the end.
	Stats Stats
	// GPUTime is the steps' time as Steps prices them; SimTime is that,
	// the idle gaps and the driver time the steps waited for
	// (Driver.Exposed).
	GPUTime time.Duration
	// Driver is what the scheme's driver calls cost (see DriverCost).
	Driver DriverCost
	// CPUTime is the thread CPU time of the scheme's own calls (CanAdmit,
	// Admit, Resume, Append, Computed, Preempt, Finish; not Stats or Check,
	// which only the simulation asks for): its books' cost to an engine's
	// scheduler, less what reading the clock costs (measured in the run,
	// see clockCost). 0 where no thread clock is read (off Linux). On the
	// sim driver it includes the driver's own books, which stand in for
	// a real driver's CPU (priced in Driver.Time).
	CPUTime time.Duration
	// Admissions counts the Admit and Resume calls that succeeded;
	// FailedAdmits and FailedResumes those CanAdmit agreed to that then
	// failed for want of memory, in the call itself or in the Append of
	// the first chunk (the request went back to the queue).
	Admissions, FailedAdmits, FailedResumes int
	// PrefillTime is, summed over admissions, the time a step of the
	// admitted request's prompt (or recompute) alone takes, as Steps
	// prices it: what Driver.Admission compares with.
	PrefillTime time.Duration
	// Timeline is what the scheme held over the simulation
	// (Options.Record only; nil otherwise).
	Timeline *Timeline
}

// WasteFraction is the time-averaged waste over the time-averaged
// memory in use: the share of the KV memory in use holding no token.
func (r Result) WasteFraction() float64 {
	if r.MeanInUse == 0 {
		return 0
	}
	return r.MeanWaste / r.MeanInUse
}

// CommitsPerSecond is the scheme's commits over simulated time.
func (r Result) CommitsPerSecond() float64 {
	if r.SimTime <= 0 {
		return 0
	}
	return float64(r.Stats.Commits) / r.SimTime.Seconds()
}

// PrefixHitFraction is the share of the tokens looked up in the prefix
// cache that were found.
func (r Result) PrefixHitFraction() float64 {
	if r.Stats.PrefixQueried == 0 {
		return 0
	}
	return float64(r.Stats.PrefixHit) / float64(r.Stats.PrefixQueried)
}

// OutputPerSecond is output tokens over simulated time.
func (r Result) OutputPerSecond() float64 {
	if r.SimTime <= 0 {
		return 0
	}
	return float64(r.OutputTokens) / r.SimTime.Seconds()
}

func (o *Options) defaults() {
	o.Config.defaults()
	if o.MaxBatchedTokens == 0 {
		o.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if o.Steps == (StepModel{}) {
		o.Steps = A100
	}
}

// checkCallersRequest refuses (driver.ErrInvalid) reqs[i] where it breaks
// what the trace readers guarantee (Request): an Input or Output below 0
// or over MaxTokens, an Arrival below 0 or over MaxArrival, or one before
// the request ahead of it. A caller's list is checked as a file is: a
// negative Output never finished, and the loop served it forever.
func checkCallersRequest(reqs []Request, i int) error {
	r := reqs[i]
	bad := func(format string, args ...any) error {
		return errors.Wrapf(driver.ErrInvalid, "request %d: "+format, append([]any{i}, args...)...)
	}
	switch {
	case r.Input < 0 || r.Input > MaxTokens:
		return bad("a prompt of %d tokens, want 0 to %d", r.Input, MaxTokens)
	case r.Output < 0 || r.Output > MaxTokens:
		return bad("an output of %d tokens, want 0 to %d", r.Output, MaxTokens)
	case r.Arrival < 0 || r.Arrival > MaxArrival:
		return bad("arrives at %v, want 0 to %v", r.Arrival, MaxArrival)
	case i > 0 && r.Arrival < reqs[i-1].Arrival:
		return errors.WithHint(bad("arrives at %v, before request %d's %v", r.Arrival, i-1, reqs[i-1].Arrival),
			"requests must come in arrival order (slices.SortStableFunc by Arrival)")
	}
	return nil
}

// Check refuses options no simulation can run with, with driver.ErrInvalid:
// a Config that Config.Check refuses, MaxBatchedTokens out of range, a
// negative price (of a step or of a driver call) or CheckEvery.
func (o Options) Check() error {
	o.defaults()
	if err := o.Config.Check(); err != nil {
		return err
	}
	s := o.Steps
	switch {
	case o.MaxBatchedTokens < 1 || o.MaxBatchedTokens > maxBatchedTokens:
		return errors.Wrapf(driver.ErrInvalid, "serving: %d tokens a step, want 1 to %d", o.MaxBatchedTokens, maxBatchedTokens)
	case !(s.PeakFLOPS >= 0) || !(s.Bandwidth >= 0) || s.StepOverhead < 0 || s.SeqOverhead < 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: step model %q: a negative or NaN price", s.Name)
	case o.Prices.Reserve < 0 || o.Prices.Unreserve < 0 || o.Prices.Create < 0 || o.Prices.Release < 0 ||
		o.Prices.Map < 0 || o.Prices.Unmap < 0 || o.Prices.SetAccess < 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: driver call prices %q: a negative price", o.Prices.Name)
	case o.CheckEvery < 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: check every %d steps, want 0 (never) or more", o.CheckEvery)
	}
	return nil
}

// Simulate serves reqs (a trace, in arrival order) with continuous
// batching, the scheme holding the KV, and measures it. A list that is not
// what the trace readers return (Request: an Input or Output out of 0 to
// MaxTokens, an Arrival out of 0 to MaxArrival or before the one ahead of
// it) is refused, driver.ErrInvalid, before anything runs.
//
// Each request arrives at its Arrival and waits in a queue. A request
// whose prompt and output together exceed MaxContext, or whose prompt is
// empty, is refused then. Each step, as vLLM V1's scheduler does:
//
//  1. the running sequences, in the order they were admitted, each get
//     their next tokens while the step's MaxBatchedTokens last: one to
//     decode, or the next chunk of a prompt (chunked prefill). When the
//     scheme cannot hold them, the latest admitted sequence is preempted
//     (it may be the one growing) and goes back to the front of the queue;
//  2. if no sequence was preempted, waiting requests are admitted in
//     order while the budget of tokens lasts, fewer than MaxSeqs run and
//     the scheme's CanAdmit agrees; the first it refuses stops admission
//     (first come, first served). A new request starts from the prefix the
//     scheme holds (Admit), a preempted one from what it kept (Resume), and
//     gets its first chunk in the same step. (vLLM V1 admits when the
//     first chunk fits; asking room for the whole context, as V0 did and
//     kvcache's CanAdmit does, admits no sequence that its own prompt
//     would have to preempt.)
//  3. the step waits for the driver time it is exposed to (DriverCost:
//     none for a baseline, nor with free Prices), then takes the time
//     opts.Steps prices it at; then each sequence
//     whose context is all computed produces a token (its first ends its
//     time to first token), and one that produced its last finishes and is
//     freed (its last token's KV is never computed: a request keeps at most
//     Input+Output-1 tokens).
//
// With nothing running and nothing admissible, time skips to the next
// arrival. The scheme's Stats are sampled once a step (and over each idle
// gap), weighted by the step's time.
//
// An error from the scheme other than driver.ErrOutOfMemory from Append,
// Admit or Resume ends the simulation and is returned, as is a request the scheme will not
// admit with nothing running (it could never run; Config.Check keeps
// the baselines from that). A nil scheme is an error marked
// driver.ErrInvalid, as are options Options.Check refuses; so is a
// scheme whose Check fails before it starts (a zero value), a request
// whose N is out of range, and a trace whose samples beyond one a
// request pass MaxSampledSequences (what it would build is bounded).
//
// A request of n samples (Request.N) is n sequences of one prompt, each
// generating Output tokens of its own (the samples' prompt tokens are
// equal, their outputs distinct). On a scheme that forks (Cache:
// kvcache.Seq.Fork; HybridCache: kvcache.HybridSeq.Fork), the first
// sample computes the prompt and, as it
// produces its first token, the others start as its forks, each with a
// first token of its own from the same logits (their TTFT is its): they
// share every page the prompt fills and copy only its last, partly
// written one at their first Append. A fork the scheme refuses (no room
// for that copy, no free slot) queues the sample as a request of its
// own, which finds the prompt in the prefix store. On the other schemes
// the n samples arrive as n requests of one prompt, as vLLM V1 serves
// parallel sampling, and share the prompt through their prefix caches.
func Simulate(reqs []Request, scheme Scheme, opts Options) (Result, error) {
	if isnil.Is(scheme) {
		return Result{}, errors.Wrap(driver.ErrInvalid, "serving: simulate: the scheme is nil")
	}
	if err := opts.Check(); err != nil {
		return Result{}, err
	}
	if err := scheme.Check(); err != nil {
		return Result{}, errors.Wrapf(err, "serving: simulate %s: the scheme's books are wrong before it starts", scheme.Name())
	}
	if pc, ok := scheme.(prefillChunker); ok {
		steps := opts.MaxBatchedTokens
		if steps == 0 {
			steps = DefaultMaxBatchedTokens
		}
		if steps > pc.PrefillChunk() {
			return Result{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: simulate %s: steps of up to %d tokens, past the scheme's prefill chunk of %d",
				scheme.Name(), steps, pc.PrefillChunk()), "make the scheme with a PrefillChunk of at least Options.MaxBatchedTokens")
		}
	}
	extra := 0
	for i, r := range reqs {
		if err := checkCallersRequest(reqs, i); err != nil {
			return Result{}, errors.Wrapf(err, "serving: simulate %s", scheme.Name())
		}
		if r.BlockTokens < 0 || r.BlockTokens > MaxTokens {
			return Result{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: simulate %s: request %d has blocks of %d tokens, want 0 to %d",
				scheme.Name(), i, r.BlockTokens, MaxTokens), "BlockTokens is the tokens a hash id of Blocks names; 0 means BlockTokens, Mooncake's 512")
		}
		if r.N < 0 || r.N > MaxN {
			return Result{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: simulate %s: request %d has n %d, want 0 to %d",
				scheme.Name(), i, r.N, MaxN), "n is the request's parallel samples; 0 and 1 mean one sequence")
		}
		if extra += seqs(r) - 1; extra > MaxSampledSequences {
			return Result{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: simulate %s: request %d takes the samples beyond one a request past %d",
				scheme.Name(), i, MaxSampledSequences), "simulate a shorter trace, or one with fewer samples a request")
		}
	}
	opts.defaults()
	s := &simulation{
		opts:   opts,
		scheme: scheme,
		all:    make([]SimRequest, 0, len(reqs)+extra),
		res:    Result{Scheme: scheme.Name(), Requests: len(reqs) + extra, Samples: extra},
	}
	s.fork, _ = scheme.(forker)
	s.writer, _ = scheme.(kvWriter)
	s.marksScheduled = marksScheduled(scheme)
	if a, ok := scheme.(chunkAligner); ok {
		s.align = max(a.ChunkAlign(), 1)
	}
	for _, r := range reqs {
		prompt := len(s.all)
		for range seqs(r) {
			s.all = append(s.all, SimRequest{id: len(s.all), prompt: prompt, req: r, context: r.Input})
		}
		if s.fork != nil && seqs(r) > 1 {
			first := &s.all[prompt]
			for i := prompt + 1; i < len(s.all); i++ {
				first.forks = append(first.forks, &s.all[i])
			}
		}
	}
	if d, ok := scheme.(driverCounted); ok {
		s.drv = d
		s.res.Driver = DriverCost{Counted: true, Prices: opts.Prices.Name, MapAhead: max(d.MapAhead(), 0)}
	}
	// The thread clock charges the scheme's calls: they all run on this
	// thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s.clockCost = clockCost()
	if opts.Record {
		s.rec = newRecorder()
	}
	start := time.Now()
	err := s.run()
	s.res.WallTime = time.Since(start)
	if err != nil {
		return s.res, errors.Wrapf(err, "serving: simulate %s at %v (step %d)", s.res.Scheme, s.now, s.res.Steps)
	}
	if err := s.finish(); err != nil {
		return s.res, errors.Wrapf(err, "serving: simulate %s", s.res.Scheme)
	}
	return s.res, nil
}

// simulation is one run of Simulate.
type simulation struct {
	opts   Options
	scheme Scheme
	// fork is the scheme as a forker (nil: it forks no sequence).
	fork forker
	// writer is the scheme as a kvWriter (nil: it is not told), and
	// marksScheduled says it is told as each Append schedules tokens
	// (scheduled), not at the step's launch or end.
	writer         kvWriter
	marksScheduled bool
	// align is the tokens a prompt chunk that stops short of the context
	// ends at a multiple of (chunkAligner; 0 or 1: any).
	align int
	all   []SimRequest

	now time.Duration
	// next is the index in all of the next request to arrive.
	next int
	// waiting is the queue, its front first; running are the admitted
	// sequences in the order they were admitted.
	waiting []*SimRequest
	running []*SimRequest
	// done counts the requests finished or refused.
	done int
	// freeing are the requests that finished at the last step's end and
	// are freed during the next step (Options.AdmitAhead), or at once,
	// on the step's path, when an Append needs memory or nothing runs. A
	// request CanAdmit refuses waits for the next step rather than for
	// them: the admission ahead during it sees their memory.
	freeing []*SimRequest
	// batch is this step's sequences and their token counts; decodes
	// the next step's decodes whose tokens the step ahead reserves.
	batch   []scheduled
	decodes []*SimRequest
	// drv counts the scheme's driver calls (nil: a baseline). pendingFg
	// and pendingBg are the driver time of the calls made since the last
	// step, foreground and background (see DriverCost); slack is the time
	// background calls hide behind: the last step's GPU time and any idle
	// time since.
	drv                         driverCounted
	pendingFg, pendingBg, slack time.Duration
	// clockCost is taken off each call's thread CPU time (see clockCost).
	clockCost time.Duration

	res Result
	// The integrals over simulated time (in seconds) of the sequences
	// running and of the scheme's in-use, wasted, saved and cached bytes.
	seqSecs, inUseSecs, wasteSecs, savedSecs, cachedSecs, aheadSecs float64
	ttft                                                            []time.Duration
	rec                                                             *recorder // Options.Record only
}

type scheduled struct {
	r *SimRequest
	n int
}

func (s *simulation) run() error {
	cfg := s.opts.Config
	if err := s.startup(); err != nil {
		return err
	}
	for s.done < len(s.all) || len(s.freeing) > 0 {
		s.arrive()
		if len(s.running) == 0 && len(s.freeing) > 0 {
			// Nothing runs: the engine frees now, before it schedules.
			if err := s.flush(-1); err != nil {
				return err
			}
		}
		if s.done == len(s.all) {
			break
		}
		if len(s.running) == 0 && len(s.waiting) == 0 {
			if s.next == len(s.all) {
				break
			}
			gap := s.all[s.next].req.Arrival - s.now
			if err := s.warm(gap, true); err != nil {
				return err
			}
			s.sample(gap)
			s.idle(gap)
			s.now += gap
			continue
		}
		var work stepWork
		s.batch = s.batch[:0]
		budget := s.opts.MaxBatchedTokens
		preempted := false
		for i := 0; i < len(s.running) && budget > 0; i++ {
			r := s.running[i]
			n := s.chunk(r.computed, r.context, budget)
			for {
				m := s.enter()
				err := s.scheme.Append(r, n)
				marked := s.scheduled(r, err)
				s.appended(s.leave(m), n, false, r.context-r.computed > 1, err == nil)
				if marked != nil {
					return marked
				}
				if err == nil {
					break
				}
				if !errors.Is(err, driver.ErrOutOfMemory) {
					return err
				}
				if len(s.freeing) > 0 {
					// The finished requests' memory first, on the step's path.
					if err := s.flush(-1); err != nil {
						return err
					}
					continue
				}
				victim := s.running[len(s.running)-1]
				s.running = s.running[:len(s.running)-1]
				if err := s.preempt(victim); err != nil {
					return err
				}
				preempted = true
				if victim == r {
					break
				}
			}
			if r.state != simRunning {
				break // r preempted itself: it was the last
			}
			s.batch = append(s.batch, scheduled{r, n})
			work.add(cfg.Model, r.computed, n)
			budget -= n
		}
		for !preempted && len(s.waiting) > 0 && len(s.running) < cfg.MaxSeqs && budget > 0 {
			r := s.waiting[0]
			m := s.enter()
			can := s.scheme.CanAdmit(r)
			s.foreground(s.leave(m), true)
			if !can {
				break
			}
			ok, err := s.admit(r, func(c sim.Calls) { s.foreground(c, true) })
			if err != nil {
				return err
			}
			if !ok {
				break // CanAdmit agreed, the scheme did not: r waits
			}
			n := s.chunk(r.computed, r.context, budget)
			m = s.enter()
			err = s.scheme.Append(r, n)
			marked := s.scheduled(r, err)
			s.appended(s.leave(m), n, true, true, err == nil)
			if marked != nil {
				return marked
			}
			if err != nil {
				if !errors.Is(err, driver.ErrOutOfMemory) {
					return err
				}
				// CanAdmit agreed, the scheme's Append did not: back to the
				// queue, and no more admissions this step.
				s.failedAdmission(r)
				s.running = s.running[:len(s.running)-1]
				if err := s.preempt(r); err != nil {
					return err
				}
				break
			}
			s.batch = append(s.batch, scheduled{r, n})
			work.add(cfg.Model, r.computed, n)
			budget -= n
		}
		if len(s.batch) == 0 {
			if preempted {
				continue // every sequence was preempted: admit afresh
			}
			r := s.waiting[0]
			return errors.Wrapf(driver.ErrOutOfMemory, "serving: %s will not admit request %d (%d tokens of context) with nothing running: it can never run",
				s.res.Scheme, r.id, r.context)
		}
		// The step waits for the driver time it is exposed to, then
		// computes; background calls of the next one hide behind it.
		gpu := s.opts.Steps.time(cfg.Model, work)
		exposed := s.exposed()
		s.res.Driver.Exposed += exposed
		s.res.GPUTime += gpu
		if s.opts.WaitForNone {
			exposed = 0
		}
		dt := exposed + gpu
		s.slack = gpu
		s.sample(dt)
		if s.opts.AdmitAhead {
			before := s.scheme.Stats()
			if err := s.ahead(preempted, exposed, gpu); err != nil {
				return err
			}
			after := s.scheme.Stats()
			ahead := max(after.InUse+after.Cached, before.InUse+before.Cached) - (before.InUse + before.Cached)
			s.aheadSecs += float64(ahead) * dt.Seconds()
			s.res.PeakAhead = max(s.res.PeakAhead, ahead)
		} else if err := s.warm(gpu, false); err != nil {
			return err
		}
		s.now += dt
		s.res.Steps++
		if err := s.advance(); err != nil {
			return err
		}
		if s.res.Steps%ProgressSteps == 0 && s.opts.Progress != nil {
			if err := hook("Progress", func() { s.opts.Progress(s.progress()) }); err != nil {
				return err
			}
		}
		if s.opts.CheckEvery > 0 && s.res.Steps%s.opts.CheckEvery == 0 {
			if err := s.scheme.Check(); err != nil {
				return err
			}
		}
	}
	if s.opts.CheckEvery > 0 {
		return s.scheme.Check()
	}
	return nil
}

// scheduled marks the tokens Append just gave r written, as the step
// that computes them is scheduled, where the scheme is marked so
// (marksScheduled) and the Append, whose error is appended, did not
// fail. It runs inside the Append's bracket, as part of the one call the
// scheduler makes: the two are priced and charged together.
func (s *simulation) scheduled(r *SimRequest, appended error) error {
	if !s.marksScheduled || appended != nil {
		return nil
	}
	return s.writer.Computed(r)
}

// marksScheduled says Simulate marks what scheme's Appends schedule
// written at once: it is this cache, or the hybrid cache of a model with
// no recurrent layers. A request admitted later in the same pass then
// shares the whole prompt units they complete, as the paged schemes share
// the blocks their Append registers (vLLM V1 caches a request's full
// blocks in allocate_slots). That is sound because every layer of a step
// writes the whole batch's keys and values before its attention reads
// any, and a pass never preempts a request it has scheduled: victims are
// taken from running's end, past the requests scheduled so far, and a
// failed admission preempts only itself, before it is marked. A
// recurrent checkpoint is the state after the step, which a request in
// the same step cannot read: a model with recurrent layers is marked once
// the step is launched (or at its end).
func marksScheduled(scheme Scheme) bool {
	switch k := scheme.(type) {
	case *Cache:
		return true
	case *HybridCache:
		return !k.recurrent()
	}
	return false
}

// arrive queues the requests that have arrived by now, refusing those no
// sequence can hold.
func (s *simulation) arrive() { s.arriveBy(s.now) }

// arriveBy queues the requests that arrive by t.
func (s *simulation) arriveBy(t time.Duration) {
	for s.next < len(s.all) && s.all[s.next].req.Arrival <= t {
		r := &s.all[s.next]
		s.next++
		if r.req.Input == 0 || r.req.Input+r.req.Output > s.opts.Config.MaxContext {
			r.state = simRefused
			s.res.Refused++
			s.done++
			continue
		}
		if s.fork != nil && r.prompt != r.id {
			continue // a sample to fork from the first, once it has a token
		}
		s.waiting = append(s.waiting, r)
	}
}

// preempt takes r, no longer in running, out of the scheme and puts it at
// the front of the queue.
func (s *simulation) preempt(r *SimRequest) error {
	m := s.enter()
	_, err := s.scheme.Preempt(r)
	s.foreground(s.leave(m), true)
	if err != nil {
		return err
	}
	// What r still holds is what Resume will say; nothing is computed
	// until then.
	r.state, r.preempted, r.computed = simWaiting, true, 0
	s.waiting = slices.Insert(s.waiting, 0, r)
	s.res.Preemptions++
	return nil
}

// advance ends a step: the batch's tokens are computed, sequences whose
// context is all computed produce a token, and those done finish.
func (s *simulation) advance() error {
	// Marked as scheduled, or as the step started (ahead), or now.
	marks := s.writer != nil && !s.marksScheduled && !s.opts.AdmitAhead
	for _, b := range s.batch {
		r := b.r
		if marks {
			m := s.enter()
			err := s.writer.Computed(r)
			s.foreground(s.leave(m), false)
			if err != nil {
				return err
			}
		}
		r.computed += b.n
		s.res.ComputedTokens += int64(b.n)
		if r.computed < r.context {
			continue
		}
		if r.generated < r.req.Output {
			r.generated++
			r.context++
			s.res.OutputTokens++
			if r.generated == 1 {
				s.ttft = append(s.ttft, s.now-r.req.Arrival)
				if len(r.forks) > 0 {
					if err := s.forkSamples(r); err != nil {
						return err
					}
				}
			}
		}
		if r.generated == r.req.Output {
			if s.opts.AdmitAhead {
				s.freeing = append(s.freeing, r) // freed during the next step
			} else if err := s.free(r, -1); err != nil {
				return err
			}
			r.state = simFinished
			s.res.Finished++
			s.done++
		}
	}
	s.running = slices.DeleteFunc(s.running, func(r *SimRequest) bool { return r.state != simRunning })
	return nil
}

// forkSamples starts r's other samples as forks of r, which has just
// produced its first token from its computed prompt: each has a first
// token of its own (the same logits, sampled again) and runs from the
// next step. A fork the scheme refuses for want of room (ErrOutOfMemory,
// ErrBusy) or support (ErrUnsupported), or that would run more than
// MaxSeqs sequences, queues the sample, behind the queue, as a request of
// its own. A sample whose output is one token finishes here.
func (s *simulation) forkSamples(r *SimRequest) error {
	forks := r.forks
	r.forks = nil
	for _, c := range forks {
		var err error
		if len(s.running) >= s.opts.Config.MaxSeqs {
			// As many sequences run as a step takes: the sample waits.
			err = errors.Wrapf(driver.ErrBusy, "serving: %d sequences run", len(s.running))
		} else {
			m := s.enter()
			err = s.fork.Fork(r, c)
			s.foreground(s.leave(m), false)
		}
		if err != nil {
			if !errors.Is(err, driver.ErrOutOfMemory) && !errors.Is(err, driver.ErrBusy) && !errors.Is(err, driver.ErrUnsupported) {
				return err
			}
			s.res.FailedForks++
			s.waiting = append(s.waiting, c)
			continue
		}
		s.res.Forks++
		c.state, c.computed, c.context, c.generated = simRunning, r.computed, r.context, 1
		s.res.OutputTokens++
		s.ttft = append(s.ttft, s.now-c.req.Arrival)
		if c.generated < c.req.Output {
			s.running = append(s.running, c)
			continue
		}
		if s.opts.AdmitAhead {
			s.freeing = append(s.freeing, c)
		} else if err := s.free(c, -1); err != nil {
			return err
		}
		c.state = simFinished
		s.res.Finished++
		s.done++
	}
	return nil
}

// free finishes r in the scheme: its calls are foreground (window < 0)
// or made during a step, behind window of its GPU time.
func (s *simulation) free(r *SimRequest, window time.Duration) error {
	m := s.enter()
	err := s.scheme.Finish(r)
	if c := s.leave(m); window < 0 {
		s.foreground(c, true)
	} else {
		s.aheadCalls(c, window, true)
	}
	return err
}

// flush frees the requests that finished and are not freed yet
// (Options.AdmitAhead): all of them on the step's path (window < 0),
// or, during a step, in the order they finished while the calls made
// during it hide behind window of its GPU time — the rest wait for the
// next step (an engine frees lazily what no one waits for).
func (s *simulation) flush(window time.Duration) error {
	n := 0
	for _, r := range s.freeing {
		if window >= 0 && s.pendingBg >= window {
			break
		}
		if err := s.free(r, window); err != nil {
			return err
		}
		n++
	}
	rest := copy(s.freeing, s.freeing[n:])
	clear(s.freeing[rest:])
	s.freeing = s.freeing[:rest]
	return nil
}

// sample weighs the scheme's state and the sequences running by dt.
func (s *simulation) sample(dt time.Duration) {
	st := s.scheme.Stats()
	secs := dt.Seconds()
	n := len(s.running)
	s.seqSecs += float64(n) * secs
	s.inUseSecs += float64(st.InUse) * secs
	s.wasteSecs += float64(st.Waste()) * secs
	s.savedSecs += float64(st.Saved()) * secs
	s.cachedSecs += float64(st.Cached) * secs
	s.res.PeakSeqs = max(s.res.PeakSeqs, n)
	s.res.PeakInUse = max(s.res.PeakInUse, st.InUse)
	s.res.PeakWaste = max(s.res.PeakWaste, st.Waste())
	s.res.PeakSaved = max(s.res.PeakSaved, st.Saved())
	s.res.PeakCached = max(s.res.PeakCached, st.Cached)
	if s.rec != nil {
		s.rec.add(s.now.Seconds(), n, st)
	}
}

// failedAdmission counts an admission of r that CanAdmit agreed to and
// the scheme then refused.
func (s *simulation) failedAdmission(r *SimRequest) {
	if r.preempted {
		s.res.FailedResumes++
	} else {
		s.res.FailedAdmits++
	}
}

func (s *simulation) progress() Progress {
	return Progress{Scheme: s.res.Scheme, Done: s.done, Total: len(s.all), Now: s.now,
		Running: len(s.running), Waiting: len(s.waiting), Steps: s.res.Steps}
}

// finish turns the integrals into means and the times to first token into
// their figures, and tells the Progress hook the run is done.
func (s *simulation) finish() error {
	r := &s.res
	r.SimTime = s.now
	// The last frees: no step waits for them, but the engine's scheduler
	// does, so they count as exposed (they are not in SimTime).
	r.Driver.Exposed += s.exposed()
	if secs := s.now.Seconds(); secs > 0 {
		r.MeanSeqs = s.seqSecs / secs
		r.MeanInUse = s.inUseSecs / secs
		r.MeanWaste = s.wasteSecs / secs
		r.MeanSaved = s.savedSecs / secs
		r.MeanCached = s.cachedSecs / secs
		r.MeanAhead = s.aheadSecs / secs
	}
	if len(s.ttft) > 0 {
		slices.Sort(s.ttft)
		var sum time.Duration
		for _, d := range s.ttft {
			sum += d
		}
		r.MeanTTFT = sum / time.Duration(len(s.ttft))
		r.MedianTTFT = s.ttft[len(s.ttft)/2]
		r.P99TTFT = s.ttft[min(len(s.ttft)*99/100, len(s.ttft)-1)]
	}
	r.Stats = s.scheme.Stats()
	if s.rec != nil {
		s.rec.add(s.now.Seconds(), len(s.running), r.Stats)
		r.Timeline = s.rec.timeline()
	}
	if s.opts.Progress != nil {
		return hook("Progress", func() { s.opts.Progress(s.progress()) })
	}
	return nil
}

// kvReserver is a scheme that can commit a sequence's next tokens' memory
// ahead of the Append that holds them (Cache): Options.AdmitAhead.
type kvReserver interface {
	// Reserve commits the memory of r's next n tokens past those
	// appended, without preempting or taking a running sequence's
	// memory, and returns how many of them have it.
	Reserve(r *SimRequest, n int) (int, error)
	// Warm creates ahead, within the free budget, the memory n tokens
	// take, for the next commits to map, adding at most most pages
	// (negative: no bound).
	Warm(n, most int) error
}

// prefillChunker is a scheme that plans a prompt's prefill for chunks
// of at most PrefillChunk tokens (HybridCache): Simulate refuses steps
// larger than that.
type prefillChunker interface {
	PrefillChunk() int
}

// chunkAligner is a scheme whose prompt chunks should end at a multiple
// of ChunkAlign tokens when they stop short of the context (HybridCache
// of a model with recurrent layers: its state is checkpointed only at a
// unit boundary, so a prefill chunked anywhere else leaves no state for
// a later prompt to start from — vLLM's scheduler aligns its chunks to
// the block for the same reason, mamba_cache_mode "align").
type chunkAligner interface {
	ChunkAlign() int
}

// chunk is the tokens a sequence computed to from, of context, takes
// from a step's budget: all that is left if it fits, else the budget,
// ending at a multiple of align where that leaves any.
func (s *simulation) chunk(from, context, budget int) int {
	n := min(context-from, budget)
	if n == context-from || s.align <= 1 {
		return n
	}
	if end := (from + n) / s.align * s.align; end > from {
		return end - from
	}
	return n
}

// ahead is Options.AdmitAhead's work during a step whose batch is
// made and priced (preempted says the step preempted a sequence; it
// waits exposed, then computes for gpu), for the step after: that step's
// tokens are handed out as it will hand them out — to the running
// sequences in order, one to a decode (a sequence that finishes at this
// step's end, which an engine cannot know, counted as one), the next
// chunk to a prompt — and while budget and slots are left the front of
// the queue is admitted (or resumed) and handed its first chunk, the
// requests that arrive during the step too; every prompt chunk's pages
// are reserved. An admission is as in the step's own loop, but made
// before the step's end (with the prefix store as it stands during the
// step). The calls are background behind the step's GPU time, from the
// request's arrival on for one that arrives during the step; what they
// cannot hide behind is exposed (see aheadCalls).
func (s *simulation) ahead(preempted bool, exposed, gpu time.Duration) error {
	cfg := s.opts.Config
	res, reserves := s.scheme.(kvReserver)
	start, end := s.now+exposed, s.now+exposed+gpu
	reserve := func(r *SimRequest, n int, window time.Duration) error {
		if !reserves || n < 1 {
			return nil
		}
		m := s.enter()
		_, err := res.Reserve(r, n)
		s.aheadCalls(s.leave(m), window, true)
		return err
	}
	// The step is launched: its rows are written before any later step
	// reads them (one stream), so a scheme not marked as the step was
	// scheduled (marksScheduled) is marked now, and prefixes the step
	// computes are matchable by the admissions below, as the paged scheme
	// registers a block when it is scheduled. Then the requests that
	// finished at the last step's end are freed.
	if s.writer != nil && !s.marksScheduled {
		for _, b := range s.batch {
			if b.r.state != simRunning {
				continue
			}
			m := s.enter()
			err := s.writer.Computed(b.r)
			s.aheadCalls(s.leave(m), gpu, false)
			if err != nil {
				return err
			}
		}
	}
	if err := s.flush(gpu); err != nil {
		return err
	}
	// The next step's tokens, handed out in running's order: the decodes'
	// next tokens reserved first (the older sequences, as a scheduler
	// serves running requests in order), then the chunks. A decode's is
	// one past its context — the token the step generates, which the next
	// appends — so that one crossing a unit boundary finds its page
	// committed: where the budget is full, the eviction that makes its
	// room is made where it hides, not on the decode's path (mapping
	// ahead never evicts). The decodes' reservations are priced together,
	// as one call a step.
	done := func(i int, b *int) int {
		r := s.running[i]
		for *b < len(s.batch) && s.batch[*b].r != r {
			*b++ // the batch is in running's order
		}
		if *b < len(s.batch) {
			return r.computed + s.batch[*b].n
		}
		return r.computed
	}
	if reserves {
		s.decodes = s.decodes[:0]
		budget := s.opts.MaxBatchedTokens
		for i, b := 0, 0; i < len(s.running) && budget > 0; i++ {
			r := s.running[i]
			if d := done(i, &b); d < r.context {
				budget -= s.chunk(d, r.context, budget)
				continue
			}
			budget--
			if r.generated+1 < r.req.Output {
				// The token this step generates, which the next appends.
				s.decodes = append(s.decodes, r)
			}
		}
		if len(s.decodes) > 0 {
			var err error
			m := s.enter()
			for _, r := range s.decodes {
				if _, err = res.Reserve(r, 1); err != nil {
					break
				}
			}
			s.aheadCalls(s.leave(m), gpu, false)
			clear(s.decodes)
			if err != nil {
				return err
			}
		}
	}
	budget := s.opts.MaxBatchedTokens
	for i, b := 0, 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		d := done(i, &b)
		if d >= r.context {
			budget-- // a decode: reserved above, or mapping ahead's
			continue
		}
		n := s.chunk(d, r.context, budget)
		if err := reserve(r, n, gpu); err != nil {
			return err
		}
		budget -= n
	}
	for !preempted && budget > 0 && len(s.running) < cfg.MaxSeqs {
		if len(s.waiting) == 0 {
			s.arriveBy(min(s.nextArrival(), end-1))
			if len(s.waiting) == 0 {
				break
			}
		}
		r := s.waiting[0]
		window := end - max(start, r.req.Arrival)
		m := s.enter()
		can := s.scheme.CanAdmit(r)
		s.aheadCalls(s.leave(m), window, true)
		if !can {
			break
		}
		ok, err := s.admit(r, func(c sim.Calls) { s.aheadCalls(c, window, true) })
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		n := s.chunk(r.computed, r.context, budget)
		if err := reserve(r, n, window); err != nil {
			return err
		}
		budget -= n
	}
	return s.warm(gpu, false)
}

// warm has a scheme that can reserve create ahead, for the next
// admissions' first chunks to map, the memory of up to a step's tokens
// (MaxBatchedTokens), as much of it as the time the step (or the idle
// gap) has left hides: during a step, behind window of its GPU time,
// the other calls made ahead first (pendingBg); in an idle gap of window
// (idle: foreground, which the gap hides). The pages it may add are
// what that time pays for (warmWithin): a filler that makes a page at a
// time and stops when the step ends never delays the next step.
func (s *simulation) warm(window time.Duration, idle bool) error {
	res, ok := s.scheme.(kvReserver)
	if !ok || !s.warms() {
		return nil
	}
	pending := s.pendingBg
	if idle {
		pending = s.pendingFg
	}
	left := window - pending
	if left <= 0 {
		return nil
	}
	m := s.enter()
	err := s.warmWithin(res, left)
	if kc, ok := s.scheme.(keptClearer); ok && err == nil && s.drv != nil {
		err = s.clearKeptWithin(kc, left-s.drv.DriverCalls().Sub(m.calls).Time(s.opts.Prices))
	}
	c := s.leave(m)
	switch {
	case idle:
		s.foreground(c, false)
	case s.opts.AdmitAhead:
		s.aheadCalls(c, window, false)
	default:
		s.background(c) // the scheme's own, as its mapping ahead
	}
	return err
}

// keptClearer is a scheme whose free slots keep mappings that the next
// admission into them would unmap on its path, and that can unmap them
// ahead (Cache: kvcache's ClearKept).
type keptClearer interface {
	// ClearKept unmaps at most pages pages of them.
	ClearKept(pages int) error
}

// clearKeptWithin has kc unmap, after its warm, the kept mappings the time
// left still pays for (an unmap a page; with unpriced unmaps, all).
func (s *simulation) clearKeptWithin(kc keptClearer, left time.Duration) error {
	most := 1 << 30
	if p := s.opts.Prices.Unmap; p > 0 {
		most = int(min(left/p, 1<<30))
	}
	if most <= 0 {
		return nil
	}
	return kc.ClearKept(most)
}

// warmRounds bounds warmWithin's calls of the scheme's Warm.
const warmRounds = 16

// boundedWarmer is a scheme whose warm reports whether its bound on the
// pages it adds held it back (Cache).
type boundedWarmer interface {
	warm(n, most int) (bounded bool, err error)
}

// warmWithin has res warm its pool for a step's tokens with calls that
// take about left at most. A page costs a create or, where the budget is
// spent, an unmap (an idle slot's page taken into the pool, a kept
// mapping of what the commits would evict), as the scheme alone knows:
// each round asks for the pages the time left pays for at the dearer of
// the two, prices what the round made, and the next asks for more with
// what is left, until the scheme has all it wanted, the time is spent or
// warmRounds rounds ran (a scheme that cannot say what held it back gets
// one). A round overruns left by at most a unit's calls.
func (s *simulation) warmWithin(res kvReserver, left time.Duration) error {
	page := max(s.opts.Prices.Create, s.opts.Prices.Unmap)
	if page <= 0 || s.drv == nil {
		return res.Warm(s.opts.MaxBatchedTokens, -1) // no bound where pages cost nothing
	}
	bw, ok := res.(boundedWarmer)
	if !ok {
		if most := int(min(left/page, 1<<30)); most > 0 {
			return res.Warm(s.opts.MaxBatchedTokens, most)
		}
		return nil
	}
	most := 0
	for range warmRounds {
		more := int(min(left/page, 1<<30))
		if more == 0 {
			return nil
		}
		most += more
		before := s.drv.DriverCalls()
		bounded, err := bw.warm(s.opts.MaxBatchedTokens, most)
		if err != nil || !bounded {
			return err
		}
		left -= s.drv.DriverCalls().Sub(before).Time(s.opts.Prices)
	}
	return nil
}

// warms says the pool is warmed while the scheme serves: by the
// scheduler a step ahead (Options.AdmitAhead), or, scheduling each step
// after the last, by the scheme's own background work where it maps
// ahead (a thread that creates pages while the GPU computes, as it maps
// the decodes' next pages then). A scheme that does not map ahead makes
// every call on the step's path.
func (s *simulation) warms() bool {
	return s.opts.AdmitAhead || s.res.Driver.MapAhead > 0
}

// startup has a scheme that can warm fill its pool before serving starts,
// as an engine warms its cache when it starts and as the paged and static
// schemes allocate their pools then: with a step's pages
// (MaxBatchedTokens), or with the budget's up to every token of the
// requests (Options.WarmBudget: the uniform cache's pool, or the hybrid
// cache's groups' pools, shared by the bytes a token keeps in each). The
// calls are in Driver.Time and Driver.Startup, on no step's path and no
// admission's.
func (s *simulation) startup() error {
	res, ok := s.scheme.(kvReserver)
	if !ok || !s.warms() {
		return nil
	}
	n := s.opts.MaxBatchedTokens
	m := s.enter()
	var err error
	switch sc := s.scheme.(type) {
	case *Cache:
		if s.opts.WarmBudget {
			n = max(n, s.tokensOfAll())
		}
	case *HybridCache:
		if s.opts.WarmBudget {
			err = sc.warmBudget(max(n, s.tokensOfAll()))
		}
	}
	err = errors.CombineErrors(err, res.Warm(n, -1))
	t := s.leave(m).Time(s.opts.Prices)
	s.res.Driver.Time += t
	s.res.Driver.Startup += t
	return err
}

// tokensOfAll is every token of every sequence to serve, prompts and
// outputs (a fork's prompt counted again: a bound, not a count), up to
// maxWarmTokens: the most memory the run can hold.
func (s *simulation) tokensOfAll() int {
	var n uint64
	for _, r := range s.all {
		n += uint64(r.req.Input) + uint64(r.req.Output) // each at most MaxTokens
		if n >= maxWarmTokens {
			return maxWarmTokens
		}
	}
	return int(n)
}

// maxWarmTokens bounds the tokens Options.WarmBudget warms the pool for,
// within an int everywhere; the budget bounds the pages first (80 GiB of
// a token of 40 bytes is 2^31 tokens).
const maxWarmTokens = math.MaxInt32

// admit admits (or resumes) r, the front of the queue, which CanAdmit
// agreed to, pricing the calls with price; false when the scheme
// refused it for want of memory (r waits).
func (s *simulation) admit(r *SimRequest, price func(sim.Calls)) (bool, error) {
	var held int
	var err error
	m := s.enter()
	if r.preempted {
		held, err = s.scheme.Resume(r)
	} else {
		held, err = s.scheme.Admit(r)
	}
	price(s.leave(m))
	if errors.Is(err, driver.ErrOutOfMemory) {
		s.failedAdmission(r)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if held < 0 || held >= r.context {
		return false, errors.AssertionFailedf("serving: %s holds %d tokens of request %d at admission, want 0 to %d",
			s.res.Scheme, held, r.id, r.context-1)
	}
	s.waiting = s.waiting[1:]
	s.res.Admissions++
	model := s.opts.Config.Model
	var prefill stepWork
	prefill.add(model, held, r.context-held)
	s.res.PrefillTime += s.opts.Steps.time(model, prefill)
	r.state, r.computed = simRunning, held
	s.running = append(s.running, r)
	return true, nil
}

// nextArrival is the arrival of the next request not yet queued (past
// every time when there is none).
func (s *simulation) nextArrival() time.Duration {
	if s.next == len(s.all) {
		return time.Duration(math.MaxInt64)
	}
	return s.all[s.next].req.Arrival
}
