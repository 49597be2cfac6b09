package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/serving"
)

// TestKVTargetsMet: the waste target is the paged scheme's where a page
// holds at most a block of tokens, plus half a page a running sequence
// otherwise; Met counts each target a cell meets, by hand, the waste's
// bytes apart from its fraction.
func TestKVTargetsMet(t *testing.T) {
	const mib = float64(units.MiB)
	paged := serving.Result{Preemptions: 2, MeanInUse: 1000 * mib, MeanWaste: 10 * mib,
		MeanTTFT: time.Second, OutputTokens: 100, SimTime: time.Second, CPUTime: time.Second}
	cache := paged
	cache.MeanSeqs = 10
	// llama3-8b: 128 KiB a token, 16 a page.
	k := KVTarget{Cache: cache, Paged: paged, tokenBytes: 128 * units.KiB}
	require.InDelta(t, 0.01, k.WasteTarget(), 1e-12)
	// qwen2.5-7b: 56 KiB a token, 36 a page: half of 2 MiB for each of 10
	// sequences, over 1000 MiB.
	k.tokenBytes = 56 * units.KiB
	require.InDelta(t, 0.01+0.01, k.WasteTarget(), 1e-12)

	good := KVTarget{Cache: cache, Paged: paged, tokenBytes: 128 * units.KiB}
	bad := good
	bad.Cache.Preemptions, bad.Cache.MeanWaste, bad.Cache.MeanTTFT = 3, 11*mib, 2*time.Second
	bad.Cache.OutputTokens, bad.Cache.FailedResumes, bad.Cache.CPUTime = 99, 1, 6*time.Second
	bad.Cache.GPUTime, bad.Cache.Driver.Exposed = time.Second, 20*time.Millisecond
	bad.Cache.PrefillTime, bad.Cache.Driver.Admission = time.Second, 20*time.Millisecond
	// Forks share the prompt's pages: half the memory in use, a fifth
	// less waste, a larger fraction of it.
	forked := good
	forked.Cache.MeanInUse, forked.Cache.MeanWaste = 500*mib, 8*mib
	m := Met([]KVTarget{good, bad, forked})
	require.Equal(t, KVTargetsMet{Cells: 3, Preemptions: 2, Waste: 1, WasteBytes: 2, TTFT: 2, Output: 2, FailedResumes: 2, Exposed: 2, Admission: 2, CPU: 2}, m)
	require.Contains(t, m.String(), "targets met, of 3 cells: preemptions <= paged 2, waste <= target 1 (waste bytes <= paged 2),")
}

// TestKVTargetTracesRefuses: no requests is driver.ErrInvalid; a missing
// Mooncake file is the reader's error.
func TestKVTargetTracesRefuses(t *testing.T) {
	_, err := KVTargetTraces("../serving/testdata/requests/mooncake_synthetic_trace.jsonl", 0, 1)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = KVTargetTraces("absent.jsonl", 1, 1)
	require.ErrorContains(t, err, "absent.jsonl")
	traces, err := KVTargetTraces("../serving/testdata/requests/mooncake_synthetic_trace.jsonl", 5, 1)
	require.NoError(t, err)
	require.Len(t, traces, 1+len(serving.RequestShapes))
	for _, tr := range traces {
		require.Len(t, tr.Requests, 5, tr.Name)
	}
}

// TestForksHoldLess: on the generated parallel-sampling trace (200
// requests, half of them of 2, 4 or 8 samples), llama3-8b in 16 GiB,
// this cache forks every sample and holds less memory in use, and wastes
// fewer bytes, than the paged scheme serving the samples as requests of
// one prompt; its samples' first tokens come sooner. The figures are the
// simulation's, deterministic (docs/serving.md quotes them).
func TestForksHoldLess(t *testing.T) {
	if race.Enabled {
		t.Skip("a trace simulated on one goroutine, where the detector finds nothing; run without -race")
	}
	reqs, err := serving.RequestTrace{Shape: "parallel-sampling", Seed: 1, Requests: 200}.Generate()
	require.NoError(t, err)
	c, err := KVTargetCell(KVTrace{Name: "parallel-sampling", Requests: reqs}, "llama3-8b", 16*units.GiB, KVTargetRun{Costs: sim.A100, AdmitAhead: true, WarmBudget: true})
	require.NoError(t, err)
	const mib = float64(units.MiB)
	t.Logf("in use %.0f MiB (cache) / %.0f MiB (paged), waste %.1f / %.1f MiB, mean TTFT %v / %v, forks %d, failed %d",
		c.Cache.MeanInUse/mib, c.Paged.MeanInUse/mib, c.Cache.MeanWaste/mib, c.Paged.MeanWaste/mib,
		c.Cache.MeanTTFT, c.Paged.MeanTTFT, c.Cache.Forks, c.Cache.FailedForks)
	t.Logf("tokens computed %d (cache) / %d (paged), prefix hits %d / %d", c.Cache.ComputedTokens, c.Paged.ComputedTokens, c.Cache.Stats.PrefixHit, c.Paged.Stats.PrefixHit)
	require.Equal(t, c.Cache.Samples, c.Cache.Forks+c.Cache.FailedForks, "every sample forked or queued")
	require.Positive(t, c.Cache.Forks)
	require.Less(t, c.Cache.MeanInUse, c.Paged.MeanInUse)
	require.Less(t, c.Cache.MeanWaste, c.Paged.MeanWaste)
	require.Less(t, c.Cache.MeanTTFT, c.Paged.MeanTTFT)
	require.Equal(t, c.Paged.OutputTokens, c.Cache.OutputTokens)
}

// TestSharedDocumentsReusedInPlace: on the generated shared-prefix trace
// (200 requests, 16 documents of 4k–32k tokens under questions of their
// own), llama3-8b in 80 GiB, where the documents stay cached, an
// admission takes a free slot keeping its document, whose last
// question the step's spare time unmapped (kvcache's ClearKept), and
// reuses the document's pages in place: the admissions' driver time is
// within 1% of their prefill time. The figures are the
// simulation's, deterministic (docs/serving.md quotes them).
func TestSharedDocumentsReusedInPlace(t *testing.T) {
	if race.Enabled {
		t.Skip("a trace simulated on one goroutine, where the detector finds nothing; run without -race")
	}
	reqs, err := serving.RequestTrace{Shape: "shared-prefix", Seed: 1, Requests: 200}.Generate()
	require.NoError(t, err)
	c, err := KVTargetCell(KVTrace{Name: "shared-prefix", Requests: reqs}, "llama3-8b", 80*units.GiB, KVTargetRun{Costs: sim.A100, AdmitAhead: true, WarmBudget: true})
	require.NoError(t, err)
	t.Logf("admission driver time %.3f%% of prefill, calls %+v", 100*c.Cache.AdmissionShare(), c.Cache.Driver.Calls)
	require.Less(t, c.Cache.AdmissionShare(), 0.01)
	require.Zero(t, c.Cache.Preemptions)
}
