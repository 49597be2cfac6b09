//go:build !linux

package budget

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Book is one process's view of a shared budget (Linux only).
type Book struct{}

// Member is one process's share of the budget (Linux only).
type Member struct{}

func unsupported(what string) error {
	return errors.Wrapf(driver.ErrUnsupported, "budget: %s: a shared budget needs Linux", what)
}

// Open answers ErrUnsupported off Linux.
func Open(path string, opts Options) (*Book, error) { return nil, unsupported("open " + path) }

// Path returns "".
func (b *Book) Path() string { return "" }

// Capacity returns 0.
func (b *Book) Capacity() uint64 { return 0 }

// Members answers ErrUnsupported.
func (b *Book) Members() ([]Info, error) { return nil, unsupported("list the members") }

// SetLimits answers ErrUnsupported.
func (b *Book) SetLimits(name string, floor, ceiling uint64) error { return unsupported("set limits") }

// Join answers ErrUnsupported.
func (b *Book) Join(name string, floor, ceiling uint64, give GiveBack) (*Member, error) {
	return nil, unsupported("join")
}

// Close answers ErrUnsupported.
func (b *Book) Close() error { return unsupported("close") }

// Name returns "".
func (m *Member) Name() string { return "" }

// Info answers ErrUnsupported.
func (m *Member) Info() (Info, error) { return Info{}, unsupported("a member's line") }

// Acquire answers ErrUnsupported.
func (m *Member) Acquire(n uint64) error { return unsupported("acquire") }

// Release answers ErrUnsupported.
func (m *Member) Release(n uint64) error { return unsupported("release") }

// SetIdle answers ErrUnsupported.
func (m *Member) SetIdle(n uint64) error { return unsupported("set idle") }

// Close answers ErrUnsupported.
func (m *Member) Close() error { return unsupported("leave") }

func (m *Member) bookCapacity() uint64 { return 0 }
