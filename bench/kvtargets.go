package bench

// The KV cache's serving targets, side by side in one run: this cache
// against the paged scheme on the same trace, model, budget and prices,
// for every trace, model and budget of the matrix.

import (
	"fmt"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/serving"
)

// KVTargetModels and KVTargetBudgets are the matrix's models and budgets.
var (
	KVTargetModels  = []string{"llama3-8b", "qwen2.5-7b", "mistral-7b", "deepseek-v3"}
	KVTargetBudgets = []uint64{16 * units.GiB, 80 * units.GiB}
)

// KVTrace is one trace of the matrix: its name and requests.
type KVTrace struct {
	Name     string
	Requests []serving.Request
}

// KVTargetTraces are the matrix's traces: mooncake (its first n
// requests, from the file at mooncakePath) and each generated shape of
// serving.RequestShapes, n requests drawn from seed.
func KVTargetTraces(mooncakePath string, n int, seed uint64) ([]KVTrace, error) {
	if n < 1 {
		return nil, errors.Wrapf(driver.ErrInvalid, "bench: kv targets: %d requests a trace, want at least 1", n)
	}
	reqs, err := serving.ParseRequestsFile(mooncakePath)
	if err != nil {
		return nil, err
	}
	traces := []KVTrace{{Name: "mooncake", Requests: reqs[:min(n, len(reqs))]}}
	for _, shape := range serving.RequestShapes {
		reqs, err := serving.RequestTrace{Shape: shape, Seed: seed, Requests: n}.Generate()
		if err != nil {
			return nil, err
		}
		traces = append(traces, KVTrace{Name: shape, Requests: reqs})
	}
	return traces, nil
}

// KVTarget is one cell of the matrix: this cache and the paged scheme.
type KVTarget struct {
	Trace, Model string
	Budget       uint64
	Cache, Paged serving.Result
	// tokenBytes is the model's KV a token.
	tokenBytes uint64
}

// KVTargetRun is how the matrix's cells are run: the driver calls'
// prices (Costs), and serving.Options' AdmitAhead (both schemes
// scheduled a step ahead; false: each step after the last, kv
// simulate's default), WarmBudget (this cache's page pool warmed before
// serving with the budget, kv simulate's default --warm budget; false:
// with a step's tokens, --warm step) and WaitForNone (no step waits for
// exposed driver time: what of a gap the exposed time makes).
type KVTargetRun struct {
	Costs                               sim.CallCosts
	AdmitAhead, WarmBudget, WaitForNone bool
}

// KVTargetCell simulates one cell, run as run says: this cache (the
// layout kvcache.PickLayout picks for the model, mapping ahead, drop
// preemption, admitting for the prompt, as vmarena kv simulate runs it by
// default) and the paged scheme, steps priced by serving.A100.
func KVTargetCell(tr KVTrace, model string, budget uint64, run KVTargetRun) (KVTarget, error) {
	m, err := serving.ModelPreset(model)
	if err != nil {
		return KVTarget{}, err
	}
	cfg := serving.Config{Model: m, Budget: budget, MaxSeqs: 256, BlockTokens: serving.DefaultBlockTokens}
	cfg.MaxContext = serving.FitMaxContext(tr.Requests, cfg)
	opts := serving.Options{Config: cfg, Steps: serving.A100, Prices: run.Costs, AdmitAhead: run.AdmitAhead, WarmBudget: run.WarmBudget, WaitForNone: run.WaitForNone}
	cell := KVTarget{Trace: tr.Name, Model: model, Budget: budget, tokenBytes: m.TokenBytes()}
	cache, err := serving.NewCache(cfg, serving.CacheOptions{Layout: kvcache.AutoLayout})
	if err != nil {
		return cell, err
	}
	cell.Cache, err = serving.Simulate(tr.Requests, cache, opts)
	if err = errors.CombineErrors(err, cache.Close()); err != nil {
		return cell, errors.Wrapf(err, "bench: kv targets: %s, %s, %s", tr.Name, model, units.Bytes(budget))
	}
	paged, err := serving.NewBlockTable(cfg)
	if err != nil {
		return cell, err
	}
	cell.Paged, err = serving.Simulate(tr.Requests, paged, opts)
	return cell, errors.Wrapf(err, "bench: kv targets: %s, %s, %s", tr.Name, model, units.Bytes(budget))
}

// KVTargetHeader is the table's first row; Row a cell's.
var KVTargetHeader = []string{"trace", "model", "budget", "preempt cache/paged", "waste % cache/paged", "waste % target", "waste MiB cache/paged",
	"TTFT ÷ paged", "output/s ÷ paged", "failed resumes", "exposed drv ÷ GPU", "admission drv ÷ prefill", "CPU ÷ paged"}

// Row is the cell's line of the table: its figures and ratios to the
// paged scheme's (TTFT below 1 and output rate above 1 are better).
func (k KVTarget) Row() []string {
	c, p := k.Cache, k.Paged
	return []string{k.Trace, k.Model, units.Bytes(k.Budget),
		fmt.Sprintf("%d / %d", c.Preemptions, p.Preemptions),
		fmt.Sprintf("%.3f / %.3f", 100*c.WasteFraction(), 100*p.WasteFraction()),
		fmt.Sprintf("%.3f", 100*k.WasteTarget()),
		fmt.Sprintf("%.2f / %.2f", c.MeanWaste/float64(units.MiB), p.MeanWaste/float64(units.MiB)),
		ratio(c.MeanTTFT.Seconds(), p.MeanTTFT.Seconds()),
		ratio(c.OutputPerSecond(), p.OutputPerSecond()),
		fmt.Sprint(c.FailedResumes),
		fmt.Sprintf("%.3f%%", 100*c.ExposedShare()),
		fmt.Sprintf("%.3f%%", 100*c.AdmissionShare()),
		ratio(c.CPUTime.Seconds(), p.CPUTime.Seconds()),
	}
}

// kvTargetPage is the page this cache runs on in the matrix (its
// default, the sim driver's recommended granularity).
const kvTargetPage = 2 * units.MiB

// WasteTarget is the most this cache's waste fraction may be: the paged
// scheme's where a page holds at most a block of tokens (16), else that
// plus half a page for each running sequence (its tail, on average), over
// the cache's mean memory in use.
func (k KVTarget) WasteTarget() float64 {
	c, p := k.Cache, k.Paged
	if k.tokenBytes == 0 || kvTargetPage/k.tokenBytes <= serving.DefaultBlockTokens || c.MeanInUse == 0 {
		return p.WasteFraction()
	}
	return p.WasteFraction() + 0.5*float64(kvTargetPage)*c.MeanSeqs/c.MeanInUse
}

// KVTargetsMet counts, over cells, those that meet each target.
type KVTargetsMet struct {
	Cells                                        int
	Preemptions, Waste, WasteBytes, TTFT, Output int
	FailedResumes                                int
	Exposed, Admission, CPU                      int
}

// Met counts the targets each cell meets: preemptions at most the paged
// scheme's, waste at most WasteTarget (and, apart, the mean bytes of
// waste at most the paged scheme's: where forks share a prompt's pages
// the memory in use, the fraction's denominator, shrinks more than the
// waste), TTFT at most and output rate at
// least the paged scheme's, no failed resume, exposed driver time at most
// 1% of GPU time and admissions' at most 1% of their prefill, the cache's
// CPU at most 5 times the paged scheme's.
func Met(cells []KVTarget) KVTargetsMet {
	m := KVTargetsMet{Cells: len(cells)}
	b := func(ok bool) int {
		if ok {
			return 1
		}
		return 0
	}
	for _, k := range cells {
		c, p := k.Cache, k.Paged
		m.Preemptions += b(c.Preemptions <= p.Preemptions)
		m.Waste += b(c.WasteFraction() <= k.WasteTarget())
		m.WasteBytes += b(c.MeanWaste <= p.MeanWaste)
		m.TTFT += b(c.MeanTTFT <= p.MeanTTFT)
		m.Output += b(c.OutputPerSecond() >= p.OutputPerSecond())
		m.FailedResumes += b(c.FailedResumes == 0)
		m.Exposed += b(c.ExposedShare() <= 0.01)
		m.Admission += b(c.AdmissionShare() <= 0.01)
		m.CPU += b(c.CPUTime <= 5*p.CPUTime)
	}
	return m
}

// String is the counts in a line.
func (m KVTargetsMet) String() string {
	return fmt.Sprintf("targets met, of %d cells: preemptions <= paged %d, waste <= target %d (waste bytes <= paged %d), TTFT <= paged %d, output/s >= paged %d, "+
		"no failed resume %d, exposed driver <= 1%% of GPU %d, admission driver <= 1%% of prefill %d, CPU <= 5x paged %d",
		m.Cells, m.Preemptions, m.Waste, m.WasteBytes, m.TTFT, m.Output, m.FailedResumes, m.Exposed, m.Admission, m.CPU)
}

// ratio is a / b to three places, "—" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.3f", a/b)
}

// KVTargetTotals adds up CPU and wall time over cells: the cache's and
// the paged scheme's own CPU (thread clock) and the simulations' wall
// time.
func KVTargetTotals(cells []KVTarget) (cacheCPU, pagedCPU, wall time.Duration) {
	for _, c := range cells {
		cacheCPU += c.Cache.CPUTime
		pagedCPU += c.Paged.CPUTime
		wall += c.Cache.WallTime + c.Paged.WallTime
	}
	return cacheCPU, pagedCPU, wall
}
