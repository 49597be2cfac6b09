package tensor

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

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
// Every call that touches memory through such a tensor (At, Set, Copy,
// Access) enters the lease for the length of the access, and Revoke waits
// for the accesses in flight to end: the check and the access are atomic with
// respect to the owner's revoke-then-unmap, so no call ever touches
// memory the owner took back. A call that comes after the revoke answers
// ErrClosed without touching anything; none waits for a revoke.
//
// A slice that Data or Bytes handed out before the revoke is not covered:
// like any slice over device memory, it must not outlive the memory.
type Lease struct {
	revoked atomic.Bool
	// using counts the accesses under the lease in flight (enter to
	// exit). An access counts itself before it looks at revoked and
	// Revoke sets revoked before it looks at using (both sequentially
	// consistent), so once Revoke sees using at zero no access is touching
	// memory and none will.
	using atomic.Int64
}

// NewLease returns a lease that has not been revoked.
func NewLease() *Lease { return &Lease{} }

// Revoke ends every tensor made under l, waiting for the accesses in
// flight through them (each one element, or one Copy) to end: after it
// returns, none of them touches memory again. Revoking twice, or a nil
// lease, does nothing. It must not be called from inside an access.
//
// An access lasts as long as its caller makes it (a transfer target's
// Access reads a peer's socket): an owner that revokes under a lock of
// its own calls Stop under the lock, and, unless Idle, lets the lock go
// while Revoke waits.
func (l *Lease) Revoke() {
	if l == nil {
		return
	}
	l.revoked.Store(true)
	drain(&l.using)
}

// drain waits for a count of accesses in flight to reach zero, once what
// they check (a lease's revoked, a storage's released) is set: yielding
// at first, then sleeping, since an access lasts as long as its caller
// makes it (Access's fn).
func drain(using *atomic.Int64) {
	for spins := 0; using.Load() != 0; spins++ {
		if spins < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// Stop is Revoke's first half: every access that starts after it answers
// ErrClosed, and no tensor is made under l again, but the accesses in
// flight go on (Idle says whether there are any; Revoke waits for them).
// Stopping twice, or a nil lease, does nothing.
func (l *Lease) Stop() {
	if l != nil {
		l.revoked.Store(true)
	}
}

// Idle reports whether no access under l is in flight. Once l is stopped,
// Idle true stays true but for an access that backs out at once (it saw
// the stop): a Revoke then waits for nothing longer than that.
func (l *Lease) Idle() bool { return l == nil || l.using.Load() == 0 }

// enter starts an access under l; false, with nothing started, once l is
// revoked. An access that entered ends with exit.
func (l *Lease) enter() bool {
	if l.revoked.Load() {
		return false // without counting: stale tensors hammered in a loop never hold a Revoke up
	}
	l.using.Add(1)
	if l.revoked.Load() {
		l.using.Add(-1)
		return false
	}
	return true
}

func (l *Lease) exit() { l.using.Add(-1) }

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
	b, addr, dev, n, err := bufferBytes(buf)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: the buffer's bytes", what())
	}
	st := &storage{bytes: b, addr: addr, unaddressable: dev, size: n, holder: "the lease's holder", lease: l}
	return newOn(st, dt, shape, what)
}

// NewLeasedReadOnly is NewLeased with the first readOnly bytes of buf
// read-only: Set of an element in them, or a Copy into a tensor that
// reaches them, is refused (ErrAccessDenied) for the tensor and every
// view of it, changing nothing. It is for an owner that shares that
// memory with others (a KV cache's prefix pages). A slice Data hands out
// is not checked, and its first readOnly bytes may be pages the owner
// mapped read-only (the KV cache does, on every driver that can): a store
// there faults, as a kernel's would on the device. readOnly must lie in
// [0, len(buf's bytes)] (ErrInvalid).
func NewLeasedReadOnly(l *Lease, buf Buffer, readOnly int, dt DType, shape ...int) (*Tensor, error) {
	t, err := NewLeased(l, buf, dt, shape...)
	if err != nil {
		return nil, err
	}
	if readOnly < 0 || readOnly > t.st.length() {
		return nil, errors.Wrapf(driver.ErrInvalid, "tensor: new leased %s tensor: %d read-only bytes of a buffer of %d", dt, readOnly, t.st.length())
	}
	t.st.readOnly = readOnly
	return t, nil
}
