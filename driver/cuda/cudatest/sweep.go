package cudatest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// Fault is a libcuda function made to fail with a CUresult code, and what
// the error must then be marked with and name.
type Fault struct {
	Fn   string
	Code int
	Want error  // the sentinel
	Name string // the code as the error names it: "CUDA_ERROR_INVALID_VALUE (1)"
	// Lingers is set for a call that gives something back (an unmap, a
	// free): when CUDA refuses it, what it would have given back stays in
	// CUDA until the next call puts it right. The layer must still be as
	// it was.
	Lingers bool
}

// Invalid is CUDA_ERROR_INVALID_VALUE at fn: no layer takes it for a full
// device, so the call fails wherever it comes.
func Invalid(fn string) Fault {
	return Fault{Fn: fn, Code: 1, Want: driver.ErrInvalid, Name: "CUDA_ERROR_INVALID_VALUE (1)"}
}

// OutOfMemory is CUDA_ERROR_OUT_OF_MEMORY at fn: another process holds the
// GPU's memory.
func OutOfMemory(fn string) Fault {
	return Fault{Fn: fn, Code: 2, Want: driver.ErrOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY (2)"}
}

// Lingering is f, for a call that gives something back (see Lingers).
func Lingering(f Fault) Fault {
	f.Lingers = true
	return f
}

// Op is an operation of a layer over a fresh stand-in, to be made to fail.
type Op struct {
	Lib     *Lib
	Devices int // of the stand-in
	// Run is the operation. It is called again after each failure, once
	// CUDA accepts every call, and must then succeed.
	Run func() error
	// State is the layer as a failed Run must leave it.
	State func() any
	// Below is what lies under the layer (physical memory's books, the
	// driver's record), as a failed Run must leave it too; Sweep adds what
	// the stand-in holds. Nil for nothing more.
	Below func() any
}

// Held is what a stand-in holds: memory per device and live objects.
type Held struct {
	Used []uint64
	Live map[string]int64
}

// HeldBy is what lib holds on its first devices.
func HeldBy(lib *Lib, devices int) Held {
	h := Held{Live: map[string]int64{}}
	for d := range devices {
		h.Used = append(h.Used, lib.Used(d))
	}
	for _, k := range []string{"reservations", "allocations", "mappings", "streams", "events", "hostallocs"} {
		h.Live[k] = lib.Live(k)
	}
	return h
}

// below is an Op's Below and what the stand-in holds.
type below struct {
	Layers any
	Held   Held
}

func (op Op) below() below {
	b := below{Held: HeldBy(op.Lib, op.Devices)}
	if op.Below != nil {
		b.Layers = op.Below()
	}
	return b
}

// Sweep makes every call a layer's operation makes to libcuda fail, one
// at a time: setup builds the stack over a fresh stand-in (Open) and
// returns the operation. Sweep runs it once to count its calls of each
// fault's function, then once per call with that call refused, each on a
// fresh stand-in, as a subtest named after the function, the code and
// the call ("cuMemMap(1)#2-of-5"). Each time the operation must fail
// marked with the fault's sentinel and naming the function and the code,
// leave the layer and what lies under it as they were (see
// Fault.Lingers), and — once CUDA accepts every call — succeed, leaving
// under the layer what it leaves without a failure. It returns the number
// of calls of each function.
func Sweep(t *testing.T, setup func(t *testing.T) Op, faults ...Fault) map[string]int {
	t.Helper()
	n := map[string]int{}
	var clean below
	t.Run("count", func(t *testing.T) {
		op := setup(t)
		before := map[string]uint64{}
		for _, f := range faults {
			before[f.Fn] = op.Lib.Calls(f.Fn)
		}
		require.NoError(t, op.Run())
		for _, f := range faults {
			n[f.Fn] = int(op.Lib.Calls(f.Fn) - before[f.Fn])
		}
		clean = op.below()
	})
	for _, f := range faults {
		require.Positive(t, n[f.Fn], "the operation calls %s", f.Fn)
		for nth := 1; nth <= n[f.Fn]; nth++ {
			t.Run(fmt.Sprintf("%s(%d)#%d-of-%d", f.Fn, f.Code, nth, n[f.Fn]), func(t *testing.T) {
				op := setup(t)
				state, under := op.State(), op.below()
				op.Lib.Fail(f.Fn, nth, 1, f.Code)
				drivertest.RequireIs(t, op.Run(), f.Want, f.Fn+": "+f.Name)
				require.Equal(t, state, op.State(), "the layer is as it was")
				if now := op.below(); f.Lingers && !assert.ObjectsAreEqual(under, now) {
					require.Equal(t, under.Layers, now.Layers, "physical memory and the driver's record are as they were")
					t.Logf("left in CUDA until the next call: %v, was %v", now.Held, under.Held)
				} else {
					require.Equal(t, under, now, "what lies under the layer, CUDA's memory and objects included, is as it was")
				}
				op.Lib.Clear()
				require.NoError(t, op.Run(), "the same call, once CUDA accepts it")
				require.Equal(t, clean, op.below(), "and it leaves under the layer what it leaves without the failure")
			})
		}
	}
	return n
}
