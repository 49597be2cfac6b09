package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/internal/attention"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// maxBenchBytes bounds the memory a benchmark of this file or growth.go
// may ask for (1 PiB, beyond any host driver's capacity), so that its byte
// counts never wrap: a larger one is ErrTooLarge at once.
const maxBenchBytes = 1 << 50

// PagedBlockTokens is the paged side's block size in tokens: vLLM's
// default.
const PagedBlockTokens = 16

// DecodeAttention times one decode step's attention (one query token, one
// layer, one sequence of tokens cached tokens) over the same keys and
// values laid out two ways, in the same loop:
//
//   - Lib: attention.Contiguous over a kvcache sequence's K and V
//     (Seq.K, Seq.V): a cache of one layer, one slot, per-layer layout and
//     2 MiB pages on the host driver, the sequence's prompt appended in one
//     Append and written through the views it returned. In that layout K
//     and V are plain row-major [tokens, KVHeads, HeadDim] float32 tensors,
//     the kernel reads them as they lie (tensor.Data), no copy.
//   - Bare: attention.Paged over a pool of PagedBlockTokens-token blocks
//     [blocks, 16, KVHeads, HeadDim] in an arena of the same driver, the
//     sequence's blocks shuffled through the pool and found through a
//     block table (vLLM's way), filled from the cache's K and V.
//
// The two kernels do the same arithmetic in the same order; after every
// round (untimed) their outputs are compared bit for bit, and a difference
// is an error. Each round counts one step; Ratio() is contiguous over
// paged time. Host driver, default capacity: ErrTooLarge when it cannot
// hold both layouts.
func DecodeAttention(more func() bool, s attention.Shape, tokens int) (p Pair, err error) {
	if tokens < 1 || s.Heads < 1 || s.KVHeads < 1 || s.HeadDim < 1 || s.Heads%s.KVHeads != 0 {
		return p, errors.Newf("bench: decode attention over %d tokens of shape %+v: positive sizes, heads a multiple of KV heads", tokens, s)
	}
	// Taken in float64: the byte counts of a shape this large would wrap.
	// Four copies of K or V (the tensors and the pools), the scores, q and
	// the two outputs, 4 bytes a value.
	kv := float64(tokens+PagedBlockTokens) * float64(s.KVHeads) * float64(s.HeadDim)
	if 4*(4*kv+float64(tokens)*float64(s.Heads)+3*float64(s.Heads)*float64(s.HeadDim)) > maxBenchBytes {
		return p, errors.Wrapf(ErrTooLarge, "bench: decode attention over %d tokens of shape %+v needs more than %s",
			tokens, s, units.Bytes(maxBenchBytes))
	}
	rl := s.RowLen()
	nblocks := (tokens + PagedBlockTokens - 1) / PagedBlockTokens
	side := func(rows int) uint64 { return uint64(rows) * uint64(rl) * 4 } // bytes of K (or V)
	need := 2*side(tokens) + 2*side(nblocks*PagedBlockTokens) + 4*ChunkSize
	drv, space, mem, err := hostArenas(need, fmt.Sprintf("decode attention over %d tokens of %d KV heads of %d", tokens, s.KVHeads, s.HeadDim))
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()

	rng := rand.New(rand.NewPCG(uint64(tokens), uint64(s.Heads)))
	fill := func(x []float32) {
		for i := range x {
			x[i] = 2*rng.Float32() - 1
		}
	}
	// The cache's layout: one sequence of tokens tokens, K and V written
	// through Append's views, read through Seq.K and Seq.V.
	cont, err := newSeqKV(space, mem, tokens, s, fill)
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, cont.close()) }()
	// The paged layout: a pool of blocks for K and one for V.
	pool, err := newKVTensors(space, mem, nblocks*PagedBlockTokens, s)
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, pool.close()) }()

	table := make([]int32, nblocks)
	for i, b := range rng.Perm(nblocks) {
		table[i] = int32(b)
	}
	blockLen := PagedBlockTokens * rl
	for i, b := range table {
		t0 := i * PagedBlockTokens
		n := min(PagedBlockTokens, tokens-t0)
		copy(pool.k[int(b)*blockLen:], cont.k[t0*rl:(t0+n)*rl])
		copy(pool.v[int(b)*blockLen:], cont.v[t0*rl:(t0+n)*rl])
	}
	q := make([]float32, s.Heads*s.HeadDim)
	fill(q)
	outC, outP := make([]float32, len(q)), make([]float32, len(q))
	scores := make([]float32, s.ScoresLen(tokens))

	contiguous := func(into *time.Duration) error {
		t0 := time.Now()
		err := attention.Contiguous(s, outC, q, cont.k, cont.v, tokens, scores)
		*into += time.Since(t0)
		return err
	}
	paged := func(into *time.Duration) error {
		t0 := time.Now()
		err := attention.Paged(s, outP, q, pool.k, pool.v, PagedBlockTokens, table, tokens, scores)
		*into += time.Since(t0)
		return err
	}
	same := func() error {
		for i := range outC {
			if math.Float32bits(outC[i]) != math.Float32bits(outP[i]) {
				return errors.AssertionFailedf("bench: decode attention over %d tokens: output %d is %v contiguous, %v paged",
					tokens, i, outC[i], outP[i])
			}
		}
		clear(outC)
		clear(outP)
		return nil
	}
	return alternate(more, 1, contiguous, paged, same)
}

// seqKV is one layer's K and V held by a kvcache sequence, and their
// elements as Seq.K and Seq.V give them.
type seqKV struct {
	c    *kvcache.Cache
	k, v []float32
}

// newSeqKV makes a cache of one layer and one slot of tokens tokens on the
// host driver (per-layer layout, 2 MiB pages), admits a sequence of
// tokens tokens, appends them and writes their keys and values, drawn by
// fill, through the views Append returns; then takes K and V back from the
// sequence: the memory attention reads.
func newSeqKV(space *vaspace.Space, mem *physical.Memory, tokens int, s attention.Shape, fill func([]float32)) (*seqKV, error) {
	c, err := kvcache.New(space, mem, kvcache.Config{
		Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, DType: tensor.Float32,
		MaxContext: tokens, MaxSeqs: 1, PageSize: ChunkSize, Layout: kvcache.PerLayer,
		MapAhead: -1, NoPrefixSharing: true, // one sequence, appended at once
	})
	if err != nil {
		return nil, err
	}
	kv := &seqKV{c: c}
	fail := func(err error) (*seqKV, error) { return nil, errors.CombineErrors(err, kv.close()) }
	prompt := make([]int, tokens)
	seq, err := c.Admit(prompt, 0)
	if err != nil {
		return fail(err)
	}
	step, err := seq.Append(prompt)
	if err != nil {
		return fail(err)
	}
	for _, r := range step.Layers[0] {
		for _, x := range []*tensor.Tensor{r.K, r.V} {
			d, err := tensor.Data[float32](x)
			if err != nil {
				return fail(err)
			}
			fill(d)
		}
	}
	if err := seq.MarkWritten(seq.Len()); err != nil {
		return fail(err)
	}
	for _, t := range []struct {
		get func(int) (*tensor.Tensor, error)
		x   *[]float32
	}{{seq.K, &kv.k}, {seq.V, &kv.v}} {
		x, err := t.get(0)
		if err != nil {
			return fail(err)
		}
		if *t.x, err = tensor.Data[float32](x); err != nil {
			return fail(err)
		}
	}
	return kv, nil
}

// close ends the cache, its sequence and the tensors over it.
func (kv *seqKV) close() error {
	kv.k, kv.v = nil, nil
	return kv.c.Close()
}

// kvTensors are one layer's K and V, each a float32 tensor
// [rows, KVHeads, HeadDim] in one arena, and their elements.
type kvTensors struct {
	a      *arena.Arena
	kt, vt *tensor.Tensor
	k, v   []float32
}

// newKVTensors returns K and V of rows rows in a new arena of the host
// driver, 2 MiB chunks.
func newKVTensors(space *vaspace.Space, mem *physical.Memory, rows int, s attention.Shape) (*kvTensors, error) {
	bytes := uint64(rows) * uint64(s.RowLen()) * 4
	a, err := arena.New(space, mem, arena.Options{Max: 2*bytes + ChunkSize, ChunkSize: ChunkSize})
	if err != nil {
		return nil, err
	}
	kv := &kvTensors{a: a}
	for _, t := range []struct {
		t **tensor.Tensor
		x *[]float32
	}{{&kv.kt, &kv.k}, {&kv.vt, &kv.v}} {
		if *t.t, err = tensor.OnArena(a, tensor.Float32, rows, s.KVHeads, s.HeadDim); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "bench: %s of K and V", units.Bytes(bytes)), kv.close())
		}
		if *t.x, err = tensor.Data[float32](*t.t); err != nil {
			return nil, errors.CombineErrors(err, kv.close())
		}
	}
	return kv, nil
}

func (kv *kvTensors) close() error {
	var err error
	for _, t := range []*tensor.Tensor{kv.kt, kv.vt} {
		if t != nil {
			err = errors.CombineErrors(err, t.Release())
		}
	}
	kv.k, kv.v = nil, nil
	return errors.CombineErrors(err, kv.a.Close())
}
