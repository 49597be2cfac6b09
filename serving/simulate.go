package serving

// The serving simulation: continuous batching over a request trace, one KV
// scheme at a time.

import (
	"runtime"
	"slices"
	"time"

	"github.com/cockroachdb/errors"

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
	// Requests is the trace's requests: Finished ran to their last output
	// token, Refused never ran (longer than MaxContext, or an empty
	// prompt).
	Requests, Finished, Refused int
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
// batching, the scheme holding the KV, and measures it.
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
// scheme whose Check fails before it starts (a zero value).
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
	opts.defaults()
	s := &simulation{
		opts:   opts,
		scheme: scheme,
		all:    make([]SimRequest, len(reqs)),
		res:    Result{Scheme: scheme.Name(), Requests: len(reqs)},
	}
	for i, r := range reqs {
		s.all[i] = SimRequest{id: i, req: r, context: r.Input}
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
	all    []SimRequest

	now time.Duration
	// next is the index in all of the next request to arrive.
	next int
	// waiting is the queue, its front first; running are the admitted
	// sequences in the order they were admitted.
	waiting []*SimRequest
	running []*SimRequest
	// done counts the requests finished or refused.
	done int
	// batch is this step's sequences and their token counts.
	batch []scheduled
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
	seqSecs, inUseSecs, wasteSecs, savedSecs, cachedSecs float64
	ttft                                                 []time.Duration
	rec                                                  *recorder // Options.Record only
}

type scheduled struct {
	r *SimRequest
	n int
}

func (s *simulation) run() error {
	cfg := s.opts.Config
	for s.done < len(s.all) {
		s.arrive()
		if len(s.running) == 0 && len(s.waiting) == 0 {
			if s.next == len(s.all) {
				break
			}
			gap := s.all[s.next].req.Arrival - s.now
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
			n := min(r.context-r.computed, budget)
			for {
				m := s.enter()
				err := s.scheme.Append(r, n)
				s.appended(s.leave(m), n, false, r.context-r.computed > 1, err == nil)
				if err == nil {
					break
				}
				if !errors.Is(err, driver.ErrOutOfMemory) {
					return err
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
			var held int
			var err error
			m = s.enter()
			if r.preempted {
				held, err = s.scheme.Resume(r)
			} else {
				held, err = s.scheme.Admit(r)
			}
			s.foreground(s.leave(m), true)
			if errors.Is(err, driver.ErrOutOfMemory) {
				s.failedAdmission(r)
				break // CanAdmit agreed, the scheme did not: r waits
			}
			if err != nil {
				return err
			}
			if held < 0 || held >= r.context {
				return errors.AssertionFailedf("serving: %s holds %d tokens of request %d at admission, want 0 to %d",
					s.res.Scheme, held, r.id, r.context-1)
			}
			s.waiting = s.waiting[1:]
			s.res.Admissions++
			var prefill stepWork
			prefill.add(cfg.Model, held, r.context-held)
			s.res.PrefillTime += s.opts.Steps.time(cfg.Model, prefill)
			r.state, r.computed = simRunning, held
			s.running = append(s.running, r)
			n := min(r.context-r.computed, budget)
			m = s.enter()
			err = s.scheme.Append(r, n)
			s.appended(s.leave(m), n, true, true, err == nil)
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
		dt := exposed + gpu
		s.slack = gpu
		s.sample(dt)
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

// arrive queues the requests that have arrived by now, refusing those no
// sequence can hold.
func (s *simulation) arrive() {
	for s.next < len(s.all) && s.all[s.next].req.Arrival <= s.now {
		r := &s.all[s.next]
		s.next++
		if r.req.Input == 0 || r.req.Input+r.req.Output > s.opts.Config.MaxContext {
			r.state = simRefused
			s.res.Refused++
			s.done++
			continue
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
	marker, marks := s.scheme.(kvWriter)
	for _, b := range s.batch {
		r := b.r
		if marks {
			m := s.enter()
			err := marker.Computed(r)
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
			}
		}
		if r.generated == r.req.Output {
			m := s.enter()
			err := s.scheme.Finish(r)
			s.foreground(s.leave(m), true)
			if err != nil {
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
