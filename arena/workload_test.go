package arena

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Synthetic allocator workloads, generated from a seed, for judging the
// allocator's policy on more than the traces in testdata: the shapes that
// allocation traces of training and serving have, at sizes no trace fixed.

// wlEvent is one step of a workload: an allocation of size bytes under id,
// or (size 0) the free of id.
type wlEvent struct {
	id   int
	size uint64
}

type workload struct {
	name   string
	events []wlEvent
}

// logUniform draws from [lo, hi] with a uniform logarithm: as many 4 KiB
// as 4 GiB requests per factor of two.
func logUniform(rng *rand.Rand, lo, hi uint64) uint64 {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return uint64(math.Exp(l + rng.Float64()*(h-l)))
}

// trainingWorkload: a model's weights and optimizer state allocated once;
// then steps of a forward pass that allocates each layer's activations
// (and short-lived temporaries) and a backward pass that frees the
// activations in reverse while gradients come and go. Sizes are drawn per
// layer from [64 KiB, maxAct], not round numbers.
func trainingWorkload(seed uint64, layers, steps int, maxAct uint64) workload {
	rng := rand.New(rand.NewPCG(seed, 101))
	var ev []wlEvent
	id := 0
	alloc := func(n uint64) int { id++; ev = append(ev, wlEvent{id, n}); return id }
	free := func(i int) { ev = append(ev, wlEvent{i, 0}) }
	weights := make([]uint64, layers)
	for l := range weights {
		weights[l] = logUniform(rng, 256*units.KiB, maxAct/2)
		alloc(weights[l]) // parameters
		alloc(weights[l]) // optimizer state
	}
	act := make([]uint64, layers)
	for l := range act {
		act[l] = logUniform(rng, 64*units.KiB, maxAct)
	}
	for range steps {
		live := make([]int, 0, 2*layers)
		for l := range layers {
			live = append(live, alloc(act[l]))
			tmp := alloc(logUniform(rng, 512, act[l]))
			if rng.IntN(4) == 0 {
				live = append(live, alloc(logUniform(rng, 512, 64*units.KiB))) // kept small state
			}
			free(tmp)
		}
		for l := layers - 1; l >= 0; l-- {
			g := alloc(weights[l]) // gradient
			tmp := alloc(logUniform(rng, 512, act[l]))
			free(tmp)
			for len(live) > 0 {
				last := live[len(live)-1]
				live = live[:len(live)-1]
				free(last)
				if rng.IntN(3) > 0 {
					break
				}
			}
			free(g)
		}
		for _, i := range live {
			free(i)
		}
	}
	return workload{fmt.Sprintf("training/%d", seed), ev}
}

// repeatedTrainingWorkload: trainingWorkload's weights and its first step,
// then that step again, steps times in all, event for event (new ids, the
// same sizes in the same order), as a training loop repeats its step once
// its shapes are fixed: what a long run pays after the first step.
func repeatedTrainingWorkload(seed uint64, layers, steps int, maxAct uint64) workload {
	one := trainingWorkload(seed, layers, 1, maxAct)
	head, step := one.events[:2*layers], one.events[2*layers:]
	ev := slices.Clone(head)
	id := 0
	for _, e := range one.events {
		id = max(id, e.id)
	}
	for k := range steps {
		for _, e := range step {
			e.id += k * id
			ev = append(ev, e)
		}
	}
	return workload{fmt.Sprintf("training-repeat/%d", seed), ev}
}

// kvWorkload: serving requests whose key-value memory grows as tokens
// arrive: each sequence holds blocks of perBlock bytes, appended one at a
// time (a new block each blockTokens tokens) and all freed when the
// request ends; requests arrive while fewer than maxLive run.
func kvWorkload(seed uint64, requests, maxLive int, perBlock uint64) workload {
	rng := rand.New(rand.NewPCG(seed, 202))
	var ev []wlEvent
	id := 0
	type seq struct {
		blocks []int
		left   int
	}
	var live []*seq
	started := 0
	for started < requests || len(live) > 0 {
		for started < requests && len(live) < maxLive && rng.IntN(2) == 0 {
			live = append(live, &seq{left: 1 + int(logUniform(rng, 1, 512))})
			started++
		}
		if len(live) == 0 {
			continue
		}
		s := live[rng.IntN(len(live))]
		id++
		ev = append(ev, wlEvent{id, perBlock})
		s.blocks = append(s.blocks, id)
		if s.left--; s.left == 0 {
			for _, b := range s.blocks {
				ev = append(ev, wlEvent{b, 0})
			}
			live = slices.DeleteFunc(live, func(x *seq) bool { return x == s })
		}
	}
	return workload{fmt.Sprintf("kv/%d", seed), ev}
}

// randomWorkload: sizes log-uniform from 512 B to maxSize, each allocation
// freed after a random time, the live set kept under limit by freeing the
// oldest first.
func randomWorkload(seed uint64, n int, maxSize, limit uint64) workload {
	rng := rand.New(rand.NewPCG(seed, 303))
	var ev []wlEvent
	type liveAlloc struct {
		id   int
		size uint64
	}
	var live []liveAlloc
	var total uint64
	for id := 1; id <= n; id++ {
		size := logUniform(rng, 512, maxSize)
		for total+size > limit && len(live) > 0 {
			ev = append(ev, wlEvent{live[0].id, 0})
			total -= live[0].size
			live = live[1:]
		}
		ev = append(ev, wlEvent{id, size})
		live = append(live, liveAlloc{id, size})
		total += size
		for len(live) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(live))
			ev = append(ev, wlEvent{live[k].id, 0})
			total -= live[k].size
			live = slices.Delete(live, k, k+1)
		}
	}
	return workload{fmt.Sprintf("random/%d", seed), ev}
}

// bimodalWorkload: small requests (512 B to 1 MiB, log-uniform) with a
// large one (64 MiB to 1 GiB) one time in twenty, each freed after a random
// time, the live set kept under limit by freeing the oldest first: small
// tensors' chunks among huge ones', which a large request coming back to
// a freed huge chunk covers in part.
func bimodalWorkload(seed uint64, n int, limit uint64) workload {
	rng := rand.New(rand.NewPCG(seed, 404))
	var ev []wlEvent
	type liveAlloc struct {
		id   int
		size uint64
	}
	var live []liveAlloc
	var total uint64
	for id := 1; id <= n; id++ {
		size := logUniform(rng, 512, units.MiB)
		if rng.IntN(20) == 0 {
			size = logUniform(rng, 64*units.MiB, units.GiB)
		}
		for total+size > limit && len(live) > 0 {
			ev = append(ev, wlEvent{live[0].id, 0})
			total -= live[0].size
			live = live[1:]
		}
		ev = append(ev, wlEvent{id, size})
		live = append(live, liveAlloc{id, size})
		total += size
		for len(live) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(live))
			ev = append(ev, wlEvent{live[k].id, 0})
			total -= live[k].size
			live = slices.Delete(live, k, k+1)
		}
	}
	return workload{fmt.Sprintf("bimodal/%d", seed), ev}
}

// syntheticWorkloads is the sweep: each shape at a few seeds and scales.
func syntheticWorkloads() []workload {
	var ws []workload
	for seed := uint64(1); seed <= 3; seed++ {
		ws = append(ws, trainingWorkload(seed, 24+8*int(seed), 3, 512*units.MiB))
		ws = append(ws, kvWorkload(seed, 400, 64, 2*units.MiB+uint64(seed)*320*units.KiB))
		ws = append(ws, randomWorkload(seed, 3000, 4*units.GiB, 48*units.GiB))
		ws = append(ws, bimodalWorkload(seed, 20000, 8*units.GiB))
	}
	return ws
}

// wlResult is what one workload did to an allocator.
type wlResult struct {
	peakAllocated, peakCommitted uint64
	stats                        AllocStats
	calls                        sim.Calls // the driver calls, as the sim driver counted them
}

func (r wlResult) ratio() float64 { return float64(r.peakCommitted) / float64(r.peakAllocated) }

// runWorkload replays w through an allocator with opts on a sim device of
// 80 GiB at 2 MiB granularity, checking it every checkEvery events (0:
// never).
func runWorkload(w workload, opts AllocatorOptions, checkEvery int) (wlResult, error) {
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: 80 * units.GiB, Granularity: 2 * units.MiB})
	if err != nil {
		return wlResult{}, err
	}
	defer drv.Close()
	al, err := NewAllocator(vaspace.New(drv), physical.New(drv), opts)
	if err != nil {
		return wlResult{}, err
	}
	addrs := map[int]driver.Addr{}
	var r wlResult
	var allocated uint64
	for i, e := range w.events {
		if e.size > 0 {
			p, err := al.Alloc(e.size, 0)
			if err != nil {
				return r, fmt.Errorf("%s: event %d: %w", w.name, i, err)
			}
			addrs[e.id] = p
			allocated += e.size
			r.peakAllocated = max(r.peakAllocated, allocated)
		} else {
			n, err := al.Size(addrs[e.id])
			if err == nil {
				err = al.Free(addrs[e.id])
			}
			if err != nil {
				return r, fmt.Errorf("%s: event %d: %w", w.name, i, err)
			}
			allocated -= n
			delete(addrs, e.id)
		}
		if checkEvery > 0 && i%checkEvery == 0 {
			if err := al.Check(); err != nil {
				return r, fmt.Errorf("%s: event %d: %w", w.name, i, err)
			}
		}
	}
	r.stats = al.Stats()
	r.peakCommitted = r.stats.PeakCommitted
	r.calls = drv.Tally().Devices[0]
	for _, p := range addrs {
		if err := al.Free(p); err != nil {
			return r, err
		}
	}
	return r, al.Close()
}
