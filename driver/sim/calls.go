package sim

// Driver calls as a budget: the sim driver counts every call that changed
// its record and prices the counts with a table of per-call costs
// measured on a GPU, so that a replay says how much driver time a
// framework would have spent on what it did.

import (
	"math"
	"math/bits"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// CallCosts is the modelled time of one driver call of each kind that
// changes a driver's record. A call is priced whatever it spans: the
// published figures are per call on 2 MiB chunks, and a chunk of 20 MiB,
// or a SetAccess over many mappings, costs the same one call.
type CallCosts struct {
	// Name says where the figures come from.
	Name string
	// Reserve is cuMemAddressReserve; Unreserve cuMemAddressFree.
	Reserve, Unreserve time.Duration
	// Create is cuMemCreate; Release cuMemRelease.
	Create, Release time.Duration
	// Map is cuMemMap; Unmap cuMemUnmap.
	Map, Unmap time.Duration
	// SetAccess is cuMemSetAccess.
	SetAccess time.Duration
}

// A100 prices calls as kvcached measured them on an NVIDIA A100: the
// "Sample Output on A100" of its benchmarks/bench_vmm README (one thread,
// 4096 pages of 2 MB) gives cuMemCreate 193.32 µs, cuMemMap 1.45 µs,
// cuMemSetAccess 35.99 µs and cuMemUnmap 25.63 µs a call on average, and
// cuMemAddressReserve of 8 GB 19 µs. It gives no figure for cuMemRelease
// or cuMemAddressFree, so Release and Unreserve are unpriced (0) for want
// of a published figure; they are counted all the same. It is what
// Options.Costs defaults to.
var A100 = CallCosts{
	Name:      "A100 (kvcached benchmarks/bench_vmm)",
	Reserve:   19 * time.Microsecond,
	Create:    193320 * time.Nanosecond,
	Map:       1450 * time.Nanosecond,
	Unmap:     25630 * time.Nanosecond,
	SetAccess: 35990 * time.Nanosecond,
}

// H100 prices calls as this project measured them on an NVIDIA H100 80GB
// HBM3 (CUDA 13.0 driver, 2026-11-27): BenchmarkHardwareCalls in
// driver/cuda, 100 rounds of one 2 MiB chunk created, mapped, granted,
// unmapped and released, gives cuMemCreate 16.71 µs, cuMemMap 4.02 µs,
// cuMemSetAccess 31.29 µs, cuMemUnmap 22.25 µs and cuMemRelease 16.39 µs a
// call (at 20 MiB: 16.62, 4.93, 33.21, 22.80 and 32.22 µs). A create costs
// a twelfth of the A100 table's there, so the two tables weigh creates
// against grants and unmaps differently; replay reports both. Reserve and
// Unreserve were not measured and are unpriced.
var H100 = CallCosts{
	Name:      "H100 (measured: driver/cuda BenchmarkHardwareCalls)",
	Create:    16710 * time.Nanosecond,
	Release:   16390 * time.Nanosecond,
	Map:       4020 * time.Nanosecond,
	Unmap:     22250 * time.Nanosecond,
	SetAccess: 31290 * time.Nanosecond,
}

// check refuses a negative cost, naming it.
func (c CallCosts) check() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Reserve", c.Reserve}, {"Unreserve", c.Unreserve}, {"Create", c.Create}, {"Release", c.Release},
		{"Map", c.Map}, {"Unmap", c.Unmap}, {"SetAccess", c.SetAccess}} {
		if f.d < 0 {
			return errors.Wrapf(driver.ErrInvalid, "sim: the cost of a %s call is %v: a call takes no less than no time", f.name, f.d)
		}
	}
	return nil
}

// Calls counts driver calls by kind: the calls that succeeded (a call
// that fails changes nothing and is not counted), one for each call of
// the driver's, whatever it spans.
type Calls struct {
	Reserve, Unreserve uint64
	Create, Release    uint64
	Map, Unmap         uint64
	SetAccess          uint64
}

// Time is the calls priced by costs: each count times its cost, summed
// (a negative cost, which New refuses, counts as 0). A sum past the
// largest time.Duration (292 years) is that largest one.
func (c Calls) Time(costs CallCosts) time.Duration {
	var sum uint64
	for _, t := range []struct {
		n    uint64
		cost time.Duration
	}{{c.Reserve, costs.Reserve}, {c.Unreserve, costs.Unreserve}, {c.Create, costs.Create}, {c.Release, costs.Release},
		{c.Map, costs.Map}, {c.Unmap, costs.Unmap}, {c.SetAccess, costs.SetAccess}} {
		if t.cost <= 0 {
			continue
		}
		hi, lo := bits.Mul64(t.n, uint64(t.cost))
		var carry uint64
		sum, carry = bits.Add64(sum, lo, 0)
		if hi != 0 || carry != 0 || sum > math.MaxInt64 {
			return math.MaxInt64
		}
	}
	return time.Duration(sum)
}

// Total is the number of calls of every kind.
func (c Calls) Total() uint64 {
	return c.Reserve + c.Unreserve + c.Create + c.Release + c.Map + c.Unmap + c.SetAccess
}

// Add is c and o counted together.
func (c Calls) Add(o Calls) Calls {
	return Calls{Reserve: c.Reserve + o.Reserve, Unreserve: c.Unreserve + o.Unreserve,
		Create: c.Create + o.Create, Release: c.Release + o.Release,
		Map: c.Map + o.Map, Unmap: c.Unmap + o.Unmap, SetAccess: c.SetAccess + o.SetAccess}
}

// Sub is the calls counted since o was: c less o, for two tallies of the
// same driver, o taken first.
func (c Calls) Sub(o Calls) Calls {
	return Calls{Reserve: c.Reserve - o.Reserve, Unreserve: c.Unreserve - o.Unreserve,
		Create: c.Create - o.Create, Release: c.Release - o.Release,
		Map: c.Map - o.Map, Unmap: c.Unmap - o.Unmap, SetAccess: c.SetAccess - o.SetAccess}
}

// Tally is what a sim driver counted since New, where, and the table
// that prices it.
type Tally struct {
	// Costs is the driver's table (Options.Costs).
	Costs CallCosts
	// Space counts Reserve and Unreserve, which belong to no device: the
	// address space is the driver's. Its other counts are 0.
	Space Calls
	// Devices counts the calls of each device, indexed by its DeviceID:
	// Create, Release, Map and Unmap on the device the chunk was created
	// on, SetAccess on the device it grants access to. Their Reserve and
	// Unreserve are 0.
	Devices []Calls
}

// Total is every call the driver counted: Space and every device's.
func (t Tally) Total() Calls {
	sum := t.Space
	for _, c := range t.Devices {
		sum = sum.Add(c)
	}
	return sum
}

// Time is Total priced by Costs.
func (t Tally) Time() time.Duration { return t.Total().Time(t.Costs) }

// Tally returns a copy of the calls the driver has counted and its table
// of costs. Close's own unmapping, releasing and unreserving of what was
// left are not counted: they are no calls of the caller's.
func (d *Driver) Tally() Tally {
	if d.unmade() {
		return Tally{}
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	return Tally{Costs: d.costs, Space: d.calls.space, Devices: append([]Calls(nil), d.calls.devices...)}
}

// Calls is every call the driver counted, Tally's Total, without copying
// the per-device counts: cheap enough to read around each call of a
// caller's that it prices (package serving's simulation does).
func (d *Driver) Calls() Calls {
	if d.unmade() {
		return Calls{}
	}
	d.calls.Lock()
	defer d.calls.Unlock()
	sum := d.calls.space
	for _, c := range d.calls.devices {
		sum = sum.Add(c)
	}
	return sum
}

// costTables are the tables CostTable knows, by name.
var costTables = map[string]CallCosts{"a100": A100, "h100": H100}

// CostTableNames names the tables CostTable knows, sorted.
func CostTableNames() []string { return []string{"a100", "h100"} }

// CostTable is the table of that name: "a100" (A100) or "h100" (H100). Any
// other name is an error marked driver.ErrInvalid that lists them.
func CostTable(name string) (CallCosts, error) {
	if c, ok := costTables[name]; ok {
		return c, nil
	}
	return CallCosts{}, errors.Wrapf(driver.ErrInvalid, "sim: no table of call costs named %q: want a100 or h100", name)
}
