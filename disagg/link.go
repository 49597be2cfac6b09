package disagg

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/tensor"
)

// Ref names one extent of a unit on the prefill side, as its transport
// knows it: for a transfer engine, a transfer.Descriptor marshalled; for
// Local, an index in its table. Len is the extent's bytes.
type Ref struct {
	Desc []byte
	Len  uint64
}

// Exporter is the prefill side's half of a transport: Export makes t (a
// unit's extent, a contiguous uint8 tensor over the cache's memory)
// readable from the decode side until release is called, and says how the
// decode side names it. A transfer engine: Register(t), the
// registration's Descriptor marshalled, and its Close as release.
type Exporter interface {
	Export(t *tensor.Tensor) (ref Ref, release func() error, err error)
}

// Fetcher is the decode side's half of a transport: Fetch copies, for
// every i, the extent src[i] names into dst[i] (of src[i].Len bytes), and
// returns once every byte is in place, or with the first error. A
// transfer engine: Register each dst[i], one Peer.Get with an Op per
// extent, then Close the registrations.
type Fetcher interface {
	Fetch(ctx context.Context, dst []*tensor.Tensor, src []Ref) error
}

// Local is the transport within one process, both Exporter and Fetcher:
// Export lists a tensor, Fetch copies tensor to tensor (tensor.Copy, which
// holds both tensors' leases for the copy). It is the oracle a transfer
// engine is compared with, and counts what it moves. The zero Local is
// ready to use; it is safe for concurrent use.
type Local struct {
	// mu guards the fields below.
	mu lockrank.Mutex[lockrank.DisaggLocal]
	// exported are the tensors exported and not released, by id; ids are
	// handed out from 1 up and never reused, so an id below next that is
	// not here was released.
	exported map[uint64]*tensor.Tensor
	next     uint64
	stats    LocalStats
}

// LocalStats counts what a Local did.
type LocalStats struct {
	Exports  int    // extents exported
	Live     int    // of them, not released yet
	Fetches  int    // Fetch calls that succeeded
	Extents  int    // extents copied
	Bytes    uint64 // bytes copied
	Refusals int    // Fetch calls refused or failed
}

// localRefBytes is the length of a Local ref's Desc: the id, little endian.
const localRefBytes = 8

// Export lists t (a contiguous tensor) and returns its ref and the
// function that lets it go. It refuses a nil Local or tensor and a strided
// one (ErrInvalid).
func (l *Local) Export(t *tensor.Tensor) (Ref, func() error, error) {
	if l == nil {
		return Ref{}, nil, errors.Wrap(driver.ErrInvalid, "disagg: local export on a nil *Local")
	}
	if t.Released() { // nil, zero or released: no memory to export
		return Ref{}, nil, errors.Wrap(driver.ErrInvalid, "disagg: local export of a nil, zero or released tensor")
	}
	if !t.IsContiguous() {
		return Ref{}, nil, errors.Wrapf(driver.ErrInvalid, "disagg: local export of %s: not contiguous", t)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exported == nil {
		l.exported = map[uint64]*tensor.Tensor{}
	}
	l.next++
	id := l.next
	l.exported[id] = t
	l.stats.Exports++
	l.stats.Live++
	desc := binary.LittleEndian.AppendUint64(nil, id)
	var once sync.Once
	release := func() error {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.exported, id)
			l.stats.Live--
		})
		return nil
	}
	return Ref{Desc: desc, Len: tensorBytes(t)}, release, nil
}

// Fetch copies each extent src[i] names into dst[i]. It refuses, before
// copying anything, a nil Local or context, slices of different lengths, a ref it
// never made or of another length than its tensor or dst[i]'s
// (ErrInvalid), and a released ref (ErrClosed). A copy's own refusal — a
// revoked tensor (ErrClosed), a read-only destination (ErrAccessDenied) —
// or ctx's end stops it there; the extents before are copied.
func (l *Local) Fetch(ctx context.Context, dst []*tensor.Tensor, src []Ref) error {
	if l == nil {
		return errors.Wrap(driver.ErrInvalid, "disagg: local fetch on a nil *Local")
	}
	what := func() string { return fmt.Sprintf("disagg: local fetch of %d extents", len(src)) }
	if ctx == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: a nil context", what())
	}
	from, err := l.resolve(what, dst, src)
	if err == nil {
		for i := range dst {
			if err = ctx.Err(); err != nil {
				err = errors.Wrapf(err, "%s: extent %d", what(), i)
				break
			}
			if err = tensor.Copy(dst[i], from[i]); err != nil {
				err = errors.Wrapf(err, "%s: extent %d", what(), i)
				break
			}
			l.mu.Lock()
			l.stats.Extents++
			l.stats.Bytes += src[i].Len
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.stats.Refusals++
		return err
	}
	l.stats.Fetches++
	return nil
}

// resolve looks up src's tensors and checks them against dst's.
func (l *Local) resolve(what func() string, dst []*tensor.Tensor, src []Ref) ([]*tensor.Tensor, error) {
	if len(dst) != len(src) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %d destinations", what(), len(dst))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	from := make([]*tensor.Tensor, len(src))
	for i, r := range src {
		if len(r.Desc) != localRefBytes {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: ref %d is %d bytes, a local ref is %d", what(), i, len(r.Desc), localRefBytes)
		}
		id := binary.LittleEndian.Uint64(r.Desc)
		t, ok := l.exported[id]
		switch {
		case !ok && id >= 1 && id <= l.next:
			return nil, errors.Wrapf(driver.ErrClosed, "%s: ref %d (extent %d) was released", what(), id, i)
		case !ok:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: ref %d (extent %d) was never exported here", what(), id, i)
		case tensorBytes(t) != r.Len:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: ref %d says %d bytes, its extent has %d", what(), id, r.Len, tensorBytes(t))
		case dst[i] == nil:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: destination %d is nil", what(), i)
		case tensorBytes(dst[i]) != r.Len:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: destination %d has %d bytes, extent %d has %d", what(), i, tensorBytes(dst[i]), i, r.Len)
		case !dst[i].IsContiguous():
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: destination %d is not contiguous", what(), i)
		}
		from[i] = t
	}
	return from, nil
}

// Stats returns the counts so far (zero for a nil Local).
func (l *Local) Stats() LocalStats {
	if l == nil {
		return LocalStats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// tensorBytes is t's size in bytes.
func tensorBytes(t *tensor.Tensor) uint64 {
	return uint64(t.NumElements()) * uint64(t.DType().Size())
}
