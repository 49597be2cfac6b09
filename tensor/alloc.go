package tensor

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
)

// AllocAlign is the alignment of an Empty tensor's allocation: what CUDA's
// allocator gives (256 bytes), enough for any element and vector load.
const AllocAlign = 256

// Empty allocates a row-major tensor of dt and shape from al (aligned to
// AllocAlign) and returns it; its contents are whatever the memory held.
// The tensor owns the allocation: its Release frees it (al.Free(t.Addr())),
// after which every view of it refuses to touch memory. Free it only
// through Release: freeing Addr() with al.Free directly leaves the tensor
// and its views pointing at memory the allocator may hand out again.
// The allocator refuses to close while the tensor's memory is live.
//
// An empty shape allocates nothing (Release is then a no-op). If the
// allocator cannot serve the request its error is returned and nothing
// changes.
func Empty(al *arena.Allocator, dt DType, shape ...int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: empty %s tensor of shape %v from an allocator", dt, shape) }
	if al == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the allocator is nil", what())
	}
	if al.Closed() {
		return nil, driver.Closed(what() + ": the allocator is closed (or was not made by arena.NewAllocator)")
	}
	n, err := checkLayout(dt, shape, what)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		st := &storage{release: func() error { return nil }}
		t, err := newOn(st, dt, shape, what)
		if err == nil {
			st.owner = t
		}
		return t, err
	}
	p, err := al.Alloc(uint64(n*dt.Size()), AllocAlign)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	b, err := al.Bytes(p)
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), al.Free(p))
	}
	st := &storage{bytes: b, addr: p, release: func() error { return al.Free(p) }}
	t, err := newOn(st, dt, shape, what)
	if err != nil {
		return nil, errors.CombineErrors(err, al.Free(p))
	}
	st.owner = t
	return t, nil
}
