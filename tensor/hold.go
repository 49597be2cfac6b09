package tensor

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

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
	return t.hold(write, what, fn == nil, t.hostBytes, func(lo, hi int) error { return fn(t.st.bytes[lo:hi:hi]) })
}

// AccessDevice runs fn with the device address of the tensor's first
// element and its length in bytes, holding its access as Access does: a
// lease's Revoke waits until fn returns, a revoked or released tensor
// answers ErrClosed without calling fn, and write=true refuses
// (ErrAccessDenied) a tensor any of whose bytes are read-only. It is the
// hold for memory the process may not address (a GPU's, the sim
// driver's), whose bytes the caller moves with the driver's copies (the
// driver checks each against its mappings and access); it works on
// addressable memory too. The tensor must be contiguous and over a
// driver's mapping (Mapped): ErrInvalid otherwise. fn's error is returned
// as it is; fn must not keep the address past its return.
func (t *Tensor) AccessDevice(write bool, fn func(addr driver.Addr, n uint64) error) error {
	what := func() string { return fmt.Sprintf("tensor: device access (write %t) to %s", write, t) }
	mapped := func(what func() string) error {
		if !t.Mapped() {
			return errors.Wrapf(driver.ErrInvalid, "%s: its memory is Go memory, which has no device address", what())
		}
		return nil
	}
	return t.hold(write, what, fn == nil, mapped, func(lo, hi int) error { return fn(t.st.addr+driver.Addr(lo), uint64(hi-lo)) })
}

// hold is Access's and AccessDevice's: it checks t (made, fn given,
// contiguous, then kind, the caller's check of its memory), enters its
// storage (ErrClosed once released or revoked), checks writability, and
// runs fn with the byte span of t's elements, exiting the storage after
// fn returns or panics.
func (t *Tensor) hold(write bool, what func() string, noFn bool, kind func(what func() string) error, fn func(lo, hi int) error) error {
	if err := t.made(what); err != nil {
		return err
	}
	if noFn {
		return errors.Wrapf(driver.ErrInvalid, "%s: fn is nil", what())
	}
	if !t.IsContiguous() {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the tensor is not contiguous", what()),
			"make a contiguous copy first (Contiguous)")
	}
	if err := kind(what); err != nil {
		return err
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
	return fn(t.span())
}

// Addressable reports whether the process can address the tensor's
// memory (Access hands out its bytes): false for a GPU's or the sim
// driver's memory, and for a nil or zero tensor.
func (t *Tensor) Addressable() bool {
	return t != nil && t.st != nil && !t.st.unaddressable
}

// Mapped reports whether the tensor's memory is a driver's mapping (an
// arena view, an allocator's allocation, a KV cache page), not Go memory:
// its buffer had a device address when the tensor was made. Only such
// memory is handed to C (UCX) for asynchronous use. False for a nil or
// zero tensor, and for an empty tensor from Empty (it has no memory).
func (t *Tensor) Mapped() bool {
	return t != nil && t.st != nil && t.st.addr != 0
}
