package kvcache

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// gpuStep is the GPU time of a decode step the books are weighed
// against: 15 ms, a batch of 256 sequences of an 8B model on one GPU.
const gpuStep = 15 * time.Millisecond

// decodeBench is a cache of llama3-8b (2 MiB pages, TokenMajor, mapping
// ahead on at its default watermark) on its own sim device, holding seqs
// running sequences of ctx tokens each, their prompts distinct (no page
// shared): every sequence's pages are its own.
type decodeBench struct {
	drv  *sim.Driver
	c    *Cache
	seqs []*Seq
	ctx  int
	next int
	out  []SeqStep // the last step's, reused
}

func newDecodeBench(b *testing.B, seqs, ctx, span int) *decodeBench {
	cfg, err := Preset("llama3-8b")
	require.NoError(b, err)
	cfg.PageSize, cfg.Layout, cfg.MaxSeqs, cfg.MaxContext = 2*units.MiB, TokenMajor, seqs, ctx+span
	tokenBytes := uint64(2 * cfg.Layers * cfg.KVHeads * cfg.HeadDim * cfg.DType.Size())
	capacity := (uint64(seqs)*uint64(ctx+span)*tokenBytes/cfg.PageSize + uint64(2*seqs)) * cfg.PageSize
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: cfg.PageSize})
	require.NoError(b, err)
	c, err := New(vaspace.New(drv), physical.New(drv), cfg)
	require.NoError(b, err)
	d := &decodeBench{drv: drv, c: c, ctx: ctx, next: 1 << 30}
	d.admit(b, seqs)
	return d
}

// admit starts seqs sequences of d.ctx distinct prompt tokens, prefilled.
func (d *decodeBench) admit(b *testing.B, seqs int) {
	for i := range seqs {
		prompt := make([]int, d.ctx)
		for j := range prompt {
			prompt[j] = (i+1)<<20 + j
		}
		s, err := d.c.Admit(prompt, 0)
		require.NoError(b, err)
		_, err = s.Append(prompt[s.Len():])
		require.NoError(b, err)
		require.NoError(b, s.MarkWritten(s.Len()))
		d.seqs = append(d.seqs, s)
	}
}

// reset frees the sequences and admits them again at d.ctx (untimed), so
// that every stretch of steps starts at the same context.
func (d *decodeBench) reset(b *testing.B) {
	n := len(d.seqs)
	for _, s := range d.seqs {
		require.NoError(b, s.Free())
	}
	d.seqs = d.seqs[:0]
	d.admit(b, n)
}

func (d *decodeBench) close(b *testing.B) {
	for _, s := range d.seqs {
		require.NoError(b, s.Free())
	}
	require.NoError(b, d.c.Close())
	require.NoError(b, d.drv.Close())
}

// step is one decode step of every sequence through Cache.Step, reqs its
// requests (reused: one token each).
func (d *decodeBench) step(b *testing.B, reqs []StepRequest, toks []int) {
	for k, s := range d.seqs {
		toks[k] = d.next
		d.next++
		reqs[k] = StepRequest{Seq: s, Tokens: toks[k : k+1]}
	}
	var err error
	if d.out, err = d.c.Step(reqs, d.out); err != nil {
		b.Fatal(err)
	}
}

// appends is the same step as one Seq.Append a sequence: the baseline.
func (d *decodeBench) appends(b *testing.B, toks []int) {
	for k, s := range d.seqs {
		toks[k] = d.next
		d.next++
		if _, err := s.Append(toks[k : k+1]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeStep: a decode step of 256 sequences through the step
// API at 1k and 32k tokens of context, and the baseline — one Append a
// sequence — in the same loop, each timed by this thread's CPU clock (the
// books' own CPU: the mapping-ahead goroutine's commits run on another
// thread, as they would beside a GPU step). Reported: the CPU a step
// takes at each context, as ns and as a share of a 15 ms GPU step
// (target ≤ 1%), the 32k ÷ 1k ratio (target ≤ 1.2), the step API's CPU
// over the Appends', and the sequences a step found without their next
// page (step-waits: the mapper behind, the step committing it itself on
// this thread — on a loaded machine, more at 32k, where a commit walks
// larger books). Every 256 rounds the sequences are freed and
// admitted again, untimed, so the contexts stay within 512 tokens of
// 1k and 32k. The 32k cache holds 256 × 32k tokens of distinct prompts:
// 1 TiB of sim memory, half a million 2 MiB pages in the books.
//
//	go test -run '^$' -bench BenchmarkDecodeStep -benchtime 512x ./kvcache
func BenchmarkDecodeStep(b *testing.B) {
	const seqs, span = 256, 512
	contexts := []int{1024, 32768}
	runtime.LockOSThread() // threadCPU is this thread's
	defer runtime.UnlockOSThread()
	benches := make([]*decodeBench, len(contexts))
	for i, ctx := range contexts {
		benches[i] = newDecodeBench(b, seqs, ctx, span)
	}
	defer func() {
		for _, d := range benches {
			d.close(b)
		}
	}()
	reqs := make([]StepRequest, seqs)
	toks := make([]int, seqs)
	stepCPU := make([]time.Duration, len(contexts))
	stepWaits := make([]int, len(contexts))
	appendCPU := make([]time.Duration, len(contexts))
	round := 0
	b.ResetTimer()
	for b.Loop() {
		if round > 0 && round%(span/2) == 0 {
			b.StopTimer()
			for _, d := range benches {
				d.reset(b)
			}
			b.StartTimer()
		}
		round++
		// A different context first every round; Step and Appends
		// alternate which goes first too.
		for j := range benches {
			i := (j + round) % len(benches)
			d := benches[i]
			for o := range 2 {
				if (o+round)%2 == 0 {
					w := d.c.Stats().Waits
					t0 := threadCPU()
					d.step(b, reqs, toks)
					stepCPU[i] += threadCPU() - t0
					stepWaits[i] += d.c.Stats().Waits - w
				} else {
					t0 := threadCPU()
					d.appends(b, toks)
					appendCPU[i] += threadCPU() - t0
				}
			}
		}
	}
	b.StopTimer()
	n := time.Duration(round)
	last := len(contexts) - 1
	for i, ctx := range contexts {
		k := fmt.Sprintf("%dk", ctx/1024)
		b.ReportMetric(float64(stepCPU[i]/n), "step-cpu-ns/"+k)
		b.ReportMetric(float64(appendCPU[i]/n), "appends-cpu-ns/"+k)
		b.ReportMetric(100*float64(stepCPU[i]/n)/float64(gpuStep), "step-%-of-15ms/"+k)
		b.ReportMetric(float64(stepWaits[i])/float64(round), "step-waits/"+k)
	}
	b.ReportMetric(float64(stepCPU[last])/float64(stepCPU[0]), "step-ratio-32k/1k")
	b.ReportMetric(float64(appendCPU[last])/float64(appendCPU[0]), "appends-ratio-32k/1k")
	b.ReportMetric(float64(stepCPU[last])/float64(appendCPU[last]), "step/appends-32k")
}
