package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Placement decides which device backs each chunk a Sparse commits.
// Policies that spread a range over several devices (striped, blocked,
// weighted, explicit) are in package multidev; OneDevice is the default.
type Placement interface {
	// Order returns the devices to try for the chunk at offset off (index
	// i = off/ChunkSize), best first. free is the free bytes per device,
	// indexed by DeviceID, counting the chunks the commit in progress has
	// taken already; Order may keep it.
	Order(off uint64, i int, free []uint64) []driver.DeviceID
	String() string
}

// placementOrder asks p for its order, and turns a panic in p into an
// error (driver.ErrInvalid): a placement is the caller's code, and a
// commit must fail cleanly, not unwind half-done through the books.
func placementOrder(p Placement, off uint64, i int, free []uint64) (order []driver.DeviceID, err error) {
	defer func() {
		if r := recover(); r != nil {
			order, err = nil, errors.Wrapf(driver.ErrInvalid, "the placement's Order panicked: %v", r)
		}
	}()
	return p.Order(off, i, free), nil
}

// placementString is p.String(), or a note that it panicked.
func placementString(p Placement) (s string) {
	defer func() {
		if r := recover(); r != nil {
			s = fmt.Sprintf("by a %T placement whose String panicked", p)
		}
	}()
	return p.String()
}

// OneDevice places every chunk on dev.
func OneDevice(dev driver.DeviceID) Placement { return oneDevice{dev} }

type oneDevice struct{ dev driver.DeviceID }

func (p oneDevice) Order(uint64, int, []uint64) []driver.DeviceID { return []driver.DeviceID{p.dev} }

func (p oneDevice) String() string { return fmt.Sprintf("on device %d", p.dev) }

// OnFull says what a commit does when the device the placement put first
// has no room for a chunk.
type OnFull uint8

const (
	// SkipFull tries the next device in the placement's order; the commit
	// fails only when every device it names is full.
	SkipFull OnFull = iota
	// FailWhenFull fails the commit, leaving the range unchanged.
	FailWhenFull
)

func (o OnFull) String() string {
	switch o {
	case SkipFull:
		return "skip full devices"
	case FailWhenFull:
		return "fail when full"
	}
	return fmt.Sprintf("OnFull(%d)", uint8(o))
}
