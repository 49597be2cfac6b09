package tensor

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
)

// A Lease takes back, all at once, the memory of every tensor made under
// it (NewLeased) and of every view of those: after Revoke each of them
// refuses to touch memory (ErrClosed) instead of faulting on memory that
// was unmapped. It is for an owner that hands tensors over memory it will
// take back — a KV cache's sequence, whose pages go when it is freed or
// preempted: the owner keeps the lease, the caller gets the tensors.
//
// A slice that Data or Bytes handed out before the revoke is not covered:
// like any slice over device memory, it must not outlive the memory.
// Revoke and a concurrent read of the same tensor race as a Release does:
// the owner revokes before it unmaps, when no call of its own is using
// the tensors.
type Lease struct {
	revoked atomic.Bool
}

// NewLease returns a lease that has not been revoked.
func NewLease() *Lease { return &Lease{} }

// Revoke ends every tensor made under l. Revoking twice, or a nil lease,
// does nothing.
func (l *Lease) Revoke() {
	if l != nil {
		l.revoked.Store(true)
	}
}

// Revoked reports whether Revoke was called (true for a nil lease).
func (l *Lease) Revoked() bool { return l == nil || l.revoked.Load() }

// NewLeased lays a row-major tensor over buf as New does, under l: once l
// is revoked, the tensor and its views refuse to touch memory (ErrClosed).
// A nil lease is ErrInvalid, a revoked one ErrClosed. The tensor does not
// own buf: whoever holds the lease ends the memory, after revoking it.
func NewLeased(l *Lease, buf Buffer, dt DType, shape ...int) (*Tensor, error) {
	what := func() string { return "tensor: new leased " + dt.String() + " tensor" }
	if l == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the lease is nil", what())
	}
	if l.Revoked() {
		return nil, driver.Closed(what() + ": the lease was revoked")
	}
	if isnil.Is(buf) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the buffer is nil", what())
	}
	b, addr, err := bufferBytes(buf)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: the buffer's bytes", what())
	}
	st := &storage{bytes: b, addr: addr, holder: "the lease's holder", lease: l}
	return newOn(st, dt, shape, what)
}
