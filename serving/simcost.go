package serving

// What a scheme costs an engine beyond memory: its driver calls, priced
// and split into the time steps wait for and the time mapping ahead hides
// behind them, and the CPU its own books take.

import (
	"math"
	"time"

	"github.com/vmarena/vmarena/driver/sim"
)

// driverCounted is a scheme whose memory a sim driver holds, which counts
// its calls (Cache). The baselines are not: they allocate their pool
// once, before serving, and make no driver call while they serve.
type driverCounted interface {
	// DriverCalls is every driver call the scheme has made so far.
	DriverCalls() sim.Calls
	// MapAhead is the tokens of room past each running sequence that the
	// scheme's mapping ahead keeps committed in the background (0: none).
	MapAhead() int
}

// DriverCost is what a scheme's driver calls cost over a simulation,
// priced by Options.Prices. Every call but those made before serving
// starts (Startup) is on the path of one step or another:
//
//   - background: an Append of a sequence that ran in the step before, of
//     at most MapAhead tokens (a decode), whose calls only commit memory
//     (no Unmap, no Release: no reclaim or eviction, which mapping ahead
//     never does). Mapping ahead would have made those calls during the
//     step before, while the GPU computed it; the step waits only for
//     what exceeds that step's GPU time (and any idle time after it).
//   - foreground: every other call — Admit, Resume, an Append of a
//     sequence admitted in the same step or of more than MapAhead tokens
//     (a prompt chunk), one that had to make room, Preempt, Finish —
//     which the scheduler makes between steps, and the next step waits
//     for whole (an idle gap before it hides what it can).
//
// Exposed is what steps waited for: it is added to the simulated clock
// (each step takes its GPU time plus it), so TTFT and throughput pay for
// it. Time = Background + the foreground's + Startup, and Exposed <= Time.
type DriverCost struct {
	// Counted says the scheme's calls were counted (a scheme on the sim
	// driver); false for the baselines, whose fields are all 0.
	Counted bool
	// Prices names the table that priced the calls.
	Prices string
	// MapAhead is the scheme's mapping-ahead window in tokens; 0 when off,
	// and then every call is foreground.
	MapAhead int
	// Calls counts the scheme's driver calls by kind, Time prices them.
	Calls sim.Calls
	Time  time.Duration
	// Background is the time of the calls mapping ahead makes during a
	// step; Exposed what steps waited for.
	Background, Exposed time.Duration
	// Admission is the time of the calls of admissions: Admit and Resume,
	// the Appends of prompt chunks and recomputes, Preempt and Finish,
	// and those of them made a step ahead (admissions, prompt chunks'
	// reservations, frees; not the pool's warming, the marks of what a
	// step writes or the decodes' reservations).
	Admission time.Duration
	// Ahead is the time of the calls made a step ahead
	// (Options.AdmitAhead): admissions during the step before, prompt
	// chunks' and decodes' reservations, frees, the marks of what a step
	// writes and the pool's warming; what of it hides is in Background,
	// and the admissions', chunks' and frees' in Admission. Without
	// AdmitAhead a scheme that maps ahead warms its pool during each step
	// too, as its own background work: in Background, not here.
	Ahead time.Duration
	// Startup is the time of the calls made before serving starts (with
	// Options.AdmitAhead, or where the scheme maps ahead): the pool a
	// scheme that warms fills then, with the budget (Options.WarmBudget)
	// or a step's pages, as the paged and
	// static schemes allocate theirs before serving (unpriced, making no
	// call while serving). In Time, never exposed.
	Startup time.Duration
}

// ExposedShare is the exposed driver time over the steps' GPU time.
func (r Result) ExposedShare() float64 {
	if r.GPUTime <= 0 {
		return 0
	}
	return r.Driver.Exposed.Seconds() / r.GPUTime.Seconds()
}

// AdmissionShare is the admissions' driver time over their prefill time
// (PrefillTime): what an admission pays the driver for each second of
// computing its prompt.
func (r Result) AdmissionShare() float64 {
	if r.PrefillTime <= 0 {
		return 0
	}
	return r.Driver.Admission.Seconds() / r.PrefillTime.Seconds()
}

// AdmissionDriverTime is the mean driver time of an admission.
func (r Result) AdmissionDriverTime() time.Duration {
	if r.Admissions == 0 {
		return 0
	}
	return r.Driver.Admission / time.Duration(r.Admissions)
}

// clockCost is what reading the thread clock around a call costs the
// call's account: the tail of the first read and the head of the second,
// about one clock_gettime system call, which for a scheme whose calls
// take a hundred nanoseconds (the paged scheme's) would be most of what
// is charged. It is measured on the thread in the same run, the least
// of a few rounds of empty brackets, and taken off each call's charge.
func clockCost() time.Duration {
	const rounds, pairs = 8, 64
	best := time.Duration(math.MaxInt64)
	for range rounds {
		var sum time.Duration
		for range pairs {
			t0 := threadCPU()
			sum += threadCPU() - t0
		}
		best = min(best, sum/pairs)
	}
	return max(best, 0)
}

// callMark is what a scheme had counted before a call: Simulate's
// account of the call is the difference after it.
type callMark struct {
	calls sim.Calls
	cpu   time.Duration
}

// enter marks the start of a call of the scheme's. The thread clock is
// read last, so that reading the driver's counts is not charged to the
// scheme.
func (s *simulation) enter() callMark {
	var m callMark
	if s.drv != nil {
		m.calls = s.drv.DriverCalls()
	}
	m.cpu = threadCPU()
	return m
}

// leave charges the scheme the thread CPU time since m, and counts and
// returns the driver calls it made.
func (s *simulation) leave(m callMark) sim.Calls {
	s.res.CPUTime += max(threadCPU()-m.cpu-s.clockCost, 0)
	if s.drv == nil {
		return sim.Calls{}
	}
	d := s.drv.DriverCalls().Sub(m.calls)
	s.res.Driver.Calls = s.res.Driver.Calls.Add(d)
	return d
}

// foreground prices calls the next step waits for; admission says they
// are an admission's.
func (s *simulation) foreground(c sim.Calls, admission bool) {
	t := c.Time(s.opts.Prices)
	s.res.Driver.Time += t
	s.pendingFg += t
	if admission {
		s.res.Driver.Admission += t
	}
}

// background prices calls mapping ahead makes during the step before.
func (s *simulation) background(c sim.Calls) {
	t := c.Time(s.opts.Prices)
	s.res.Driver.Time += t
	s.res.Driver.Background += t
	s.pendingBg += t
}

// aheadCalls prices calls made during the step being computed, for the
// next (Options.AdmitAhead): admissions', reservations' and frees',
// and the marks of what the step writes. They hide behind at most window
// of the step's GPU time (all of it, or what is left of it after a
// request's arrival), and share the step with the next step's mapping
// ahead (pendingBg against slack); the rest is exposed. admission says
// they are an admission's.
func (s *simulation) aheadCalls(c sim.Calls, window time.Duration, admission bool) {
	t := c.Time(s.opts.Prices)
	hid := min(t, max(window, 0))
	s.res.Driver.Time += t
	s.res.Driver.Background += hid
	s.pendingBg += hid
	s.pendingFg += t - hid
	s.res.Driver.Ahead += t
	if admission {
		s.res.Driver.Admission += t
	}
}

// appended accounts an Append of n tokens to r: background when mapping
// ahead covers it (see DriverCost), foreground else. fresh says r was
// admitted in this step; prefill that the tokens are a prompt chunk or a
// recompute, not a decode.
func (s *simulation) appended(c sim.Calls, n int, fresh, prefill, ok bool) {
	ahead := s.res.Driver.MapAhead
	if ok && ahead > 0 && !fresh && n <= ahead && c.Unmap == 0 && c.Release == 0 {
		s.background(c)
		return
	}
	s.foreground(c, prefill)
}

// exposed is what the next step waits for, of the driver time pending
// (the background part hidden behind the slack, the step before's GPU
// time), and clears it.
func (s *simulation) exposed() time.Duration {
	e := s.pendingFg + max(0, s.pendingBg-s.slack)
	s.pendingFg, s.pendingBg = 0, 0
	return e
}

// idle is a gap of dt with nothing running: it hides pending driver time.
func (s *simulation) idle(dt time.Duration) {
	hid := min(s.pendingFg, dt)
	s.pendingFg -= hid
	s.slack += dt - hid
}
