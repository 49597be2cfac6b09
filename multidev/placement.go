package multidev

import (
	"cmp"

	"fmt"
	"github.com/vmarena/vmarena/arena"
	"slices"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Placement decides which device backs each chunk: the arena core's
// (arena.Placement); the policies below spread a range over devices.
type Placement = arena.Placement

// listed is implemented by the policies built on a list of devices, so New
// can check the list against the driver before anything is reserved.
type listed interface {
	devices() []driver.DeviceID
}

// Striped places chunk i on devs[i mod len(devs)]: round robin by chunk
// index. A full device is followed by the next ones in the list.
func Striped(devs ...driver.DeviceID) Placement { return striped{devs: slices.Clone(devs)} }

type striped struct{ devs []driver.DeviceID }

func (p striped) devices() []driver.DeviceID { return p.devs }

func (p striped) Order(_ uint64, i int, _ []uint64) []driver.DeviceID {
	return rotate(p.devs, i)
}

func (p striped) String() string { return fmt.Sprintf("striped over %v", p.devs) }

// Blocked fills perDevice bytes on devs[0], then perDevice on devs[1], and
// so on, starting again at devs[0] after the last: the chunk at offset off
// goes to devs[(off/perDevice) mod len(devs)]. perDevice must be a multiple
// of the arena's chunk size (New checks).
func Blocked(perDevice uint64, devs ...driver.DeviceID) Placement {
	return blocked{per: perDevice, devs: slices.Clone(devs)}
}

type blocked struct {
	per  uint64
	devs []driver.DeviceID
}

func (p blocked) devices() []driver.DeviceID { return p.devs }

func (p blocked) Order(off uint64, _ int, _ []uint64) []driver.DeviceID {
	if p.per == 0 || len(p.devs) == 0 {
		return nil
	}
	return rotate(p.devs, int((off/p.per)%uint64(len(p.devs))))
}

func (p blocked) String() string {
	return fmt.Sprintf("blocked, %s per device over %v", units.Bytes(p.per), p.devs)
}

// Weighted places each chunk on the device of devs with the most free
// memory (ties to the one listed first), then the others by free memory.
func Weighted(devs ...driver.DeviceID) Placement { return weighted{devs: slices.Clone(devs)} }

type weighted struct{ devs []driver.DeviceID }

func (p weighted) devices() []driver.DeviceID { return p.devs }

func (p weighted) Order(_ uint64, _ int, free []uint64) []driver.DeviceID {
	out := slices.Clone(p.devs)
	at := func(d driver.DeviceID) uint64 {
		if d < 0 || int(d) >= len(free) {
			return 0
		}
		return free[d]
	}
	slices.SortStableFunc(out, func(a, b driver.DeviceID) int { return cmp.Compare(at(b), at(a)) })
	return out
}

func (p weighted) String() string { return fmt.Sprintf("weighted by free memory over %v", p.devs) }

// Explicit places the chunk at offset off on fn(off) and nowhere else.
func Explicit(fn func(off uint64) driver.DeviceID) Placement { return explicit{fn: fn} }

type explicit struct{ fn func(uint64) driver.DeviceID }

func (p explicit) Order(off uint64, _ int, _ []uint64) []driver.DeviceID {
	return []driver.DeviceID{p.fn(off)}
}

func (p explicit) String() string { return "explicit" }

// rotate returns devs starting at index i (mod len(devs)), wrapping round.
func rotate(devs []driver.DeviceID, i int) []driver.DeviceID {
	n := len(devs)
	out := make([]driver.DeviceID, n)
	for k := range out {
		out[k] = devs[(i+k)%n]
	}
	return out
}

// OnFull says what a grow does when the device the placement put first
// has no room for the chunk (arena.OnFull).
type OnFull = arena.OnFull

const (
	// SkipFull tries the next device in the placement's order; the grow
	// fails only when every device it names is full.
	SkipFull = arena.SkipFull
	// FailWhenFull fails the grow, leaving the arena unchanged.
	FailWhenFull = arena.FailWhenFull
)
