package tensor_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// The model-based test: random sequences of new / narrow / slice / permute
// / transpose / reshape / set / at / copy / contiguous run against real
// tensors over two buffers and against a plain model: each buffer is a
// []float64, and each tensor is its shape plus the list of buffer elements
// it names in row-major order (computed by index arithmetic on that list,
// never from strides). After every step the tensors' layouts must name the
// model's elements, and every element read must match the model. Whether
// a reshape can be a view is decided by brute force on the model's element
// list. Sequences are decoded from bytes, so the fuzz target explores the
// same space.

const (
	mElems  = 240 // elements in each buffer
	mPool   = 8   // tensors kept at once
	opBytes = 6
	maxOps  = 120
)

type opKind uint8

const (
	opNew opKind = iota
	opNarrow
	opSlice
	opPermute
	opTranspose
	opReshape
	opSet
	opAt
	opCopy
	opContiguous
	numOps
)

var opNames = [...]string{"new", "narrow", "slice", "permute", "transpose", "reshape", "set", "at", "copy", "contiguous"}

// op is one decoded operation; the meaning of a..e depends on kind.
type op struct {
	kind          opKind
	a, b, c, d, e uint8
}

func (o op) String() string {
	return fmt.Sprintf("%s(%d,%d,%d,%d,%d)", opNames[o.kind], o.a, o.b, o.c, o.d, o.e)
}

// program is a dtype and the operations run on tensors of it.
type program struct {
	dt  tensor.DType
	ops []op
}

// decode turns any byte string into a program: the first byte picks the
// dtype, then opBytes bytes per operation, a trailing partial one ignored.
// It never fails.
func decode(data []byte) program {
	var p program
	if len(data) == 0 {
		return p
	}
	p.dt = tensor.DType(data[0] % 8)
	data = data[1:]
	for len(data) >= opBytes && len(p.ops) < maxOps {
		p.ops = append(p.ops, op{kind: opKind(data[0] % byte(numOps)), a: data[1], b: data[2], c: data[3], d: data[4], e: data[5]})
		data = data[opBytes:]
	}
	return p
}

// encode is decode's inverse, for building seeds.
func encode(p program) []byte {
	out := []byte{byte(p.dt)}
	for _, o := range p.ops {
		out = append(out, byte(o.kind), o.a, o.b, o.c, o.d, o.e)
	}
	return out
}

// The model.
type mBuf struct {
	buf   tensor.Buffer
	bytes []byte
	vals  []float64
	full  *tensor.Tensor // [mElems] over the whole buffer
}

type mTensor struct {
	t     *tensor.Tensor
	buf   int
	base  int // the element of the buffer the tensor's own storage starts at
	shape []int
	idx   []int // the buffer element of each element, row-major
}

type harness struct {
	t       testing.TB
	dt      tensor.DType
	bufs    [2]*mBuf
	pool    []*mTensor
	next    int
	steps   []string
	refused int
}

// newHarness runs on the two given buffers, each of mElems elements of dt.
func newHarness(t testing.TB, dt tensor.DType, bufs [2]tensor.Buffer) *harness {
	h := &harness{t: t, dt: dt}
	for i, b := range bufs {
		bytes, err := b.Bytes()
		require.NoError(t, err)
		require.Len(t, bytes, mElems*dt.Size())
		full, err := tensor.New(b, dt, mElems)
		require.NoError(t, err)
		m := &mBuf{buf: b, bytes: bytes, vals: make([]float64, mElems), full: full}
		for k := range m.vals {
			m.vals[k] = float64((k*7 + i*3) % 100)
			require.NoError(t, full.Set(m.vals[k], k))
		}
		h.bufs[i] = m
		h.push(&mTensor{t: full, buf: i, shape: []int{mElems}, idx: seq(0, mElems)})
	}
	x, err := h.bufs[0].full.Reshape(4, 6, 10)
	require.NoError(t, err)
	h.push(&mTensor{t: x, shape: []int{4, 6, 10}, idx: seq(0, mElems)})
	return h
}

// seq is from, from+1, ... (n of them).
func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func (h *harness) push(m *mTensor) {
	if len(h.pool) < mPool {
		h.pool = append(h.pool, m)
		return
	}
	h.pool[h.next] = m
	h.next = (h.next + 1) % mPool
}

func (h *harness) pick(x uint8) *mTensor { return h.pool[int(x)%len(h.pool)] }

// String is the steps so far, for failure messages: testify formats its
// arguments only when a check fails, so passing h costs nothing.
func (h *harness) String() string { return "steps:\n" + strings.Join(h.steps, "\n") }

// refuse checks a refusal the model predicted: the sentinel, the message,
// and that the tensor operated on is as it was.
func (h *harness) refuse(err error, m *mTensor, before layout, frags ...string) {
	h.t.Helper()
	if err == nil {
		require.FailNowf(h.t, "the model predicts a refusal", "%v", h)
	}
	drivertest.RequireIs(h.t, err, driver.ErrInvalid, append([]string{"tensor: "}, frags...)...)
	if m != nil {
		require.Equal(h.t, before, layoutOf(m.t))
	}
	h.refused++
}

func (h *harness) ok(err error) {
	h.t.Helper()
	require.NoErrorf(h.t, err, "%v", h)
}

// derive returns the element list of a view of m with newShape whose
// index ni names m's index oi (toOld fills oi).
func derive(m *mTensor, newShape []int, toOld func(ni, oi []int)) []int {
	var out []int
	oi := make([]int, len(m.shape))
	forEachIndex(newShape, func(ni []int) {
		toOld(ni, oi)
		flat := 0
		for d, i := range oi {
			flat = flat*m.shape[d] + i
		}
		out = append(out, m.idx[flat])
	})
	return out
}

func numel(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// viewable decides by brute force whether strides exist that lay newShape
// over the elements idx in order.
func viewable(idx, newShape []int) bool {
	if len(idx) == 0 {
		return true
	}
	strides := make([]int, len(newShape))
	unit := 1
	for d := len(newShape) - 1; d >= 0; d-- {
		if newShape[d] > 1 {
			strides[d] = idx[unit] - idx[0]
		}
		unit *= newShape[d]
	}
	ok := true
	k := 0
	forEachIndex(newShape, func(ni []int) {
		a := idx[0]
		for d, i := range ni {
			a += i * strides[d]
		}
		ok = ok && a == idx[k]
		k++
	})
	return ok
}

// index decodes one index per dim from x, out of range now and then.
func index(shape []int, x uint32) ([]int, bool) {
	idx := make([]int, len(shape))
	in := true
	for d, s := range shape {
		idx[d] = int(x % uint32(s+1))
		x /= uint32(s + 1)
		in = in && idx[d] < s
	}
	return idx, in
}

var newShapes = [][]int{
	{240}, {2, 120}, {12, 20}, {4, 6, 10}, {2, 3, 4, 10}, {3, 4, 5, 4}, {16, 16}, {0, 5},
	{3, -1}, {}, {1, 1, 7}, {5, 0, 3}, {2, 2, 2, 2, 2, 2}, {241},
}

// reshapeTarget builds a shape for n elements from the bytes: a random
// factorisation, sometimes with a -1, sometimes with a wrong count.
func reshapeTarget(n int, o op) []int {
	k := 1 + int(o.b%4)
	rng := rand.New(rand.NewPCG(uint64(o.c)<<8|uint64(o.d), uint64(o.e)))
	shape := make([]int, k)
	rem := n
	for i := range k - 1 {
		if rem == 0 {
			shape[i] = rng.IntN(4)
			continue
		}
		var divs []int
		for d := 1; d <= rem; d++ {
			if rem%d == 0 {
				divs = append(divs, d)
			}
		}
		shape[i] = divs[rng.IntN(len(divs))]
		rem /= shape[i]
	}
	shape[k-1] = rem
	switch o.e % 8 {
	case 0, 1:
		shape[rng.IntN(k)] = -1
	case 2:
		shape[rng.IntN(k)]++
	case 3:
		if k > 1 {
			shape[0], shape[1] = -1, -1
		}
	}
	return shape
}

// reshapeValid is the model's rule for reshape arguments; it returns the
// shape with -1 inferred.
func reshapeValid(n int, shape []int) ([]int, bool) {
	out := slices.Clone(shape)
	infer, known := -1, 1
	for d, s := range shape {
		switch {
		case s == -1 && infer >= 0, s < -1:
			return nil, false
		case s == -1:
			infer = d
		default:
			known *= s
		}
	}
	if infer >= 0 {
		if known == 0 || n%known != 0 {
			return nil, false
		}
		out[infer] = n / known
		return out, true
	}
	return out, known == n
}

func (h *harness) step(o op) {
	t := h.t
	h.steps = append(h.steps, o.String())
	sz := h.dt.Size()
	switch o.kind {
	case opNew:
		b := int(o.a % 2)
		shape := newShapes[int(o.b)%len(newShapes)]
		x, err := tensor.New(h.bufs[b].buf, h.dt, shape...)
		if slices.Min(append([]int{0}, shape...)) < 0 || numel(shape) > mElems {
			h.refuse(err, nil, layout{})
			return
		}
		h.ok(err)
		h.push(&mTensor{t: x, buf: b, shape: slices.Clone(shape), idx: seq(0, numel(shape))})

	case opNarrow, opSlice:
		m := h.pick(o.a)
		before := layoutOf(m.t)
		nd := len(m.shape)
		dim := int(o.b) % (nd + 1)
		size := 0
		if dim < nd {
			size = m.shape[dim]
		}
		start := int(o.c) % (size + 2)
		if o.e >= 250 {
			start = -1
		}
		var x *tensor.Tensor
		var err error
		var valid bool
		var length, step int
		if o.kind == opNarrow {
			length = int(o.d) % (size + 2)
			x, err = m.t.Narrow(dim, start, length)
			valid = dim < nd && start >= 0 && start+length <= size
			step = 1
		} else {
			end := start + int(o.d)%(size+2)
			if o.e >= 240 && o.e < 250 {
				end = start - 1
			}
			step = int(o.e % 5)
			x, err = m.t.Slice(dim, start, end, step)
			valid = dim < nd && step >= 1 && start >= 0 && start <= end && end <= size
			if valid {
				length = (end - start + step - 1) / step
			}
		}
		if !valid {
			h.refuse(err, m, before)
			return
		}
		h.ok(err)
		shape := slices.Clone(m.shape)
		shape[dim] = length
		idx := derive(m, shape, func(ni, oi []int) {
			copy(oi, ni)
			oi[dim] = start + ni[dim]*step
		})
		h.push(&mTensor{t: x, buf: m.buf, base: m.base, shape: shape, idx: idx})

	case opPermute, opTranspose:
		m := h.pick(o.a)
		before := layoutOf(m.t)
		nd := len(m.shape)
		var perm []int
		var x *tensor.Tensor
		var err error
		valid := true
		if o.kind == opPermute {
			perm = seq(0, nd)
			rng := rand.New(rand.NewPCG(uint64(o.b), uint64(o.c)))
			rng.Shuffle(nd, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			if o.d%8 == 0 {
				if nd >= 2 {
					perm[0] = perm[1]
				} else {
					perm = append(perm, nd)
				}
				valid = false
			}
			x, err = m.t.Permute(perm...)
		} else {
			a, b := int(o.b)%(nd+1), int(o.c)%(nd+1)
			valid = a < nd && b < nd
			x, err = m.t.Transpose(a, b)
			if valid {
				perm = seq(0, nd)
				perm[a], perm[b] = b, a
			}
		}
		if !valid {
			h.refuse(err, m, before)
			return
		}
		h.ok(err)
		shape := make([]int, nd)
		for i, p := range perm {
			shape[i] = m.shape[p]
		}
		idx := derive(m, shape, func(ni, oi []int) {
			for i, p := range perm {
				oi[p] = ni[i]
			}
		})
		h.push(&mTensor{t: x, buf: m.buf, base: m.base, shape: shape, idx: idx})

	case opReshape:
		m := h.pick(o.a)
		before := layoutOf(m.t)
		target := reshapeTarget(len(m.idx), o)
		x, err := m.t.Reshape(target...)
		shape, valid := reshapeValid(len(m.idx), target)
		if !valid {
			h.refuse(err, m, before)
			return
		}
		if !viewable(m.idx, shape) {
			h.refuse(err, m, before, "do not allow a view", "make it contiguous first")
			return
		}
		h.ok(err)
		h.push(&mTensor{t: x, buf: m.buf, base: m.base, shape: shape, idx: m.idx})

	case opSet, opAt:
		m := h.pick(o.a)
		before := layoutOf(m.t)
		idx, in := index(m.shape, uint32(o.b)|uint32(o.c)<<8|uint32(o.d)<<16)
		if o.kind == opAt {
			v, err := m.t.At(idx...)
			if !in {
				h.refuse(err, m, before, "out of range")
				return
			}
			h.ok(err)
			require.Equal(t, h.bufs[m.buf].vals[m.idx[flat(m.shape, idx)]], v, "at %v\n%v", idx, h)
			return
		}
		v := float64(int(o.e) % 100)
		if o.e >= 240 {
			v += 0.5
		}
		err := m.t.Set(v, idx...)
		if !in {
			h.refuse(err, m, before, "out of range")
			return
		}
		if v != float64(int(v)) && (h.dt == tensor.Int8 || h.dt == tensor.Uint8 || h.dt == tensor.Int32 || h.dt == tensor.Int64) {
			h.refuse(err, m, before, "is not an integer")
			return
		}
		h.ok(err)
		h.bufs[m.buf].vals[m.idx[flat(m.shape, idx)]] = v

	case opCopy:
		src := h.pick(o.a)
		var dst *mTensor
		if o.e%5 == 0 {
			dst = h.pick(o.b)
		} else {
			// A tensor of src's shape in another layout: a run of the
			// buffer laid out in a permuted shape, permuted back.
			b := int(o.c % 2)
			nd := len(src.shape)
			perm := seq(0, nd)
			rand.New(rand.NewPCG(uint64(o.d), 1)).Shuffle(nd, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			inv := make([]int, nd)
			pshape := make([]int, nd)
			for i, p := range perm {
				inv[p] = i
				pshape[i] = src.shape[p]
			}
			n := len(src.idx)
			off := int(o.e) % (mElems - n + 1)
			x, err := h.bufs[b].full.Narrow(0, off, n)
			h.ok(err)
			x, err = x.Reshape(pshape...)
			h.ok(err)
			x, err = x.Permute(inv...)
			h.ok(err)
			pm := &mTensor{shape: pshape, idx: seq(off, n)}
			dst = &mTensor{t: x, buf: b, shape: slices.Clone(src.shape), idx: derive(pm, src.shape, func(ni, oi []int) {
				for i, p := range perm {
					oi[i] = ni[p]
				}
			})}
			h.push(dst)
		}
		before := layoutOf(dst.t)
		err := tensor.Copy(dst.t, src.t)
		if !slices.Equal(dst.shape, src.shape) {
			h.refuse(err, dst, before, "the shapes differ")
			return
		}
		h.ok(err)
		tmp := make([]float64, len(src.idx))
		for k, i := range src.idx {
			tmp[k] = h.bufs[src.buf].vals[i]
		}
		for k, i := range dst.idx {
			h.bufs[dst.buf].vals[i] = tmp[k]
		}

	case opContiguous:
		m := h.pick(o.a)
		before := layoutOf(m.t)
		b := int(o.b % 2)
		off := int(o.c) % (mElems + 1)
		x, err := m.t.Contiguous(heap(h.bufs[b].bytes[off*sz:]))
		if len(m.idx) > mElems-off {
			h.refuse(err, m, before, "contiguous copy", "needs")
			return
		}
		h.ok(err)
		tmp := make([]float64, len(m.idx))
		for k, i := range m.idx {
			tmp[k] = h.bufs[m.buf].vals[i]
		}
		copy(h.bufs[b].vals[off:], tmp)
		h.push(&mTensor{t: x, buf: b, base: off, shape: slices.Clone(m.shape), idx: seq(off, len(m.idx))})
	}
}

func flat(shape, idx []int) int {
	f := 0
	for d, i := range idx {
		f = f*shape[d] + i
	}
	return f
}

// dataValues reads a contiguous tensor through Data with its storage type.
func dataValues(x *tensor.Tensor) ([]float64, error) {
	conv := func(n int, at func(int) float64, err error) ([]float64, error) {
		if err != nil {
			return nil, err
		}
		out := make([]float64, n)
		for i := range out {
			out[i] = at(i)
		}
		return out, nil
	}
	switch x.DType() {
	case tensor.Float32:
		d, err := tensor.Data[float32](x)
		return conv(len(d), func(i int) float64 { return float64(d[i]) }, err)
	case tensor.Float16:
		d, err := tensor.Data[tensor.F16](x)
		return conv(len(d), func(i int) float64 { return d[i].Float64() }, err)
	case tensor.BFloat16:
		d, err := tensor.Data[tensor.BF16](x)
		return conv(len(d), func(i int) float64 { return d[i].Float64() }, err)
	case tensor.Float64:
		d, err := tensor.Data[float64](x)
		return conv(len(d), func(i int) float64 { return d[i] }, err)
	case tensor.Int8:
		d, err := tensor.Data[int8](x)
		return conv(len(d), func(i int) float64 { return float64(d[i]) }, err)
	case tensor.Uint8:
		d, err := tensor.Data[uint8](x)
		return conv(len(d), func(i int) float64 { return float64(d[i]) }, err)
	case tensor.Int32:
		d, err := tensor.Data[int32](x)
		return conv(len(d), func(i int) float64 { return float64(d[i]) }, err)
	case tensor.Int64:
		d, err := tensor.Data[int64](x)
		return conv(len(d), func(i int) float64 { return float64(d[i]) }, err)
	}
	return nil, fmt.Errorf("dtype %s", x.DType())
}

// compare checks every buffer and every tensor of the pool against the
// model. Slices are compared with slices.Equal and handed to require only
// when they differ: reflection per step is most of the test's time
// under -race otherwise.
func (h *harness) compare() {
	t := h.t
	equal := func(want, got any, eq bool, format string, args ...any) {
		t.Helper()
		if !eq {
			require.Equalf(t, want, got, format+"\n%v", append(args, h)...)
		}
	}
	for b, m := range h.bufs {
		got, err := dataValues(m.full)
		require.NoError(t, err)
		equal(m.vals, got, slices.Equal(m.vals, got), "buffer %d", b)
	}
	for i, m := range h.pool {
		x := m.t
		if err := x.Check(); err != nil {
			require.NoError(t, err)
		}
		shape := x.Shape()
		equal(m.shape, shape, slices.Equal(m.shape, shape), "the shape of tensor %d (%s)", i, x)
		// The layout names the model's elements.
		strides := x.Strides()
		addrs := make([]int, 0, len(m.idx))
		forEachIndex(m.shape, func(idx []int) {
			a := m.base + x.Offset()
			for d, j := range idx {
				a += j * strides[d]
			}
			addrs = append(addrs, a)
		})
		equal(m.idx, addrs, slices.Equal(m.idx, addrs), "the elements of tensor %d (%s)", i, x)
		contiguous := true
		for k := 1; k < len(m.idx); k++ {
			contiguous = contiguous && m.idx[k] == m.idx[k-1]+1
		}
		equal(contiguous, x.IsContiguous(), contiguous == x.IsContiguous(), "tensor %d (%s) is contiguous", i, x)
		// Every element reads as the model's, through At and (when
		// contiguous) through Data.
		vals := h.bufs[m.buf].vals
		want := make([]float64, len(m.idx))
		for k, j := range m.idx {
			want[k] = vals[j]
		}
		got := values(t, x)
		equal(want, got, slices.Equal(want, got), "the values of tensor %d (%s)", i, x)
		data, err := dataValues(x)
		if contiguous {
			require.NoError(t, err)
			equal(want, data, slices.Equal(want, data), "the data of tensor %d (%s)", i, x)
		} else if err == nil {
			require.FailNowf(t, "Data of a strided tensor", "tensor %d (%s)\n%v", i, x, h)
		}
	}
}

func runModel(t testing.TB, p program, bufs [2]tensor.Buffer) *harness {
	h := newHarness(t, p.dt, bufs)
	h.compare()
	for _, o := range p.ops {
		h.step(o)
		h.compare()
	}
	return h
}

func heapBuffers(dt tensor.DType) [2]tensor.Buffer {
	return [2]tensor.Buffer{newHeap(mElems * dt.Size()), newHeap(mElems * dt.Size())}
}

// randomProgram is a program of n operations, biased towards making views.
func randomProgram(rng *rand.Rand, dt tensor.DType, n int) program {
	weights := []int{2, 3, 3, 3, 2, 4, 3, 2, 3, 2}
	total := 0
	for _, w := range weights {
		total += w
	}
	p := program{dt: dt, ops: make([]op, n)}
	for i := range p.ops {
		x := rng.IntN(total)
		k := 0
		for x >= weights[k] {
			x -= weights[k]
			k++
		}
		p.ops[i] = op{kind: opKind(k), a: uint8(rng.Uint32()), b: uint8(rng.Uint32()), c: uint8(rng.Uint32()),
			d: uint8(rng.Uint32()), e: uint8(rng.Uint32())}
	}
	return p
}

// TestModel runs random programs of every dtype, on arena views (the
// first seeds) and on heap buffers.
func TestModel(t *testing.T) {
	seeds := 48
	if testing.Short() {
		seeds = 16
	}
	s := newStack(t)
	for seed := range seeds {
		dt := tensor.DType(seed % 8)
		t.Run(fmt.Sprintf("seed%d-%s", seed, dt), func(t *testing.T) {
			bufs := heapBuffers(dt)
			if seed < 16 {
				a := s.arena(t, gran)
				require.NoError(t, a.Grow(2*mElems*8))
				for i := range bufs {
					v, err := a.View(uint64(i*mElems*8), uint64(mElems*dt.Size()))
					require.NoError(t, err)
					t.Cleanup(func() { require.NoError(t, v.Release()) })
					bufs[i] = v
				}
			}
			h := runModel(t, randomProgram(rand.New(rand.NewPCG(uint64(seed), 11)), dt, maxOps), bufs)
			t.Logf("%d operations refused as predicted", h.refused)
		})
	}
}

func TestDecode(t *testing.T) {
	p := randomProgram(rand.New(rand.NewPCG(1, 1)), tensor.Int32, 50)
	require.Equal(t, p, decode(encode(p)))
	require.Empty(t, decode([]byte{1, 2, 3}).ops, "a partial operation is ignored")
	require.Equal(t, tensor.Float32, decode(nil).dt)
	require.Len(t, decode(make([]byte, 1+opBytes*(maxOps+5))).ops, maxOps)
}

// FuzzTensorOps decodes arbitrary bytes into a program and runs it against
// the model, on heap buffers. The seed corpus is in
// testdata/fuzz/FuzzTensorOps.
func FuzzTensorOps(f *testing.F) {
	f.Add(encode(randomProgram(rand.New(rand.NewPCG(9, 9)), tensor.Float16, 40)))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := decode(data)
		require.True(t, p.dt.Valid())
		for _, o := range p.ops {
			require.Less(t, int(o.kind), int(numOps))
		}
		if len(data) > 0 {
			require.Equal(t, min((len(data)-1)/opBytes, maxOps), len(p.ops), "decode consumes whole operations")
			require.Equal(t, p, decode(encode(p)), "encode inverts decode")
		}
		runModel(t, p, heapBuffers(p.dt))
	})
}

// TestSeedCorpus checks the fuzz seed corpus is there and decodes into real
// programs. With VMARENA_WRITE_CORPUS=1 it writes the corpus afresh.
func TestSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzTensorOps")
	sizes := []int{10, 30, 60, 90, maxOps}
	if os.Getenv("VMARENA_WRITE_CORPUS") == "1" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for i, n := range sizes {
			dt := []tensor.DType{tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Int8, tensor.Int64}[i]
			data := encode(randomProgram(rand.New(rand.NewPCG(uint64(200+i), 5)), dt, n))
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d-ops-%s", n, dt)), []byte(body), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "seed-*"))
	require.NoError(t, err)
	require.Len(t, files, len(sizes))
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.SplitN(string(body), "\n", 3)
		require.Equal(t, "go test fuzz v1", lines[0])
		quoted := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		data, err := strconv.Unquote(quoted)
		require.NoError(t, err, f)
		require.NotEmpty(t, decode([]byte(data)).ops, f)
	}
}
