package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Owned is a live allocation that only its handle frees: while it lives,
// Free of its address is refused (ErrBusy), and its Release frees exactly
// it, once — never another allocation that later reuses the address. It is
// how a tensor owns its memory (tensor.Empty): a caller that frees the
// tensor's address by mistake gets an error rather than leave the tensor
// over memory the allocator hands out again (or gives back).
//
// Invariant: while freed is false, the allocator records o under o.p in
// its owned allocations and the allocation at o.p is live.
type Owned struct {
	al    *Allocator
	p     driver.Addr
	n     uint64
	freed bool // guarded by al.mu
}

// AllocOwned allocates as Alloc does and returns the allocation's owning
// handle. The memory is for writing through its bytes: on a driver whose
// memory this process addresses, an allocator no device may write is
// refused before anything is allocated (ErrAccessDenied).
func (al *Allocator) AllocOwned(size, align uint64) (*Owned, error) {
	if al.unmade() {
		return nil, unmade("Allocator.AllocOwned", "NewAllocator")
	}
	what := func() string { return fmt.Sprintf("arena: owned alloc %s aligned to %d", units.Bytes(size), align) }
	align, fp, err := al.checkRequest(what, size, align)
	if err != nil {
		return nil, err
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return nil, al.errClosed("alloc")
	}
	if s := al.heaps[0].s; s.HostAddressable() {
		s.mu.Lock()
		ok := writable(s.access)
		s.mu.Unlock()
		if !ok {
			return nil, errors.WithHint(
				errors.Wrapf(driver.ErrAccessDenied, "%s: the allocator's memory is not writable by any device", what()),
				"grant a device read-write access first (SetAccess)")
		}
	}
	p, err := al.allocLocked(what, size, align, fp)
	if err != nil {
		return nil, err
	}
	o := &Owned{al: al, p: p, n: size}
	if al.owned == nil {
		al.owned = map[driver.Addr]*Owned{}
	}
	al.owned[p] = o
	return o, nil
}

// made refuses a nil Owned or one not made by AllocOwned (ErrInvalid).
func (o *Owned) made(op string) error {
	if o == nil || o.al == nil {
		return errors.Wrapf(driver.ErrInvalid, "arena: %s of an owned allocation: nil, or not made by Allocator.AllocOwned", op)
	}
	return nil
}

// Addr is the allocation's address (0 for a nil or zero Owned).
func (o *Owned) Addr() driver.Addr {
	if o == nil {
		return 0
	}
	return o.p
}

// Size is the size asked for (0 for a nil or zero Owned).
func (o *Owned) Size() uint64 {
	if o == nil {
		return 0
	}
	return o.n
}

// Bytes returns the allocation as a slice, as Allocator.Bytes does; after
// Release it is ErrClosed.
func (o *Owned) Bytes() ([]byte, error) {
	if err := o.made("bytes"); err != nil {
		return nil, err
	}
	al := o.al
	al.mu.Lock()
	defer al.mu.Unlock()
	if o.freed || al.closed {
		return nil, driver.Closed(fmt.Sprintf("arena: bytes of the owned allocation at %s: released", o.p))
	}
	return al.bytesLocked(o.p)
}

// Release frees the allocation. Releasing twice is ErrClosed.
func (o *Owned) Release() error {
	if err := o.made("release"); err != nil {
		return err
	}
	al := o.al
	al.mu.Lock()
	defer al.mu.Unlock()
	if o.freed || al.closed {
		return driver.Closed(fmt.Sprintf("arena: release of the owned allocation at %s: already released", o.p))
	}
	if al.owned[o.p] != o {
		return errors.AssertionFailedf("arena: release of the owned allocation at %s: the allocator does not record it", o.p)
	}
	delete(al.owned, o.p) // first: freeLocked checks the books in invariants builds
	if err := al.freeLocked(o.p); err != nil {
		al.owned[o.p] = o
		return err
	}
	o.freed = true
	return nil
}
