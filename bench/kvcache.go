package bench

import (
	"math"
	"runtime"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// KVScale is what KVDecodeScale measured: at each of Contexts (in tokens,
// smallest first), the time one operation a round (an Append, or a decode
// step of every sequence) took over N rounds, all in one loop.
type KVScale struct {
	Contexts []int
	N        int
	Time     []time.Duration
	// Waits are the Appends at each context that committed a page
	// themselves (kvcache.Stats.Waits): with no mapping ahead, one per
	// unit crossed, the same at every context.
	Waits []int
	// Plain is the time, at each context, of the operations that
	// committed nothing (PlainOps of them): the cache's bookkeeping
	// alone, without the lower layers' commits.
	Plain    []time.Duration
	PlainOps []int
}

// PlainPer is the time of one operation that committed nothing, at
// context i; 0 where there is no figure.
func (k KVScale) PlainPer(i int) time.Duration {
	if i < 0 || i >= len(k.PlainOps) || i >= len(k.Plain) || k.PlainOps[i] == 0 {
		return 0
	}
	return k.Plain[i] / time.Duration(k.PlainOps[i])
}

// Per is the time of one operation at context i; 0 where there is no
// figure.
func (k KVScale) Per(i int) time.Duration {
	if k.N == 0 || i < 0 || i >= len(k.Time) {
		return 0
	}
	return k.Time[i] / time.Duration(k.N)
}

// Ratio is an operation's time at the largest context over its time at
// the smallest: 1 when the cost does not grow with the context. (Unlike
// Scaled.Ratio, the slowest size over the fastest, it keeps its
// direction: the metric it reports is named for the two contexts.)
func (k KVScale) Ratio() float64 {
	last := len(k.Time) - 1
	if last < 0 || k.Time[0] == 0 {
		return 0
	}
	return float64(k.Time[last]) / float64(k.Time[0])
}

// kvShape is the model the KV benchmarks hold: llama3-8b (32 layers × 8
// KV heads × 128, fp16: 128 KiB a token) with 2 MiB pages, on the sim
// driver, as vmarena kv simulate runs it. Mapping ahead is on, at the
// cache's default watermark, as an engine runs it, unless mapAhead is
// false: then every page is committed by the Append that needs it, so an
// Append's time is all its cost, on this goroutine.
func kvShape(layout kvcache.Layout, mapAhead bool) kvcache.Config {
	cfg, err := kvcache.Preset("llama3-8b")
	if err != nil {
		panic(err) // a preset the package defines
	}
	cfg.PageSize, cfg.Layout = 2*units.MiB, layout
	if !mapAhead {
		cfg.MapAhead = -1
	}
	return cfg
}

// kvBench is a cache on its own sim device, and what it was made with.
type kvBench struct {
	drv    *sim.Driver
	c      *kvcache.Cache
	budget uint64
}

// newKVBench makes a cache of cfg on a sim device of capacity bytes, the
// cache's budget.
func newKVBench(cfg kvcache.Config, capacity uint64) (*kvBench, error) {
	capacity = (capacity + cfg.PageSize - 1) / cfg.PageSize * cfg.PageSize
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: cfg.PageSize})
	if err != nil {
		return nil, err
	}
	c, err := kvcache.New(vaspace.New(drv), physical.New(drv), cfg)
	if err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	return &kvBench{drv: drv, c: c, budget: c.Config().Budget}, nil
}

func (kb *kvBench) close() error {
	return errors.CombineErrors(kb.c.Close(), kb.drv.Close())
}

// admit starts a sequence of prompt and appends what the prefix store did
// not hold of it: the sequence then holds the whole prompt.
func (kb *kvBench) admit(prompt []int) (*kvcache.Seq, error) {
	s, err := kb.c.Admit(prompt, 0)
	if err != nil {
		return nil, err
	}
	if _, err := s.Append(prompt[s.Len():]); err != nil {
		return nil, errors.CombineErrors(err, s.Free())
	}
	// The prefill's keys and values, as a model would have written them:
	// its whole prompt pages can be shared.
	if err := s.MarkWritten(s.Len()); err != nil {
		return nil, errors.CombineErrors(err, s.Free())
	}
	return s, nil
}

// giveBackIdle decommits the pages freed sequences left their slots
// (deferred reclaim), by lowering the budget by them and raising it back:
// the next sequence in such a slot then commits its pages afresh, as the
// one before did.
func (kb *kvBench) giveBackIdle() error {
	st := kb.c.Stats()
	if st.IdlePages == 0 {
		return nil
	}
	page := kb.c.Config().PageSize
	if _, err := kb.c.SetBudget(max(st.Committed-uint64(st.IdlePages)*page, page), kvcache.Drop); err != nil {
		return err
	}
	_, err := kb.c.SetBudget(kb.budget, kvcache.Drop)
	return err
}

// promptOf is n distinct tokens from first on.
func promptOf(first, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = first + i
	}
	return p
}

// checkContexts refuses contexts that are not increasing and positive.
func checkContexts(what string, contexts []int, span int) error {
	if len(contexts) < 2 || span < 1 {
		return errors.Newf("bench: %s: at least two contexts and a span of at least one token, got %v and %d", what, contexts, span)
	}
	for i, n := range contexts {
		if n < 1 || (i > 0 && n <= contexts[i-1]) {
			return errors.Newf("bench: %s: contexts %v are not positive and increasing", what, contexts)
		}
	}
	return nil
}

// KVDecodeScale times a decode step — Seq.Append of one token to each of
// seqs running sequences — at each of contexts tokens: a cache per
// context (kvShape: llama3-8b, 2 MiB pages; with mapAhead, mapping ahead
// on, as an engine runs it, the next pages committed by the cache's
// goroutine while the steps run; without, a page is committed by the
// Append that reaches it and a step's time is all its cost, on this
// goroutine), each on its own sim device, holding seqs
// sequences of that context, the caches' steps in one loop, a different
// one first every round. The sequences of a cache share their prompt
// (its whole pages borrowed from the prefix store: one copy of it,
// whatever seqs), so that only the pages of their steps are their own.
// They grow by span tokens; then, untimed, they are freed, their slots'
// pages given back (kept for the next sequence otherwise, they would
// spare the next stretch its commits) and they are admitted again with
// the same prompt, so that every stretch of span steps starts at the same
// context and commits the same pages. With seqs 1 a step is one Append.
func KVDecodeScale(more func() bool, layout kvcache.Layout, seqs int, contexts []int, span int, mapAhead bool) (k KVScale, err error) {
	if err := checkContexts("kv decode", contexts, span); err != nil {
		return k, err
	}
	if seqs < 1 {
		return k, errors.Newf("bench: kv decode: %d sequences, want at least one", seqs)
	}
	cfg := kvShape(layout, mapAhead)
	tokenBytes := 2 * uint64(cfg.Layers*cfg.KVHeads*cfg.HeadDim*cfg.DType.Size())
	unitPages := uint64(1)
	if layout == kvcache.PerLayer {
		unitPages = 2 * uint64(cfg.Layers)
	}
	k = KVScale{Contexts: contexts, Time: make([]time.Duration, len(contexts)), Waits: make([]int, len(contexts)),
		Plain: make([]time.Duration, len(contexts)), PlainOps: make([]int, len(contexts))}
	type cache struct {
		kb     *kvBench
		prompt []int
		seqs   []*kvcache.Seq
	}
	caches := make([]*cache, len(contexts))
	// freeAll frees the sequences latest admitted first: the last slots'
	// pages first, the way the lower layers' books give back fastest.
	freeAll := func(ch *cache) error {
		var errs error
		for i := len(ch.seqs) - 1; i >= 0; i-- {
			if s := ch.seqs[i]; s != nil {
				ch.seqs[i] = nil
				errs = errors.CombineErrors(errs, s.Free())
			}
		}
		return errs
	}
	defer func() {
		for _, ch := range caches {
			if ch != nil {
				err = errors.CombineErrors(err, errors.CombineErrors(freeAll(ch), ch.kb.close()))
			}
		}
	}()
	admitAll := func(ch *cache) error {
		// A first sequence writes the prompt and is freed: its whole
		// pages, published, are what the others borrow.
		s, err := ch.kb.admit(ch.prompt)
		if err != nil {
			return errors.Wrapf(err, "bench: kv decode: the prompt of %d tokens", len(ch.prompt))
		}
		if err := errors.CombineErrors(s.Free(), ch.kb.giveBackIdle()); err != nil {
			return err
		}
		for i := range ch.seqs {
			s, err := ch.kb.admit(ch.prompt)
			if err != nil {
				return errors.Wrapf(err, "bench: kv decode: sequence %d of %d tokens", i, len(ch.prompt))
			}
			ch.seqs[i] = s
		}
		return nil
	}
	for i, n := range contexts {
		c := cfg
		c.MaxContext, c.MaxSeqs = n+span, seqs
		// The prompt once, and each sequence's last unit of it and its
		// span of own pages, with a unit to spare at either end.
		own := (uint64(span)*tokenBytes/c.PageSize + 3*unitPages) * c.PageSize
		kb, err := newKVBench(c, uint64(n)*tokenBytes+uint64(seqs)*own)
		if err != nil {
			return k, err
		}
		caches[i] = &cache{kb: kb, prompt: promptOf(i<<32, n), seqs: make([]*kvcache.Seq, seqs)}
		if err := admitAll(caches[i]); err != nil {
			return k, err
		}
	}
	// The setup's garbage is collected before the timing, not during it.
	runtime.GC()
	next := math.MaxInt >> 1 // past every prompt's tokens, on 32-bit too
	one := []int{0}
	for round := 0; more(); round++ {
		if round > 0 && round%span == 0 {
			for _, ch := range caches {
				if err := errors.CombineErrors(freeAll(ch), ch.kb.giveBackIdle()); err != nil {
					return k, err
				}
				if err := admitAll(ch); err != nil {
					return k, err
				}
			}
			runtime.GC()
		}
		for j := range caches {
			i := (round + j) % len(caches)
			ch := caches[i]
			before := ch.kb.c.Stats().Waits
			t0 := time.Now()
			for _, s := range ch.seqs {
				one[0] = next
				next++
				if _, err := s.Append(one); err != nil {
					k.Time[i] += time.Since(t0)
					return k, errors.Wrapf(err, "bench: kv decode step at %d tokens", contexts[i])
				}
			}
			d := time.Since(t0)
			k.Time[i] += d
			waits := ch.kb.c.Stats().Waits - before
			k.Waits[i] += waits
			if waits == 0 {
				k.Plain[i] += d
				k.PlainOps[i]++
			}
		}
		k.N++
	}
	for _, ch := range caches {
		if err := ch.kb.c.Check(); err != nil {
			return k, err
		}
	}
	return k, nil
}
