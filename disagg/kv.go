package disagg

import (
	"encoding/binary"
	"math"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
)

// KV is where a model stores and loads a sequence's keys and values, per
// layer and position (the reference transformer's KV).
type KV = transformer.KV

// Model is what each side computes with: Step decodes token at position
// pos, storing its keys and values through kv (which holds positions
// 0..pos-1) and returning the logits that predict the next token. The
// reference transformer (internal/transformer) is one; it must be
// deterministic for the two sides to agree with one process.
type Model interface {
	Step(kv KV, pos, token int) ([]float32, error)
}

// seqKV is a cache sequence as a model's KV: Store writes into the rows
// the last Append handed out, Load reads the sequence's K and V.
//
// On a cache whose memory the process does not address (CUDA, AscendCL:
// device tensors), the model, which computes on the host, reaches the
// rows through the driver's copies: a Store copies the position's K and V
// rows to the device, and the first Load of a layer after an Append
// copies the layer's rows off it, each through a pinned buffer and a
// stream made at the first such access and ended by close. A GPU model's
// kernels would read and write the rows in place; the reference
// transformer is a host model, the oracle the tests compare with.
type seqKV struct {
	seq  *kvcache.Seq
	drv  driver.Driver // the cache's, for the copies of device rows
	dev  driver.DeviceID
	dc   *devCopy // nil until the first device row
	step kvcache.Step
	// k[l][g], v[l][g] are layer l's keys and values of page group g
	// (TokenMajor; PerLayer has one group, every position) as of the last
	// Append, read from the cache on the first Load after it. They alias
	// the cache's memory: valid while the sequence runs, and dropped at
	// every Append.
	k, v [][][]float32
	tpg  int // positions a group holds; 0: one group (PerLayer)
}

func newSeqKV(c *kvcache.Cache, s *kvcache.Seq, layers, tpg int) *seqKV {
	return &seqKV{seq: s, drv: c.Driver(), dev: c.Config().Device, k: make([][][]float32, layers), v: make([][][]float32, layers), tpg: tpg}
}

// close ends the copies' stream and buffer, if any were made.
func (a *seqKV) close() error {
	if a.dc == nil {
		return nil
	}
	err := a.dc.close()
	a.dc = nil
	return err
}

// copier is the stream and buffer for the device rows, made at the first.
func (a *seqKV) copier() (*devCopy, error) {
	if a.dc == nil {
		dc, err := newDevCopy(a.drv, a.dev)
		if err != nil {
			return nil, err
		}
		a.dc = dc
	}
	return a.dc, nil
}

// appended takes the views of the rows an Append made room for.
func (a *seqKV) appended(step kvcache.Step) {
	a.step = step
	clear(a.k)
	clear(a.v)
}

func (a *seqKV) Store(layer, pos int, k, v []float32) error {
	if layer < 0 || layer >= len(a.step.Layers) {
		return errors.AssertionFailedf("disagg: store of layer %d of %d", layer, len(a.step.Layers))
	}
	for _, r := range a.step.Layers[layer] {
		if n := r.K.Shape()[0]; pos < r.Pos || pos >= r.Pos+n {
			continue
		}
		for _, x := range [2]struct {
			dst    *tensor.Tensor
			src    []float32
			loaded [][]float32
		}{{r.K, k, a.k[layer]}, {r.V, v, a.v[layer]}} {
			if !x.dst.Addressable() {
				if err := a.storeDevice(x.dst, pos-r.Pos, x.src); err != nil {
					return err
				}
				// The rows Load copied off the device since the Append
				// take the store too.
				if g, j := a.at(pos); x.loaded != nil && g < len(x.loaded) && (j+1)*len(x.src) <= len(x.loaded[g]) {
					copy(x.loaded[g][j*len(x.src):], x.src)
				}
				continue
			}
			d, err := tensor.Data[float32](x.dst)
			if err != nil {
				return err
			}
			copy(d[(pos-r.Pos)*len(x.src):], x.src)
		}
		return nil
	}
	return errors.AssertionFailedf("disagg: position %d is not among the rows the last Append handed out (%d from %d)",
		pos, a.step.N, a.step.Pos)
}

func (a *seqKV) Load(layer, pos int, k, v []float32) error {
	if layer < 0 || layer >= len(a.k) {
		return errors.AssertionFailedf("disagg: load of layer %d of %d", layer, len(a.k))
	}
	if a.k[layer] == nil {
		for _, x := range [2]struct {
			get func(int) (*tensor.Tensor, error)
			dst *[][]float32
		}{{a.seq.K, &a.k[layer]}, {a.seq.V, &a.v[layer]}} {
			t, err := x.get(layer)
			if err != nil {
				return err
			}
			if !t.Addressable() {
				*x.dst, err = a.loadDevice(t)
			} else {
				*x.dst, err = groups(t, a.tpg)
			}
			if err != nil {
				return err
			}
		}
	}
	g, j := a.at(pos)
	w := len(k)
	if g >= len(a.k[layer]) || (j+1)*w > len(a.k[layer][g]) {
		return errors.AssertionFailedf("disagg: load of position %d beyond the sequence's rows", pos)
	}
	copy(k, a.k[layer][g][j*w:])
	copy(v, a.v[layer][g][j*w:])
	return nil
}

// groups are t's rows as float32 slices: PerLayer's t [tokens, heads,
// dim] whole (tpg 0); TokenMajor's [groups, tpg, heads, dim] one slice a
// group, each contiguous.
func groups(t *tensor.Tensor, tpg int) ([][]float32, error) {
	if tpg == 0 {
		d, err := tensor.Data[float32](t)
		return [][]float32{d}, err
	}
	out := make([][]float32, t.Shape()[0])
	for g := range out {
		gt, err := t.Narrow(0, g, 1)
		if err != nil {
			return nil, err
		}
		if out[g], err = tensor.Data[float32](gt); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// at is position pos's group and row in it, as Load's slices hold them.
func (a *seqKV) at(pos int) (g, j int) {
	if a.tpg > 0 {
		return pos / a.tpg, pos % a.tpg
	}
	return 0, pos
}

// storeDevice copies row i of the device rows x ([n, KVHeads, HeadDim])
// from src to the device.
func (a *seqKV) storeDevice(x *tensor.Tensor, i int, src []float32) error {
	dc, err := a.copier()
	if err != nil {
		return err
	}
	row, err := x.Narrow(0, i, 1)
	if err != nil {
		return err
	}
	return row.AccessDevice(true, func(addr driver.Addr, n uint64) error {
		if n != 4*uint64(len(src)) {
			return errors.AssertionFailedf("disagg: a row of %d bytes for %d floats", n, len(src))
		}
		return dc.put(addr, src)
	})
}

// loadDevice is groups over device tensor t: its rows copied off the
// device, one slice a page group (TokenMajor) or one for all (PerLayer).
// A group's rows are contiguous, copied in one run; in the Contiguous
// layout (strided rows) each row is a run of its own.
func (a *seqKV) loadDevice(t *tensor.Tensor) ([][]float32, error) {
	dc, err := a.copier()
	if err != nil {
		return nil, err
	}
	parts := []*tensor.Tensor{t}
	if a.tpg > 0 {
		parts = parts[:0]
		for g := range t.Shape()[0] {
			gt, err := t.Narrow(0, g, 1)
			if err != nil {
				return nil, err
			}
			parts = append(parts, gt)
		}
	}
	out := make([][]float32, len(parts))
	for i, x := range parts {
		out[i] = make([]float32, 0, x.NumElements())
		runs := []*tensor.Tensor{x}
		if !x.IsContiguous() { // Contiguous layout: a row a run
			runs = runs[:0]
			for r := range x.Shape()[0] {
				row, err := x.Narrow(0, r, 1)
				if err != nil {
					return nil, err
				}
				runs = append(runs, row)
			}
		}
		for _, run := range runs {
			if err := run.AccessDevice(false, func(addr driver.Addr, n uint64) error {
				var err error
				out[i], err = dc.get(out[i], addr, n)
				return err
			}); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// devCopySize is the pinned buffer of a devCopy: rows move through it in
// pieces of at most this many bytes.
const devCopySize = 64 << 10

// devCopy moves float32 rows between the host and a device: a stream on
// the rows' device and a pinned buffer.
type devCopy struct {
	s  *stream.Stream
	hb *stream.HostBuffer
}

// newDevCopy makes the stream on device dev of drv and the buffer.
func newDevCopy(drv driver.Driver, dev driver.DeviceID) (*devCopy, error) {
	if drv == nil || !drv.Supports(driver.FeatureStreams) {
		return nil, errors.Wrap(driver.ErrUnsupported, "disagg: the cache's memory is a device's, and its driver has no streams to copy the model's rows with")
	}
	s, err := stream.New(drv, dev)
	if err != nil {
		return nil, errors.Wrap(err, "disagg: a stream for the model's rows")
	}
	hb, err := stream.NewHostBuffer(drv, devCopySize)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "disagg: a pinned buffer for the model's rows"), s.Destroy())
	}
	return &devCopy{s: s, hb: hb}, nil
}

func (dc *devCopy) close() error { return errors.CombineErrors(dc.hb.Free(), dc.s.Destroy()) }

// put copies src to the device at addr.
func (dc *devCopy) put(addr driver.Addr, src []float32) error {
	buf := dc.hb.Bytes()
	per := len(buf) / 4
	for i := 0; i < len(src); i += per {
		part := src[i:min(i+per, len(src))]
		for j, f := range part {
			binary.NativeEndian.PutUint32(buf[4*j:], math.Float32bits(f))
		}
		if err := dc.s.CopyHtoDSync(addr+driver.Addr(4*i), buf[:4*len(part)]); err != nil {
			return errors.Wrap(err, "disagg: copy a row to the device")
		}
	}
	return nil
}

// get appends the n bytes of floats at device address addr to out.
func (dc *devCopy) get(out []float32, addr driver.Addr, n uint64) ([]float32, error) {
	buf := dc.hb.Bytes()
	for off := uint64(0); off < n; off += uint64(len(buf)) {
		k := min(n-off, uint64(len(buf)))
		if err := dc.s.CopyDtoHSync(buf[:k], addr+driver.Addr(off)); err != nil {
			return nil, errors.Wrap(err, "disagg: copy rows off the device")
		}
		for j := uint64(0); j+4 <= k; j += 4 {
			out = append(out, math.Float32frombits(binary.NativeEndian.Uint32(buf[j:])))
		}
	}
	return out, nil
}
