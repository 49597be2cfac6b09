package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// tinyModel keeps 1 KiB of KV a token, so that the hand-worked tests count
// in KiB: a 16-token block is 16 KiB.
var tinyModel = Model{Name: "tiny", Layers: 1, KVHeads: 1, HeadDim: 256, ElemBytes: 2, QueryHeads: 1}

func TestModelPresets(t *testing.T) {
	require.Equal(t, []string{"llama-7b", "llama3-8b"}, ModelPresets())
	m, err := ModelPreset("llama-7b")
	require.NoError(t, err)
	require.Equal(t, 512*units.KiB, m.TokenBytes(), "2 * 32 layers * 32 heads * 128 * 2 bytes")
	m, err = ModelPreset("llama3-8b")
	require.NoError(t, err)
	require.Equal(t, 128*units.KiB, m.TokenBytes(), "2 * 32 layers * 8 heads * 128 * 2 bytes")
	require.Equal(t, 32, m.QueryHeads)
	require.Equal(t, units.KiB, tinyModel.TokenBytes())

	_, err = ModelPreset("gpt2")
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, `no model preset "gpt2", want one of llama-7b, llama3-8b`)
}

// TestStepModel prices steps by hand: FLOPs and bytes of a small model at
// round rates, and a decode on the A100.
func TestStepModel(t *testing.T) {
	// 32 bytes of KV a token (2 * 2 layers * 1 head * 4 * 2 bytes).
	m := Model{Name: "toy", Layers: 2, KVHeads: 1, HeadDim: 4, ElemBytes: 2, QueryHeads: 2, Params: 1000}
	sm := StepModel{PeakFLOPS: 1000, Bandwidth: 1000, StepOverhead: time.Millisecond, SeqOverhead: 10 * time.Microsecond}
	var w stepWork
	// A chunk of 2 tokens after 10: 2*1000*2 FLOPs of products, 4 * 2
	// layers * 2 heads * 4 * (2*10 + 2*3/2) = 1472 of attention; it reads
	// 12 tokens' KV and writes 2: 14*32 = 448 bytes, and the weights 2000.
	w.add(m, 10, 2)
	require.Equal(t, stepWork{seqs: 1, flops: 5472, bytes: 448}, w)
	require.Equal(t, time.Millisecond+10*time.Microsecond+5472*time.Millisecond, sm.time(m, w), "bound by arithmetic")
	sm.PeakFLOPS = 10000
	require.Equal(t, time.Millisecond+10*time.Microsecond+2448*time.Millisecond, sm.time(m, w), "bound by memory")
	sm.PeakFLOPS, sm.Bandwidth = 0, 0
	require.Equal(t, time.Millisecond+10*time.Microsecond, sm.time(m, w), "zero rates are free")

	// One llama3-8b decode at 1000 tokens on the A100: the weights (16.06
	// GB) and 1002 tokens' KV (131 MB) at 2.039 TB/s take 7.94 ms; its
	// 16.6 GFLOPs at 312 TFLOP/s 0.05 ms.
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	w = stepWork{}
	w.add(l3, 1000, 1)
	require.InDelta(t, 8.95, float64(A100.time(l3, w))/float64(time.Millisecond), 0.01)
}
