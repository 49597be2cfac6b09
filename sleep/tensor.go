package sleep

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/tensor"
)

// Tensor returns a uint8 tensor over the whole live allocation at p (its
// Size in bytes), made under a tensor.Lease the Manager holds for that
// allocation while its tag stays awake. The Manager revokes the lease —
// waiting for every access in flight through the tensor (At, Set, Copy,
// Access: a transfer moving bytes into or out of it) to end — before it
// takes the memory away: at Sleep of the tag, before it backs up or
// unmaps anything (also when that sleep then fails and the tag stays
// awake: ask for the tensor again); at Free of p, before the allocation
// goes; and at Close. After that every access through the tensor and its views answers
// ErrClosed. After a Wake, Tensor hands out a new tensor under a new
// lease; the old ones stay closed. Tensors asked for in one waking share
// the lease.
//
// The tensor is Mapped (driver memory, so transfer.Register takes it).
// It does not own the allocation: its Release is refused; Free ends it.
//
// An access's fn must not call Free of p, Sleep of its tag or Close:
// those wait for it. A tag that sleeps refuses (ErrBusy naming it), as
// Alloc does; in a tag a Sleep or Wake is busy with, Tensor waits for it.
// p not a live allocation of this Manager is ErrNotAllocated; memory the
// process cannot address (a driver that is no driver.HostMapper: the sim
// driver, and device memory of cuda and acl) is ErrUnsupported: Tensor
// hands out tensors over host bytes only. A refusal changes nothing.
func (m *Manager) Tensor(p driver.Addr) (*tensor.Tensor, error) {
	if err := m.begin("Tensor"); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	t := m.owner[p]
	for t != nil && t.busy { // a sleep or wake of its tag, or a free revoking: follow it
		if err := m.waitLocked("Tensor"); err != nil {
			return nil, err
		}
		t = m.owner[p]
	}
	if t == nil {
		return nil, errors.Wrapf(driver.ErrNotAllocated, "sleep: tensor over %s: not a live allocation of this Manager", p)
	}
	if t.asleep {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "sleep: tensor over %s in tag %q: the tag is asleep", p, t.name),
			"wake the tag first")
	}
	if !t.al.HostAddressable() {
		return nil, errors.Wrapf(driver.ErrUnsupported, "sleep: tensor over %s in tag %q: the %s driver's memory is not addressable from this process",
			p, t.name, m.d.Name())
	}
	b, err := t.al.Bytes(p)
	if err != nil {
		return nil, errors.Wrapf(err, "sleep: tensor over %s in tag %q", p, t.name)
	}
	l := t.leases[p]
	if l == nil {
		l = tensor.NewLease()
	}
	tt, err := tensor.NewLeased(l, allocation{b: b, p: p}, tensor.Uint8, len(b))
	if err != nil {
		return nil, errors.Wrapf(err, "sleep: tensor over %s in tag %q", p, t.name)
	}
	if t.leases == nil {
		t.leases = map[driver.Addr]*tensor.Lease{}
	}
	t.leases[p] = l
	m.checkAfter("tensor")
	return tt, nil
}

// allocation is the tensor.Buffer of a live allocation: its bytes, and
// its device address (which makes the tensor Mapped).
type allocation struct {
	b []byte
	p driver.Addr
}

func (a allocation) Bytes() ([]byte, error) { return a.b, nil }
func (a allocation) Addr() driver.Addr      { return a.p }

// takeLeasesLocked unlists every lease of t's allocations and returns
// them, for the caller to revoke.
func (t *tag) takeLeasesLocked() []*tensor.Lease {
	if len(t.leases) == 0 {
		return nil
	}
	ls := make([]*tensor.Lease, 0, len(t.leases))
	for _, l := range t.leases {
		ls = append(ls, l)
	}
	t.leases = nil
	return ls
}

// revokeAll revokes ls, each waiting for the accesses in flight under it.
func revokeAll(ls []*tensor.Lease) {
	for _, l := range ls {
		l.Revoke()
	}
}
