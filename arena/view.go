package arena

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// View is a tracked window [Base+off, Base+off+n) of committed memory.
// While it is live it pins the chunks it covers: they cannot be
// decommitted (nor the arena shrunk under it) or moved to another device,
// and write access cannot be taken from them (ErrBusy), so its bytes stay
// mapped, in place, readable and writable.
type View struct {
	s      *Sparse
	off, n uint64
	bytes  []byte
}

// View returns a live view of [off, off+n), which must be committed
// throughout.
func (s *Sparse) View(off, n uint64) (*View, error) {
	if s.unmade() {
		return nil, unmade("Sparse.View", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("view")
	}
	return s.viewLocked(off, n)
}

func (s *Sparse) viewLocked(off, n uint64) (*View, error) {
	if n == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: view of zero bytes")
	}
	if off+n < off || off+n > s.opts.Max {
		return nil, errors.Wrapf(driver.ErrNotMapped, "arena: view [%#x, +%s): past the range's end at %s",
			off, units.Bytes(n), units.Bytes(s.opts.Max))
	}
	if holes := s.holesLocked(off, off+n); len(holes) > 0 {
		return nil, errors.Wrapf(driver.ErrNotMapped, "arena: view [%#x, +%s): [%#x, %#x) is not committed",
			off, units.Bytes(n), holes[0].start, holes[0].end)
	}
	v := &View{s: s, off: off, n: n}
	s.pinViewLocked(v, 1)
	s.views[v] = struct{}{}
	return v, nil
}

// pinViewLocked adds d to the view count of every chunk v covers.
func (s *Sparse) pinViewLocked(v *View, d int) {
	lo, hi := s.slots.Overlapping(v.off, v.off+v.n)
	for i := lo; i < hi; i++ {
		s.slots.At(i).Val.views += d
	}
}

// Addr is the view's first address.
func (v *View) Addr() driver.Addr {
	if v.unmade() {
		return 0
	}
	return v.s.Base() + driver.Addr(v.off)
}

// Offset is the view's offset in its range.
func (v *View) Offset() uint64 {
	if v.unmade() {
		return 0
	}
	return v.off
}

// Len is the view's length in bytes.
func (v *View) Len() uint64 {
	if v.unmade() {
		return 0
	}
	return v.n
}

// String formats v as "view [0x..., +4 MiB)".
func (v *View) String() string {
	if v.unmade() {
		return "view (nil)"
	}
	return fmt.Sprintf("view [%#x, +%s)", v.off, units.Bytes(v.n))
}

// Bytes returns the view's memory as a slice, on drivers whose memory the
// process addresses (driver.HostMapper); others return ErrUnsupported. The
// memory must be writable by some device (ErrAccessDenied otherwise): the
// slice is for reading and writing, and the view keeps it so (no SetAccess
// or Grant may take write access away while the view lives). The slice is
// valid until Release.
func (v *View) Bytes() ([]byte, error) {
	if v.unmade() {
		return nil, unmade("View.Bytes", "Sparse.View or Arena.View")
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.views[v]; !live {
		return nil, driver.Closed("arena: bytes of a released view")
	}
	if v.bytes == nil {
		hm, ok := s.drv.(driver.HostMapper)
		if !ok {
			return nil, errors.Wrapf(driver.ErrUnsupported, "arena: bytes of a view: the %s driver's memory is not addressable from the host", s.drv.Name())
		}
		if err := s.writableLocked(func() string { return "arena: bytes of " + v.String() }, v.off, v.off+v.n); err != nil {
			return nil, err
		}
		b, err := hm.HostBytes(v.Addr(), v.n)
		if err != nil {
			return nil, errors.Wrap(err, "arena: bytes of a view")
		}
		v.bytes = b
	}
	return v.bytes, nil
}

// Release ends the view and unpins its chunks. Releasing twice is
// ErrClosed.
func (v *View) Release() error {
	if v.unmade() {
		return unmade("View.Release", "Sparse.View or Arena.View")
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.views[v]; !live {
		return driver.Closed("arena: release of a released view")
	}
	s.pinViewLocked(v, -1)
	delete(s.views, v)
	v.bytes = nil
	return nil
}
