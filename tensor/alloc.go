package tensor

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
)

// AllocAlign is the alignment of an Empty tensor's allocation: what CUDA's
// allocator gives (256 bytes), enough for any element and vector load.
const AllocAlign = 256

// Empty allocates a row-major tensor of dt and shape from al (aligned to
// AllocAlign) and returns it; its contents are whatever the memory held.
// The tensor owns the allocation (arena.Allocator.AllocOwned): its Release
// frees it, and only it, after which every view of it refuses to touch
// memory. al.Free(t.Addr()) is refused (ErrBusy) while the tensor lives, so
// the tensor never points at memory the allocator hands out again. The
// allocator refuses to close, and to take write access from its memory
// (SetAccess), while the tensor's memory is live; memory no device may
// write is refused (ErrAccessDenied).
//
// On an allocator whose memory the process cannot address the tensor is
// a device tensor, as OnArena makes.
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
		st := &storage{release: func() error { return nil }, unaddressable: !al.HostAddressable()}
		t, err := newOn(st, dt, shape, what)
		if err == nil {
			st.owner = t
		}
		return t, err
	}
	o, err := al.AllocOwned(uint64(n*dt.Size()), AllocAlign)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	st := &storage{addr: o.Addr(), release: o.Release}
	if al.HostAddressable() {
		if st.bytes, err = o.Bytes(); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), o.Release())
		}
	} else {
		st.unaddressable, st.size = true, n*dt.Size() // a device tensor (OnArena)
	}
	t, err := newOn(st, dt, shape, what)
	if err != nil {
		return nil, errors.CombineErrors(err, o.Release())
	}
	st.owner = t
	return t, nil
}
