package ledger

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// The ledger's answers to driver.Books: what the record holds, so that
// the layers above can compare their books with it.

// ChunkInfo implements driver.Books.
func (l *Ledger) ChunkInfo(h driver.Handle) (driver.DeviceID, uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, 0, l.errClosed("chunk info")
	}
	c, err := l.chunk(func() string { return fmt.Sprintf("%s: chunk info", l.name) }, h)
	if err != nil {
		return 0, 0, err
	}
	return c.Device, c.Size, nil
}

// MappingAt implements driver.Books.
func (l *Ledger) MappingAt(addr driver.Addr) (driver.Handle, uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, 0, l.errClosed("mapping at")
	}
	what := func() string { return fmt.Sprintf("%s: mapping at %s", l.name, addr) }
	m, err := l.mappingAt(what, addr)
	if err != nil {
		return 0, 0, err
	}
	if m.Addr != addr {
		return 0, 0, errors.Wrapf(driver.ErrNotMapped, "%s: the mapping there starts at %s", what(), m.Addr)
	}
	return m.Chunk.Handle, m.Size, nil
}

// Mapped implements driver.Books.
func (l *Ledger) Mapped(base driver.Addr, size uint64) (int, uint64, error) {
	end := base + driver.Addr(size)
	if end < base {
		return 0, 0, errors.Wrapf(driver.ErrInvalid, "%s: mappings in [%s, +%d): the range wraps", l.name, base, size)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, 0, l.errClosed("mappings in a range")
	}
	var n int
	var bytes uint64
	lo, hi := l.reservations.Overlapping(base, end)
	for i := lo; i < hi; i++ {
		r := l.reservations.At(i).Val
		mlo, mhi := r.maps.Overlapping(base, end)
		for j := mlo; j < mhi; j++ {
			n++
			bytes += r.maps.At(j).Val.Size
		}
	}
	return n, bytes, nil
}

// ReservationAt implements driver.Books.
func (l *Ledger) ReservationAt(base driver.Addr) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, l.errClosed("reservation at")
	}
	r := l.regionOf(base)
	if r == nil || r.Base != base {
		return 0, errors.Wrapf(driver.ErrNotReserved, "%s: no reservation starts at %s", l.name, base)
	}
	return r.Size, nil
}
