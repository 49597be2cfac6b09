package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/serving"
)

// TestKVTargetsMet: the waste target is the paged scheme's where a page
// holds at most a block of tokens, plus half a page a running sequence
// otherwise; Met counts each target a cell meets, by hand.
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
	m := Met([]KVTarget{good, bad})
	require.Equal(t, KVTargetsMet{Cells: 2, Preemptions: 1, Waste: 1, TTFT: 1, Output: 1, FailedResumes: 1, Exposed: 1, Admission: 1, CPU: 1}, m)
	require.Contains(t, m.String(), "targets met, of 2 cells: preemptions <= paged 1,")
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
