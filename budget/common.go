package budget

import (
	"os"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// DefaultGiveBackWait is how long an Acquire waits for the members it
// asked when Options.GiveBackWait is zero.
const DefaultGiveBackWait = time.Second

// Options are a Book's.
type Options struct {
	// Capacity is a new book's capacity in bytes (at most MaxCapacity);
	// opening an existing book, zero or the book's own.
	Capacity uint64
	// GiveBackWait bounds how long an Acquire of this process waits for
	// the members it asked to give back; zero is DefaultGiveBackWait.
	GiveBackWait time.Duration
	// Perm is a new book file's mode (0o600 when zero): who may open the
	// file may join.
	Perm os.FileMode
}

func (o Options) check(what func() string) error {
	switch {
	case o.Capacity > MaxCapacity:
		return errors.Wrapf(driver.ErrInvalid, "%s: a capacity of %d is over %d", what(), o.Capacity, uint64(MaxCapacity))
	case o.GiveBackWait < 0:
		return errors.Wrapf(driver.ErrInvalid, "%s: a negative give-back wait %v", what(), o.GiveBackWait)
	case o.Perm&^os.ModePerm != 0:
		return errors.Wrapf(driver.ErrInvalid, "%s: mode %v: permission bits only", what(), o.Perm)
	}
	return nil
}

// GiveBack is a member's answer to a request to give back want bytes: it
// frees what it can (idle memory above its floor; never more than it can
// spare) and calls Release for it before it returns. It runs on the
// member's own goroutine, with no lock of the package held.
type GiveBack func(want uint64)

// Info is one member's line of the books.
type Info struct {
	Name    string `json:"name"`
	PID     int    `json:"pid"`
	Slot    int    `json:"slot"`
	Floor   uint64 `json:"floor_bytes"`
	Ceiling uint64 `json:"ceiling_bytes"`
	// Committed is the member's hold: what it has acquired and not
	// released.
	Committed uint64 `json:"committed_bytes"`
	// Idle is the part of Committed it says it could give back.
	Idle uint64 `json:"idle_bytes"`
	// Asked counts the requests to give back that reached it; GivenBack
	// is what it gave back when asked.
	Asked     uint64 `json:"asked"`
	GivenBack uint64 `json:"given_back_bytes"`
}
