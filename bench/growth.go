package bench

import (
	"fmt"
	"slices"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// SequenceShape is one sequence's KV cache as the growth benchmark grows
// it: Layers layers of KVHeads×HeadDim fp16 keys and values a token, laid
// out as the KV cache's per-layer layout, a K region and a V region per
// layer (region 2l is layer l's K, 2l+1 its V).
type SequenceShape struct {
	Layers, KVHeads, HeadDim int
	Tokens                   int // the length the sequence grows to, one token at a time
	Step                     int // the copying side's growth step in tokens (ollama's: 256)
}

// rowLen is the elements of one token's keys (or values) of one layer.
func (sh SequenceShape) rowLen() int { return sh.KVHeads * sh.HeadDim }

// RowBytes is one token's keys (or values) of one layer, fp16.
func (sh SequenceShape) RowBytes() uint64 { return uint64(sh.rowLen()) * 2 }

// regions is the number of regions, a K and a V per layer.
func (sh SequenceShape) regions() int { return 2 * sh.Layers }

// TokenBytes is one token's keys and values over every layer.
func (sh SequenceShape) TokenBytes() uint64 { return uint64(sh.regions()) * sh.RowBytes() }

// regionMax is a region's size at Tokens tokens, rounded up to a chunk:
// what the cache reserves for it, at most what it commits.
func (sh SequenceShape) regionMax() uint64 {
	return (uint64(sh.Tokens)*sh.RowBytes() + ChunkSize - 1) / ChunkSize * ChunkSize
}

func (sh SequenceShape) check() error {
	if sh.Layers < 1 || sh.KVHeads < 1 || sh.HeadDim < 1 || sh.Tokens < 1 || sh.Step < 1 || sh.rowLen() < 4 {
		return errors.Newf("bench: sequence growth of %+v: positive sizes, rows of at least 4 elements", sh)
	}
	// Taken in float64: the byte counts of a shape this large would wrap.
	if float64(sh.regions()+1)*float64(sh.Tokens+sh.Step)*float64(sh.KVHeads)*float64(sh.HeadDim)*2 > maxBenchBytes {
		return errors.Wrapf(ErrTooLarge, "bench: sequence growth of %+v needs more than %s", sh, units.Bytes(maxBenchBytes))
	}
	return nil
}

// tokenRows is what the growing sequences write: row r of token t is
// patterns[(t*regions+r) % len] with t and r stamped on its first four
// elements, so no two rows are alike. Both sides copy from it, so neither
// pays to compute the values.
type tokenRows struct {
	sh       SequenceShape
	patterns [][]tensor.F16
}

func newTokenRows(sh SequenceShape) *tokenRows {
	tr := &tokenRows{sh: sh, patterns: make([][]tensor.F16, 61)} // a prime count: no period shared with a region count or a step
	x := uint32(2463534242)
	for i := range tr.patterns {
		tr.patterns[i] = make([]tensor.F16, sh.rowLen())
		for j := range tr.patterns[i] {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			tr.patterns[i][j] = tensor.F16(x)
		}
	}
	return tr
}

// write writes token t's row of region r into dst.
func (tr *tokenRows) write(dst []tensor.F16, t, r int) {
	copy(dst, tr.patterns[(t*tr.sh.regions()+r)%len(tr.patterns)])
	dst[0], dst[1] = tensor.F16(t), tensor.F16(t>>16)
	dst[2], dst[3] = tensor.F16(r), tensor.F16(r>>16)
}

// grower is one sequence's KV memory growing a token at a time.
type grower interface {
	// appendToken makes room for token t (the sequence holds t tokens)
	// and writes its rows.
	appendToken(t int) error
	// region returns region r's first n tokens' elements (untimed reads).
	region(r, n int) ([]tensor.F16, error)
	// reset empties the sequence: GrowCold gives its memory back to the
	// device, GrowWarm keeps what it holds for the next sequence.
	reset(start GrowthStart) error
}

// cacheSeq is the KV cache's way: a kvcache.Cache of one slot, per-layer
// layout, 2 MiB pages, its default mapping ahead; a sequence admitted with
// the first token and grown by Seq.Append of one token at a time, each
// token's rows written through the views Append returns. The slot's
// regions are reserved at their full length; pages are committed at their
// tails as tokens reach them (by the mapping-ahead goroutine, or by the
// Append that needs them); nothing moves.
type cacheSeq struct {
	sh     SequenceShape
	rows   *tokenRows
	c      *kvcache.Cache
	s      *kvcache.Seq // nil between sequences
	tok    [1]int
	budget uint64
}

func newCacheSeq(space *vaspace.Space, mem *physical.Memory, sh SequenceShape, rows *tokenRows) (*cacheSeq, error) {
	c, err := kvcache.New(space, mem, kvcache.Config{
		Layers: sh.Layers, KVHeads: sh.KVHeads, HeadDim: sh.HeadDim, DType: tensor.Float16,
		MaxContext: sh.Tokens, MaxSeqs: 1, PageSize: ChunkSize, Layout: kvcache.PerLayer,
		NoPrefixSharing: true, // one sequence: nothing to share
	})
	if err != nil {
		return nil, err
	}
	return &cacheSeq{sh: sh, rows: rows, c: c, budget: c.Config().Budget}, nil
}

func (g *cacheSeq) appendToken(t int) error {
	g.tok[0] = t
	if g.s == nil {
		s, err := g.c.Admit(g.tok[:], 0)
		if err != nil {
			return err
		}
		g.s = s
	}
	step, err := g.s.Append(g.tok[:])
	if err != nil {
		return err
	}
	for l, runs := range step.Layers {
		for kv, x := range []*tensor.Tensor{runs[0].K, runs[0].V} {
			d, err := tensor.Data[tensor.F16](x)
			if err != nil {
				return err
			}
			g.rows.write(d, t, 2*l+kv)
		}
	}
	return nil
}

// region reads the sequence's K or V of a layer as Seq.K and Seq.V give
// it: one row-major [tokens, KVHeads, HeadDim] tensor.
func (g *cacheSeq) region(r, n int) ([]tensor.F16, error) {
	if g.s == nil {
		return nil, errors.AssertionFailedf("bench: region %d read with no sequence", r)
	}
	get := g.s.K
	if r%2 == 1 {
		get = g.s.V
	}
	x, err := get(r / 2)
	if err != nil {
		return nil, err
	}
	d, err := tensor.Data[tensor.F16](x)
	if err != nil {
		return nil, err
	}
	if len(d) < n*g.sh.rowLen() {
		return nil, errors.AssertionFailedf("bench: region %d holds %d tokens, %d asked", r, len(d)/g.sh.rowLen(), n)
	}
	return d[:n*g.sh.rowLen()], nil
}

// reset frees the sequence, which keeps its slot's pages committed for the
// next one (the cache's deferred reclaim): Warm leaves it there, and the
// next sequence's Appends find their pages committed; Cold then lowers the
// budget to one page, which makes the cache give the idle slot's pages
// back, and raises it again.
func (g *cacheSeq) reset(start GrowthStart) error {
	if g.s == nil {
		return nil
	}
	err := g.s.Free()
	g.s = nil
	if err != nil || start == GrowWarm {
		return err
	}
	if _, err := g.c.SetBudget(ChunkSize, kvcache.Drop); err != nil {
		return err
	}
	_, err = g.c.SetBudget(g.budget, kvcache.Drop)
	return err
}

func (g *cacheSeq) close() error {
	var err error
	if g.s != nil {
		err = g.s.Free()
	}
	return errors.CombineErrors(err, g.c.Close())
}

// copying is ollama's way: each region a buffer with room for a whole
// number of Steps of tokens; a token that finds it full allocates a buffer
// Step tokens longer, copies the tokens so far into it and frees the old
// one. The buffers are tensors (tensor.Empty) from an arena.Allocator of
// the same host driver: the same memory as the cache's, mapped in the same
// chunks, through the cheapest allocate-and-free the library has — a freed
// buffer's memory serves the next one where it fits, with no new mapping —
// so the baseline pays little beyond its copies. Started Cold, the
// allocator has its default policy (it gives free chunks back to the device
// once they exceed a small share of what is live) and is trimmed between
// sequences; started Warm, it never gives memory back (arena.NoRelease)
// and may hold four times a grown sequence, so after a first sequence it
// commits nothing more: a caching allocator at its most generous, in time
// if not in memory.
type copying struct {
	sh    SequenceShape
	rows  *tokenRows
	al    *arena.Allocator
	bufs  []*tensor.Tensor
	mem   [][]tensor.F16
	moves int    // buffers replaced since the last reset
	moved uint64 // bytes copied since the last reset
}

func newCopying(space *vaspace.Space, mem *physical.Memory, sh SequenceShape, rows *tokenRows, start GrowthStart) (*copying, error) {
	opts := arena.AllocatorOptions{Max: copyingMax(sh, start), ChunkSize: ChunkSize}
	if start == GrowWarm {
		opts.ReleaseThreshold = arena.NoRelease
	}
	al, err := arena.NewAllocator(space, mem, opts)
	if err != nil {
		return nil, err
	}
	return &copying{sh: sh, rows: rows, al: al, bufs: make([]*tensor.Tensor, sh.regions()), mem: make([][]tensor.F16, sh.regions())}, nil
}

func (g *copying) appendToken(t int) error {
	rl := g.sh.rowLen()
	used := t * rl
	for r := range g.sh.regions() {
		if used == len(g.mem[r]) {
			b, err := tensor.Empty(g.al, tensor.Float16, t+g.sh.Step, g.sh.KVHeads, g.sh.HeadDim)
			if err != nil {
				return err
			}
			d, err := tensor.Data[tensor.F16](b)
			if err != nil {
				return errors.CombineErrors(err, b.Release())
			}
			copy(d, g.mem[r])
			if g.bufs[r] != nil {
				if err := g.bufs[r].Release(); err != nil {
					return errors.CombineErrors(err, b.Release())
				}
				g.moves++
				g.moved += uint64(used) * 2
			}
			g.bufs[r], g.mem[r] = b, d
		}
		g.rows.write(g.mem[r][used:used+rl], t, r)
	}
	return nil
}

func (g *copying) region(r, n int) ([]tensor.F16, error) {
	if len(g.mem[r]) < n*g.sh.rowLen() {
		return nil, errors.AssertionFailedf("bench: region %d's buffer holds %d tokens, %d asked", r, len(g.mem[r])/g.sh.rowLen(), n)
	}
	return g.mem[r][:n*g.sh.rowLen()], nil
}

// copyingMax is the most the copying side's allocator may commit: every
// region at its full length plus one region's next buffer while it is
// copied into (the live peak), four times that when started Warm.
func copyingMax(sh SequenceShape, start GrowthStart) uint64 {
	live := uint64(sh.regions()+1)*(uint64(sh.Tokens+sh.Step)*sh.RowBytes()) + 4*ChunkSize
	if start == GrowWarm {
		return 4 * live
	}
	return live
}

func (g *copying) reset(start GrowthStart) error {
	var err error
	for r, b := range g.bufs {
		if b != nil {
			err = errors.CombineErrors(err, b.Release())
		}
		g.bufs[r], g.mem[r] = nil, nil
	}
	g.moves, g.moved = 0, 0
	if err != nil || start == GrowWarm {
		return err
	}
	return g.al.Trim()
}

func (g *copying) close() error {
	return errors.CombineErrors(g.reset(GrowCold), g.al.Close())
}

// GrowthStart says what memory a growing sequence starts with.
type GrowthStart uint8

const (
	// GrowCold: nothing committed on either side; every round commits
	// the memory it grows into (on this kind of machine, fresh memory is
	// most of the cache's time).
	GrowCold GrowthStart = iota
	// GrowWarm: both sides keep the memory of the sequence before — the
	// cache its slot's pages (its deferred reclaim), the copying side its
	// allocator's chunks (never given back) — so neither commits anything:
	// growth is the appends and writes, and the copies.
	GrowWarm
)

func (start GrowthStart) String() string {
	if start == GrowWarm {
		return "warm"
	}
	return "cold"
}

// Growth is what one SequenceGrowth run measured: the Pair (Lib the
// cache, Bare the copying side, N the rounds), what the copying side moved
// in a round, the Appends of a round that committed or waited for a page
// themselves (the cache's Stats.Waits; the rest found it mapped ahead),
// and the most memory each side held committed.
type Growth struct {
	Pair
	Moves             int    // buffers the copying side replaced in a round
	Moved             uint64 // bytes it copied doing so
	Waits             int    // the cache's Appends that waited on mapping, in the last round
	LibPeak, BarePeak uint64 // the most each side held committed at once
}

// SequenceGrowth times one sequence growing a token at a time from empty
// to sh.Tokens tokens, each token's rows written as it arrives, two ways in
// the same loop. Lib is the KV cache's way (cacheSeq): a kvcache sequence
// grown by Seq.Append, its regions reserved at full length, 2 MiB pages
// committed at their tails, nothing ever moved. Bare is ollama's
// (copying): buffers grown sh.Step tokens at a time by allocating a larger
// one and copying. start says whether each sequence starts from nothing
// committed or from the memory the one before left.
//
// Each round times the growth alone; then (untimed) both sequences' bytes
// are compared with each other and with what was written, and both are
// reset as start says. One untimed round runs first, so that neither side
// meets memory this machine has never touched (the first touch of a page
// costs several times any later one here) and, Warm, so that every timed
// round finds the memory the round before left. Host driver, default
// capacity: ErrTooLarge when it cannot hold both sides.
func SequenceGrowth(more func() bool, sh SequenceShape, start GrowthStart) (res Growth, err error) {
	if err := sh.check(); err != nil {
		return res, err
	}
	need := uint64(sh.regions())*sh.regionMax() + copyingMax(sh, start)
	drv, space, mem, err := hostArenas(need, fmt.Sprintf("a sequence growing to %d tokens of %s, %s",
		sh.Tokens, units.Bytes(sh.TokenBytes()), start))
	if err != nil {
		return res, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	rows := newTokenRows(sh)
	lib, err := newCacheSeq(space, mem, sh, rows)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.CombineErrors(err, lib.close()) }()
	bare, err := newCopying(space, mem, sh, rows, start)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.CombineErrors(err, bare.close()) }()

	grow := func(g grower) func(*time.Duration) error {
		return func(into *time.Duration) error {
			t0 := time.Now()
			for t := range sh.Tokens {
				if err := g.appendToken(t); err != nil {
					return err
				}
			}
			*into += time.Since(t0)
			return nil
		}
	}
	waitsBefore := 0
	after := func() error {
		res.Moves, res.Moved = bare.moves, bare.moved
		if err := sameSequences(sh, rows, lib, bare); err != nil {
			return err
		}
		st := lib.c.Stats()
		res.Waits, waitsBefore = st.Waits-waitsBefore, st.Waits
		res.LibPeak = max(res.LibPeak, st.Committed) // a round only grows: its end is its peak
		return errors.CombineErrors(lib.reset(start), bare.reset(start))
	}
	if _, err := alternate(Rounds(1), 1, grow(lib), grow(bare), after); err != nil {
		return res, err
	}
	res.Pair, err = alternate(more, 1, grow(lib), grow(bare), after)
	res.BarePeak = bare.al.Stats().PeakCommitted
	return res, err
}

// sameSequences checks that a and b hold the same elements in every
// region, and that these are the rows written.
func sameSequences(sh SequenceShape, rows *tokenRows, a, b grower) error {
	rl := sh.rowLen()
	want := make([]tensor.F16, rl)
	for r := range sh.regions() {
		x, err := a.region(r, sh.Tokens)
		if err != nil {
			return err
		}
		y, err := b.region(r, sh.Tokens)
		if err != nil {
			return err
		}
		if !slices.Equal(x, y) {
			return errors.AssertionFailedf("bench: region %d differs between the cache's and the copied sequence", r)
		}
		for t := range sh.Tokens {
			rows.write(want, t, r)
			if !slices.Equal(x[t*rl:(t+1)*rl], want) {
				return errors.AssertionFailedf("bench: region %d token %d is not the row written", r, t)
			}
		}
	}
	return nil
}
