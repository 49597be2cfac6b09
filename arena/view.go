package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// View is a tracked window [Base+off, Base+off+n) of committed memory.
// While it is live it pins the chunks it covers: they cannot be
// decommitted (nor the arena shrunk under it) or moved to another device,
// and write access cannot be taken from them (ErrBusy), so its bytes stay
// mapped, in place, readable and writable.
//
// A read-only view (Sparse.ViewReadOnly) pins them the same way but for
// write access: its memory may be read-only, and may be made so while it
// lives; only the last read access is kept (ErrBusy).
type View struct {
	s      *Sparse
	off, n uint64
	bytes  []byte
	// readOnly marks a view made by ViewReadOnly: its bytes need only be
	// readable by some device.
	readOnly bool
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
	return s.viewLocked(off, n, false)
}

// ViewReadOnly returns a live read-only view of [off, off+n), which must
// be committed throughout. It pins its chunks as View does — against a
// decommit, a Move, and losing the last device that may read them
// (SetAccess or Grant of AccessNone: ErrBusy) — but lets their access drop
// to read-only, and its Bytes need only readable memory.
//
// The memory under it may be read-only: the caller must guard the writes
// through its bytes (a tensor made with tensor.NewLeasedReadOnly refuses
// them). A raw store to a read-only page faults, and kills the process.
func (s *Sparse) ViewReadOnly(off, n uint64) (*View, error) {
	if s.unmade() {
		return nil, unmade("Sparse.ViewReadOnly", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("read-only view")
	}
	return s.viewLocked(off, n, true)
}

func (s *Sparse) viewLocked(off, n uint64, readOnly bool) (*View, error) {
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
	v := &View{s: s, off: off, n: n, readOnly: readOnly}
	s.pinViewLocked(v, 1)
	s.views[v] = struct{}{}
	return v, nil
}

// pinViewLocked adds d to the view counts of every chunk v covers.
func (s *Sparse) pinViewLocked(v *View, d int) {
	lo, hi := s.slots.Overlapping(v.off, v.off+v.n)
	for i := lo; i < hi; i++ {
		sl := s.slots.At(i).Val
		sl.views += d
		if v.readOnly {
			sl.readViews += d
		}
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

// String formats v as "view [0x..., +4 MiB)", or "read-only view [...)".
func (v *View) String() string {
	if v.unmade() {
		return "view (nil)"
	}
	kind := "view"
	if v.readOnly {
		kind = "read-only view"
	}
	return fmt.Sprintf("%s [%#x, +%s)", kind, v.off, units.Bytes(v.n))
}

// Bytes returns the view's memory as a slice, on drivers whose memory the
// process addresses (driver.HostMapper); others return ErrUnsupported. The
// memory must be writable by some device (ErrAccessDenied otherwise): the
// slice is for reading and writing, and the view keeps it so (no SetAccess
// or Grant may take write access away while the view lives). A read-only
// view's memory need only be readable by some device, and may be
// read-only: the slice is for reading, and a store to a read-only page
// through it faults. The slice is valid until Release.
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
		what := func() string { return "arena: bytes of " + v.String() }
		check := s.writableLocked
		if v.readOnly {
			check = s.readableLocked
		}
		if err := check(what, v.off, v.off+v.n); err != nil {
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
