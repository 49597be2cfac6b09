package tensor

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Access runs fn with the tensor's bytes (contiguous tensors only:
// ErrInvalid otherwise), holding its access as At, Set and Copy do: a
// lease's Revoke waits until fn returns, and a revoked or released tensor
// answers ErrClosed without calling fn. write=true refuses
// (ErrAccessDenied) a tensor any of whose bytes are read-only
// (NewLeasedReadOnly). Memory the process cannot address (the sim driver)
// is ErrUnsupported. fn's error is returned as it is.
//
// b is exactly the tensor's elements (NumElements()*DType().Size() bytes,
// from its first element); fn must not keep it past its return. A panic
// in fn is let through after the hold is let go, so a Revoke waiting on it
// does not wait for ever.
//
// It is the hold a long access (a transfer moving the bytes from or to a
// socket) takes: an owner's revoke-then-unmap waits for it, so fn never
// touches memory the owner took back. fn must not call Revoke on the
// tensor's own lease (that would wait for fn).
func (t *Tensor) Access(write bool, fn func(b []byte) error) error {
	what := func() string { return fmt.Sprintf("tensor: access (write %t) to %s", write, t) }
	if err := t.made(what); err != nil {
		return err
	}
	if fn == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: fn is nil", what())
	}
	if !t.IsContiguous() {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the tensor is not contiguous", what()),
			"make a contiguous copy first (Contiguous)")
	}
	if t.st.unaddressable {
		return errors.Wrapf(driver.ErrUnsupported, "%s: its memory is not addressable from this process", what())
	}
	if err := t.enter(what); err != nil {
		return err
	}
	defer t.st.exit()
	if write {
		if err := t.writable(what); err != nil {
			return err
		}
	}
	lo, hi := t.span()
	return fn(t.st.bytes[lo:hi:hi])
}

// Mapped reports whether the tensor's memory is a driver's mapping (an
// arena view, an allocator's allocation, a KV cache page), not Go memory:
// its buffer had a device address when the tensor was made. Only such
// memory is handed to C (UCX) for asynchronous use. False for a nil or
// zero tensor, and for an empty tensor from Empty (it has no memory).
func (t *Tensor) Mapped() bool {
	return t != nil && t.st != nil && t.st.addr != 0
}
