package kvcache

import (
	"container/list"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// The recurrent state store: the state of a Hybrid's recurrent layers
// (Mamba, linear attention), fixed-size whatever a sequence's length, in
// one arena.Sparse of slots of slotBytes — every recurrent layer's
// StateBytes side by side, rounded up to whole pages. A running sequence
// holds one slot; a checkpoint is a slot holding a copy of the state a
// prompt prefix left, at a unit boundary (a multiple of BlockTokens),
// keyed by the prefix's block hash chain and compared token by token. An
// admission whose prompt starts with a checkpoint's prefix starts from a
// copy of it (copy-on-admit: the state is rewritten whole at every step,
// so sharing it copy-on-write would copy on the next step anyway).
// Checkpoints no one is copying are evictable, least recently used first,
// like cached prefix units. Every slot committed counts against the
// Hybrid's one budget; the store commits only what the Hybrid granted.
//
// Invariants: a slot index is free, a running sequence's, or a
// checkpoint's — once; committed counts the slots not free; every
// checkpoint is in byKey under its key and in lru.
type recurrentStore struct {
	s     *arena.Sparse
	str   *stream.Stream // copies and zeroing; nil without bytes or streams
	bytes bool           // the driver has bytes (not sim)
	addr  bool           // the process addresses them (tensors)
	// layerOff and layerBytes are each recurrent layer's place in a slot.
	layerOff, layerBytes []uint64
	slotBytes            uint64
	free                 []int // free slot indexes, a stack
	committed            int
	byKey                map[uint64][]*checkpoint
	lru                  *list.List // *checkpoint, least recently used first
	hits, made, evicted  int
}

// checkpoint is a copy of the recurrent state after tokens.
type checkpoint struct {
	key    uint64
	tokens []int
	idx    int
	elem   *list.Element
}

// stateSlot is a running sequence's recurrent state: its slot, a view of
// it once a tensor was asked for, and the lease of those tensors.
type stateSlot struct {
	idx   int
	view  *arena.View
	lease *tensor.Lease
}

// newRecurrentStore reserves slots for maxSeqs sequences and as many
// checkpoints as capacity could hold (address space only).
func newRecurrentStore(space *vaspace.Space, mem *physical.Memory, groups []Group, page uint64, dev driver.DeviceID, maxSeqs int, capacity uint64) (*recurrentStore, error) {
	r := &recurrentStore{byKey: map[uint64][]*checkpoint{}, lru: list.New()}
	var off uint64
	for _, g := range groups {
		if g.Kind != Recurrent {
			continue
		}
		for range g.Layers {
			r.layerOff = append(r.layerOff, off)
			r.layerBytes = append(r.layerBytes, g.StateBytes)
			off += g.StateBytes
		}
	}
	// off is at most 2^40 (NewHybrid's bound): only the page's size
	// and the slots' number can take the products past a range's bytes.
	r.slotBytes = (off + page - 1) / page * page
	if r.slotBytes < off {
		return nil, errors.Wrapf(driver.ErrInvalid, "kvcache: new hybrid cache: a recurrent state of %s on pages of %s overflows", units.Bytes(off), units.Bytes(page))
	}
	n := maxSeqs + int(min(capacity/r.slotBytes, 1<<16))
	if hi, lo := bits.Mul64(uint64(n), r.slotBytes); hi != 0 || lo > math.MaxInt64 {
		return nil, errors.Wrapf(driver.ErrInvalid, "kvcache: new hybrid cache: the recurrent state store of %d slots of %s overflows", n, units.Bytes(r.slotBytes))
	}
	s, err := arena.NewSparse(space, mem, arena.SparseOptions{Max: uint64(n) * r.slotBytes, ChunkSize: page, MaxChunk: r.slotBytes, Device: dev})
	if err != nil {
		return nil, errors.Wrapf(err, "kvcache: new hybrid cache: the recurrent state store of %d slots of %s", n, units.Bytes(r.slotBytes))
	}
	r.s = s
	drv := space.Driver()
	r.bytes = drv.Devices()[dev].Kind != driver.KindSim
	r.addr = s.HostAddressable()
	if r.bytes && drv.Supports(driver.FeatureStreams) {
		if r.str, err = stream.New(drv, dev); err != nil {
			return nil, errors.CombineErrors(errors.Wrap(err, "kvcache: new hybrid cache: a stream for state copies"), s.Close())
		}
	}
	r.free = make([]int, n)
	for i := range r.free {
		r.free[i] = n - 1 - i
	}
	return r, nil
}

// held is the memory the store keeps committed.
func (r *recurrentStore) held() uint64 { return uint64(r.committed) * r.slotBytes }

// evictable is the memory its checkpoints hold (but except's).
func (r *recurrentStore) evictable(except *checkpoint) uint64 {
	n := r.lru.Len()
	if except != nil {
		n--
	}
	return uint64(max(n, 0)) * r.slotBytes
}

func (r *recurrentStore) off(idx int) uint64 { return uint64(idx) * r.slotBytes }

// take commits a slot, zeroed, or a copy of from's state (from nil: zero).
func (r *recurrentStore) take(from *checkpoint) (int, error) {
	if len(r.free) == 0 {
		return 0, errors.Wrapf(driver.ErrOutOfMemory, "kvcache: hybrid: the recurrent store's %d slots are all taken", r.committed)
	}
	idx := r.free[len(r.free)-1]
	if err := r.s.Commit(r.off(idx), r.slotBytes); err != nil {
		return 0, errors.Wrapf(err, "kvcache: hybrid: commit a recurrent state slot of %s", units.Bytes(r.slotBytes))
	}
	r.free = r.free[:len(r.free)-1]
	r.committed++
	var err error
	if from != nil {
		err = r.copy(idx, from.idx)
	} else if r.bytes && r.str != nil {
		err = r.str.MemsetSync(r.s.Base()+driver.Addr(r.off(idx)), 0, r.slotBytes)
	}
	if err != nil {
		return 0, errors.CombineErrors(errors.Wrap(err, "kvcache: hybrid: fill a recurrent state slot"), r.release(idx))
	}
	return idx, nil
}

// copy copies slot src's state into slot dst.
func (r *recurrentStore) copy(dst, src int) error {
	if !r.bytes {
		return nil
	}
	if r.str == nil {
		return errors.Wrapf(driver.ErrUnsupported, "kvcache: hybrid: the %s driver has no streams to copy a recurrent state with", r.s.Driver().Name())
	}
	return r.str.CopyDtoDSync(r.s.Base()+driver.Addr(r.off(dst)), r.s.Base()+driver.Addr(r.off(src)), r.slotBytes)
}

// release decommits slot idx.
func (r *recurrentStore) release(idx int) error {
	err := r.s.Decommit(r.off(idx), r.slotBytes)
	r.free = append(r.free, idx)
	r.committed--
	if err != nil {
		return errors.WithAssertionFailure(errors.Wrapf(err, "kvcache: hybrid: decommit recurrent state slot %d", idx))
	}
	return nil
}

// find is the checkpoint of the longest prefix of prompt[:limit] at a
// multiple of block tokens, nil if none; ch is prompt's block hash chain
// (as far as limit's blocks).
func (r *recurrentStore) find(prompt []int, ch []uint64, block, limit int) *checkpoint {
	for b := min(limit, len(prompt)) / block; b > 0; b-- {
		for _, cp := range r.byKey[ch[b-1]] {
			if len(cp.tokens) == b*block && slices.Equal(cp.tokens, prompt[:b*block]) {
				return cp
			}
		}
	}
	return nil
}

// touch marks cp used now.
func (r *recurrentStore) touch(cp *checkpoint) { r.lru.MoveToBack(cp.elem) }

// checkpoint copies slot idx's state as the checkpoint of tokens (key its
// chain's last hash), unless one is kept already.
func (r *recurrentStore) checkpoint(idx int, tokens []int, key uint64) error {
	for _, cp := range r.byKey[key] {
		if slices.Equal(cp.tokens, tokens) {
			r.touch(cp)
			return nil
		}
	}
	if len(r.free) == 0 {
		return nil // no slot to keep it in: no checkpoint
	}
	dst := r.free[len(r.free)-1]
	if err := r.s.Commit(r.off(dst), r.slotBytes); err != nil {
		return errors.Wrapf(err, "kvcache: hybrid: commit a checkpoint of %s", units.Bytes(r.slotBytes))
	}
	r.free = r.free[:len(r.free)-1]
	r.committed++
	if err := r.copy(dst, idx); err != nil {
		return errors.CombineErrors(errors.Wrap(err, "kvcache: hybrid: copy a checkpoint"), r.release(dst))
	}
	cp := &checkpoint{key: key, tokens: slices.Clone(tokens), idx: dst}
	cp.elem = r.lru.PushBack(cp)
	r.byKey[key] = append(r.byKey[key], cp)
	r.made++
	return nil
}

// evictOne gives back the least recently used checkpoint but except.
func (r *recurrentStore) evictOne(except *checkpoint) (bool, error) {
	e := r.lru.Front()
	if e != nil && e.Value.(*checkpoint) == except {
		e = e.Next()
	}
	if e == nil {
		return false, nil
	}
	cp := r.lru.Remove(e).(*checkpoint)
	list := r.byKey[cp.key]
	i := slices.Index(list, cp)
	list = slices.Delete(list, i, i+1)
	if len(list) == 0 {
		delete(r.byKey, cp.key)
	} else {
		r.byKey[cp.key] = list
	}
	r.evicted++
	return true, r.release(cp.idx)
}

// tensor is a [StateBytes] Uint8 tensor over layer's state in st.
func (r *recurrentStore) tensor(st *stateSlot, layer int) (*tensor.Tensor, error) {
	if !r.addr {
		return nil, errors.Wrapf(driver.ErrUnsupported, "kvcache: hybrid: recurrent state of layer %d: the %s driver's memory is not addressable here", layer, r.s.Driver().Name())
	}
	if st.view == nil {
		v, err := r.s.View(r.off(st.idx), r.slotBytes)
		if err != nil {
			return nil, errors.WithAssertionFailure(errors.Wrap(err, "kvcache: hybrid: view of a recurrent state slot"))
		}
		st.view = v
	}
	if st.lease == nil {
		st.lease = tensor.NewLease()
	}
	b, err := st.view.Bytes()
	if err != nil {
		return nil, errors.WithAssertionFailure(err)
	}
	off, n := r.layerOff[layer], r.layerBytes[layer]
	return tensor.NewLeased(st.lease, &memory{b: b[off : off+n], addr: st.view.Addr() + driver.Addr(off), n: n}, tensor.Uint8, int(n))
}

// drop ends st's tensors and view and gives its slot back.
func (r *recurrentStore) drop(st *stateSlot) error {
	var errs error
	if st.lease != nil {
		st.lease.Revoke()
		st.lease = nil
	}
	if st.view != nil {
		errs = st.view.Release()
		st.view = nil
	}
	return errors.CombineErrors(errs, r.release(st.idx))
}

// check walks the store's books.
func (r *recurrentStore) check(running int) error {
	n := len(r.free) + r.committed
	if r.lru.Len()+running != r.committed {
		return errors.AssertionFailedf("kvcache: hybrid: %d checkpoints and %d running states, %d slots committed", r.lru.Len(), running, r.committed)
	}
	seen := make(map[int]bool, n)
	for _, i := range r.free {
		if seen[i] || i < 0 || i >= n {
			return errors.AssertionFailedf("kvcache: hybrid: free recurrent slot %d listed twice or out of range", i)
		}
		seen[i] = true
	}
	keyed := 0
	for k, l := range r.byKey {
		for _, cp := range l {
			if cp.key != k || seen[cp.idx] {
				return errors.AssertionFailedf("kvcache: hybrid: checkpoint of %d tokens misfiled or in a free slot", len(cp.tokens))
			}
			keyed++
		}
	}
	if keyed != r.lru.Len() {
		return errors.AssertionFailedf("kvcache: hybrid: %d checkpoints keyed, %d listed", keyed, r.lru.Len())
	}
	if c := r.s.Committed(); c != r.held() {
		return errors.AssertionFailedf("kvcache: hybrid: the recurrent range commits %s, the books say %s", units.Bytes(c), units.Bytes(r.held()))
	}
	return nil
}

// close gives everything back.
func (r *recurrentStore) close() error {
	var errs error
	for r.lru.Len() > 0 {
		_, err := r.evictOne(nil)
		errs = errors.CombineErrors(errs, err)
	}
	errs = errors.CombineErrors(errs, r.s.Close())
	if r.str != nil {
		errs = errors.CombineErrors(errs, r.str.Destroy())
	}
	return errs
}

func (r *recurrentStore) String() string {
	return fmt.Sprintf("recurrent store: %d slots of %s committed, %d checkpoints", r.committed, units.Bytes(r.slotBytes), r.lru.Len())
}
