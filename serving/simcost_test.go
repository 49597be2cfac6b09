package serving

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
)

// checkDriver checks what must hold of any result's driver figures: the
// priced time is the calls times the prices, steps waited for at most
// all of it, the background is a part of it, and the clock is the steps'
// GPU time, the idle gaps and at most the exposed time.
func checkDriver(t *testing.T, res Result, costs sim.CallCosts) {
	t.Helper()
	d := res.Driver
	require.Equal(t, d.Calls.Time(costs), d.Time, "priced time = calls x prices")
	require.LessOrEqual(t, d.Exposed, d.Time)
	require.LessOrEqual(t, d.Background, d.Time)
	require.LessOrEqual(t, d.Admission, d.Time)
	require.GreaterOrEqual(t, res.SimTime, res.GPUTime)
	require.GreaterOrEqual(t, res.CPUTime, time.Duration(0))
	if !d.Counted {
		require.Equal(t, DriverCost{}, d, "a baseline makes no driver call while it serves")
	}
	if d.MapAhead == 0 {
		require.Zero(t, d.Background)
	}
}

// TestSimulateDriverByHand: one request, a 16-token prompt and 20 output
// tokens (35 of KV, three pages), on this cache with 16-token pages
// (four in the budget) mapping 16 tokens ahead, every step 10 ms. The
// cache warms its pool before serving (Startup: four creates, what the
// budget holds), so each page it then takes is a map and an access: the
// prompt's and the next, mapped ahead, by the Append of its admission,
// on the step's path; two more during the steps before the decode
// reaches them, hidden when they cost less than the step, their excess
// exposed when they cost more. Without mapping ahead nothing is warmed
// and the step waits for every call whole: a create for each of the
// three pages, and the same maps and accesses. With WaitForNone the same
// calls are counted exposed, and no step waits for them.
func TestSimulateDriverByHand(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 16, Output: 20}}
	page := sim.Calls{Map: 1, SetAccess: 1}
	waitForNone := false
	run := func(costs sim.CallCosts, noAhead bool) Result {
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB, NoMapAhead: noAhead})
		res, err := Simulate(reqs, k, Options{Config: cfg, MaxBatchedTokens: 1000, Steps: tenMs, Prices: costs, CheckEvery: 1, WaitForNone: waitForNone})
		require.NoError(t, err)
		checkDriver(t, res, costs)
		require.True(t, res.Driver.Counted)
		require.Equal(t, 20, res.Steps)
		require.Equal(t, 200*time.Millisecond, res.GPUTime)
		require.Equal(t, 1, res.Admissions)
		require.Equal(t, [2]int{0, 0}, [2]int{res.FailedAdmits, res.FailedResumes})
		return res
	}
	cheap := sim.CallCosts{Name: "1 ms a call", Create: time.Millisecond, Map: time.Millisecond, SetAccess: time.Millisecond}
	dear := sim.CallCosts{Name: "8 ms a call", Create: 8 * time.Millisecond, Map: 8 * time.Millisecond, SetAccess: 8 * time.Millisecond}

	res := run(cheap, false)
	calls := res.Driver.Calls
	require.Equal(t, sim.Calls{Create: 4, Map: 4, SetAccess: 4}, calls, "the pool's four pages, each then mapped with its access")
	require.Equal(t, sim.Calls{Create: 4}.Time(cheap), res.Driver.Startup)
	require.Equal(t, 2*page.Time(cheap), res.Driver.Admission, "the prompt's page and the next, on the admission's path")
	require.Equal(t, 2*page.Time(cheap), res.Driver.Background, "the decode's next pages, during the steps before")
	require.Equal(t, res.Driver.Admission, res.Driver.Exposed, "the rest hidden behind the 10 ms step")
	require.Equal(t, res.GPUTime+res.Driver.Exposed, res.SimTime)
	require.Equal(t, res.Driver.Exposed, res.MeanTTFT-10*time.Millisecond, "the first step waits for the admission's pages")
	require.Equal(t, tenMs.time(tinyModel, stepWork{seqs: 1}), res.PrefillTime)

	res = run(dear, false)
	require.Equal(t, calls, res.Driver.Calls)
	require.Equal(t, 2*page.Time(dear), res.Driver.Background)
	require.Equal(t, 2*page.Time(dear)+2*(page.Time(dear)-10*time.Millisecond), res.Driver.Exposed,
		"the admission's two pages, and twice 16 ms of background behind a 10 ms step: 6 ms exposed each")
	require.Equal(t, res.GPUTime+res.Driver.Exposed, res.SimTime)

	res = run(dear, true)
	require.Equal(t, sim.Calls{Create: 3, Map: 4, SetAccess: 4}, res.Driver.Calls, "no pool warmed: a create a page")
	require.Zero(t, res.Driver.MapAhead)
	require.Zero(t, res.Driver.Startup)
	require.Equal(t, res.Driver.Time, res.Driver.Exposed, "no mapping ahead: every call waited for")
	require.Equal(t, res.GPUTime+res.Driver.Exposed, res.SimTime)
	waited := res

	waitForNone = true
	res = run(dear, true)
	require.Equal(t, waited.Driver, res.Driver, "WaitForNone: the same calls, priced and counted as exposed")
	require.Equal(t, res.GPUTime, res.SimTime, "but no step waits for them")
	require.Equal(t, 10*time.Millisecond, res.MeanTTFT)
	waitForNone = false

	res = run(sim.CallCosts{}, false)
	require.Equal(t, calls, res.Driver.Calls, "free prices: counted all the same")
	require.Zero(t, res.Driver.Time)
	require.Equal(t, 200*time.Millisecond, res.SimTime)
}

// TestSimulateDriverTraceSlices: the first 100 requests (8 in 32 slots
// under the race detector or the invariants tag) of the Mooncake
// slice, llama3-8b in 16 GiB, A100 prices: whatever the figures, they
// hold together (checkDriver), mapping ahead (and the pool it warms) exposes
// no more than without it, and the baselines make no driver call.
func TestSimulateDriverTraceSlices(t *testing.T) {
	reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", "mooncake_synthetic_trace.jsonl"))
	require.NoError(t, err)
	// Every change checks every slot under the invariants tag, and the
	// race detector slows the arena's books twentyfold (one goroutine:
	// it has nothing to find): a few requests in 32 slots there.
	n, seqs := 100, 256
	if race.Enabled || invariants.Enabled {
		n, seqs = 8, 32
	}
	reqs = reqs[:min(len(reqs), n)]
	cfg := Config{Model: mustPreset(t, "llama3-8b"), Budget: 16 * units.GiB, MaxSeqs: seqs}
	cfg.MaxContext = FitMaxContext(reqs, cfg)
	opts := Options{Config: cfg, Prices: sim.A100}
	var with, without Result
	for _, noAhead := range []bool{false, true} {
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, NoMapAhead: noAhead})
		res, err := Simulate(reqs, k, opts)
		require.NoError(t, err)
		checkDriver(t, res, sim.A100)
		require.Positive(t, res.Driver.Calls.Total())
		if noAhead {
			without = res
		} else {
			with = res
		}
	}
	require.Positive(t, with.Driver.Background)
	require.Positive(t, with.Driver.Startup, "mapping ahead, the pool is warmed before serving")
	require.Zero(t, without.Driver.Startup)
	require.LessOrEqual(t, with.Driver.Exposed, without.Driver.Exposed)
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	st, err := NewStaticReservation(cfg)
	require.NoError(t, err)
	for _, sc := range []Scheme{tbl, st} {
		res, err := Simulate(reqs, sc, opts)
		require.NoError(t, err)
		checkDriver(t, res, sim.A100)
		require.False(t, res.Driver.Counted)
	}
}

// TestSimulateBadPrices: a negative driver price is refused before
// anything runs.
func TestSimulateBadPrices(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	_, err = Simulate([]Request{{Input: 16, Output: 1}}, tbl, Options{Config: cfg, Prices: sim.CallCosts{Name: "odd", Unmap: -1}})
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, `driver call prices "odd": a negative price`)
	require.Equal(t, Stats{}, tbl.Stats(), "nothing ran")
}

func mustPreset(t *testing.T, name string) Model {
	t.Helper()
	m, err := ModelPreset(name)
	require.NoError(t, err)
	return m
}

// TestSimulateAdmitAhead: A's 32-token prompt takes two 16-token steps,
// and B, queued behind it, gets its prompt in the third. Scheduling a
// step ahead, A's second page is reserved during the first step and B is
// admitted, its page reserved, during the second: those calls hide
// behind the 10 ms steps; the pool's first pages are warmed before
// serving starts (Startup, on no step's path). With every call dearer
// than a step, what exceeds the step is exposed, and nothing is warmed
// during a step. The paged scheme, with no driver call, runs the same
// schedule.
func TestSimulateAdmitAhead(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 32, Output: 2, Blocks: []int64{1, 2}}, {Input: 16, Output: 2, Blocks: []int64{3}}}
	run := func(costs sim.CallCosts, ahead bool) Result {
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
		res, err := Simulate(reqs, k, Options{Config: cfg, MaxBatchedTokens: 16, Steps: tenMs, Prices: costs, CheckEvery: 1, AdmitAhead: ahead})
		require.NoError(t, err)
		checkDriver(t, res, costs)
		require.Equal(t, 2, res.Finished)
		require.Equal(t, 2, res.Admissions)
		return res
	}
	// Hidden time is behind GPU time: never more than there is of it (no
	// idle gap here, both arrive at once).
	hidden := func(res Result) {
		t.Helper()
		require.LessOrEqual(t, res.Driver.Time-res.Driver.Startup-res.Driver.Exposed, res.GPUTime)
		require.LessOrEqual(t, res.SimTime, res.GPUTime+res.Driver.Exposed) // the last frees: after the last step
	}
	cheap := sim.CallCosts{Name: "1 ms a call", Create: time.Millisecond, Map: time.Millisecond, SetAccess: time.Millisecond, Unmap: time.Millisecond}
	off, on := run(cheap, false), run(cheap, true)
	hidden(off)
	hidden(on)
	// The same calls, on other paths — but for the kept mappings (of
	// the prefix store units freed slots leave mapped) that the pool's
	// warming a step ahead unmaps before an eviction would need it to.
	offCalls, onCalls := off.Driver.Calls, on.Driver.Calls
	require.GreaterOrEqual(t, onCalls.Unmap, offCalls.Unmap)
	offCalls.Unmap, onCalls.Unmap = 0, 0
	require.Equal(t, offCalls, onCalls, "the same calls, on other paths")
	require.Zero(t, off.Driver.Ahead, "the pool's warming during a step is the cache's background, not the scheduler's")
	require.Positive(t, on.Driver.Ahead)
	require.Positive(t, on.Driver.Startup)
	require.Equal(t, on.Driver.Startup, off.Driver.Startup, "a cache that maps ahead warms its pool before serving either way")
	require.LessOrEqual(t, on.Driver.Ahead, on.Driver.Time-on.Driver.Startup)
	require.Less(t, on.Driver.Exposed, off.Driver.Exposed)
	require.Less(t, on.MeanTTFT, off.MeanTTFT)
	require.Less(t, on.SimTime, off.SimTime)

	dear := sim.CallCosts{Name: "20 ms a call", Create: 20 * time.Millisecond, Map: 20 * time.Millisecond, SetAccess: 20 * time.Millisecond, Unmap: 20 * time.Millisecond}
	res := run(dear, true)
	hidden(res)
	// The same calls but the kept mappings' unmaps the warming makes
	// ahead: a step has no time left for any (no call fits in it).
	dearCalls := res.Driver.Calls
	require.LessOrEqual(t, dearCalls.Unmap, on.Driver.Calls.Unmap)
	dearCalls.Unmap = 0
	require.Equal(t, onCalls, dearCalls)
	require.Greater(t, res.Driver.Exposed, res.Driver.Time-res.Driver.Startup-res.GPUTime-time.Nanosecond, "what the steps cannot hide is exposed")

	bt, err := NewBlockTable(cfg)
	require.NoError(t, err)
	paged, err := Simulate(reqs, bt, Options{Config: cfg, MaxBatchedTokens: 16, Steps: tenMs, CheckEvery: 1, AdmitAhead: true})
	require.NoError(t, err)
	checkDriver(t, paged, sim.CallCosts{})
	require.Equal(t, on.Steps, paged.Steps, "the same schedule")
	require.Equal(t, on.GPUTime, paged.GPUTime)
	require.Equal(t, paged.GPUTime, paged.SimTime)
}

// TestWarmFitsTheStep: warming the pool during a step adds no more pages
// than the step's time left pays for (at the dearer of a create and an
// unmap), so that the calls never outlast the step: 3.5 ms left at 1 ms
// a create is 3 pages, and what was pending first leaves less; less than
// a create's time left makes no call.
func TestWarmFitsTheStep(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 1 * units.MiB, MaxContext: 64, MaxSeqs: 4}
	k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
	prices := sim.CallCosts{Name: "1 ms a create", Create: time.Millisecond, Unmap: 500 * time.Microsecond}
	s := &simulation{opts: Options{Config: cfg, MaxBatchedTokens: 256, Prices: prices, AdmitAhead: true}, scheme: k, drv: k}
	pooled := func() int { return k.cache.Stats().PooledPages }

	require.NoError(t, s.warm(3500*time.Microsecond, false))
	require.Equal(t, 3, pooled())
	require.Equal(t, 3*time.Millisecond, s.pendingBg)
	s.pendingBg = 0

	s.pendingBg = 2 * time.Millisecond // other calls made ahead first
	require.NoError(t, s.warm(3500*time.Microsecond, false))
	require.Equal(t, 4, pooled(), "1.5 ms left: one page more")
	require.Equal(t, 3*time.Millisecond, s.pendingBg)

	s.pendingBg = 0
	require.NoError(t, s.warm(999*time.Microsecond, false))
	require.Equal(t, 4, pooled(), "no time for a create: no call")
	require.Zero(t, s.pendingBg)

	// In an idle gap the same bound, against the foreground pending.
	require.NoError(t, s.warm(2*time.Millisecond, true))
	require.Equal(t, 6, pooled())
	require.Equal(t, 2*time.Millisecond, s.pendingFg)
	require.Equal(t, uint64(6), s.res.Driver.Calls.Create)

	// Unpriced creates: no bound but the tokens' pages (256 tokens of
	// 1 KiB in 16 KiB pages: 16, and one a chunk straddles).
	k2 := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
	s2 := &simulation{opts: Options{Config: cfg, MaxBatchedTokens: 256, AdmitAhead: true}, scheme: k2, drv: k2}
	require.NoError(t, s2.warm(time.Nanosecond, false))
	require.Equal(t, 17, k2.cache.Stats().PooledPages)
}

// TestReserveDecodesEvictsAhead: with the budget full — a finished
// request's prompt cached, a decoding one's page — the decode whose next
// token crosses into a new page gets it from the step ahead's
// reservation of one token past its context, which
// evicts a cached unit a step ahead, and its Append then makes no driver
// call; without the reservation the Append evicts and maps on the
// step's path.
func TestReserveDecodesEvictsAhead(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 48 * units.KiB, MaxContext: 48, MaxSeqs: 4} // 3 pages of 16 tokens
	run := func(reserve bool) (kvcache.Stats, sim.Calls) {
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
		a, b := simReq(0, 32, 1), simReq(1, 16, 4)
		_, err := k.Admit(a)
		require.NoError(t, err)
		require.NoError(t, k.Append(a, 32))
		require.NoError(t, k.Computed(a))
		require.NoError(t, k.Finish(a))
		_, err = k.Admit(b)
		require.NoError(t, err)
		require.NoError(t, k.Append(b, 16))
		require.NoError(t, k.Computed(b))
		before := k.cache.Stats()
		require.Equal(t, 2, before.CachedPages, "a's two units cached")
		require.Equal(t, 3, before.PagesCommitted, "the budget full")
		if reserve {
			got, err := k.Reserve(b, 1) // one past the context, as the step ahead reserves a decode's
			require.NoError(t, err)
			require.Equal(t, 1, got)
			require.Equal(t, 1, k.cache.Stats().Evictions, "one cached unit evicted ahead")
		}
		b.context++ // the token the step generated
		calls := k.DriverCalls()
		require.NoError(t, k.Append(b, 1))
		return k.cache.Stats(), k.DriverCalls().Sub(calls)
	}
	st, calls := run(true)
	require.Zero(t, calls.Total(), "the decode's page was reserved: no call on its path")
	require.Equal(t, 1, st.CachedPages)
	st, calls = run(false)
	require.Positive(t, calls.Map, "without it the decode's Append commits its page")
	require.Equal(t, 1, st.Evictions, "the same unit evicted, on the path")
	require.Equal(t, 1, st.CachedPages)
}

// unmapWarmer is a scheme whose warm readies a page with one unmap (an
// idle slot's page taken into the pool, a kept mapping unmapped ahead)
// as far as most bounds it, of want pages in all.
type unmapWarmer struct {
	*Cache
	want, ready int
	calls       sim.Calls
	asked       []int
	failAt      int // the round that fails (0: none)
}

func (u *unmapWarmer) warm(n, most int) (bool, error) {
	u.asked = append(u.asked, most)
	if len(u.asked) == u.failAt {
		return false, driver.ErrOutOfMemory
	}
	add := min(u.want, most) - u.ready
	if add > 0 {
		u.ready += add
		u.calls.Unmap += uint64(add)
	}
	return most < u.want, nil
}

func (u *unmapWarmer) DriverCalls() sim.Calls { return u.calls }

// TestWarmRoundsUseTheTimeLeft: where the pages a warm readies cost
// unmaps, not the creates its first round was bounded by, it asks again
// with the time left, so that a step's time readies as many pages as it
// pays for; it stops once the scheme has what it wanted, and a scheme
// that cannot say gets one round.
func TestWarmRoundsUseTheTimeLeft(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 1 * units.MiB, MaxContext: 64, MaxSeqs: 4}
	k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
	prices := sim.CallCosts{Name: "1 ms a create, 0.1 ms an unmap", Create: time.Millisecond, Unmap: 100 * time.Microsecond}
	u := &unmapWarmer{Cache: k, want: 1000}
	s := &simulation{opts: Options{Config: cfg, MaxBatchedTokens: 256, Prices: prices, AdmitAhead: true}, scheme: u, drv: u}
	require.NoError(t, s.warm(10*time.Millisecond, false))
	// 10 pages at the dearer price (1 ms of unmaps), then 9 more with
	// the 9 ms left, 8 with the 8.1 ms left, ...
	require.Equal(t, []int{10, 19, 27, 34, 40, 46, 51, 55, 59, 63, 66, 69, 72, 74, 76, 78}, u.asked, "16 rounds, each with the time the last left")
	require.Equal(t, 78, u.ready)
	require.Equal(t, time.Duration(78)*prices.Unmap, s.pendingBg, "within the step's 10 ms")

	u2 := &unmapWarmer{Cache: k, want: 15}
	s2 := &simulation{opts: Options{Config: cfg, MaxBatchedTokens: 256, Prices: prices, AdmitAhead: true}, scheme: u2, drv: u2}
	require.NoError(t, s2.warm(10*time.Millisecond, false))
	require.Equal(t, []int{10, 19}, u2.asked, "the second round had all it wanted")
	require.Equal(t, 15, u2.ready)

	// A round's error ends the warm with it.
	u3 := &unmapWarmer{Cache: k, want: 1000, failAt: 3}
	s3 := &simulation{opts: Options{Config: cfg, MaxBatchedTokens: 256, Prices: prices, AdmitAhead: true}, scheme: u3, drv: u3}
	require.ErrorIs(t, s3.warm(10*time.Millisecond, false), driver.ErrOutOfMemory)
	require.Len(t, u3.asked, 3, "no round after the failed one")
	require.Equal(t, 19, u3.ready)
}
