package tensor_test

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

const gran = 64 * units.KiB

// stack is a small host driver with its address space and memory.
type stack struct {
	drv   *host.Driver
	space *vaspace.Space
	mem   *physical.Memory
}

func newStack(t testing.TB) *stack {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 * gran, Granularity: gran})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	return &stack{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// arena returns an arena of max bytes committing 64 KiB chunks on device
// 0, closed at the end of the test (which fails if a view is still live).
func (s *stack) arena(t testing.TB, max uint64) *arena.Arena {
	t.Helper()
	a, err := arena.New(s.space, s.mem, arena.Options{Max: max, ChunkSize: gran})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Check())
		require.NoError(t, a.Close(), "every view released by the end of the test")
	})
	return a
}

// newArena is a fresh stack's arena of max bytes.
func newArena(t testing.TB, max uint64) *arena.Arena { return newStack(t).arena(t, max) }

// heap is a Buffer over Go memory, for tests that need no arena.
type heap []byte

func (h heap) Bytes() ([]byte, error) { return h, nil }

// newHeap returns an 8-byte aligned heap buffer of n bytes (the memory
// of a []uint64, so any dtype's elements are aligned in it).
func newHeap(n int) heap {
	w := make([]uint64, (n+8)/8)
	return heap(unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*8)[:n:n])
}

// layout is everything that describes a tensor; a refused call must leave
// it as it was.
type layout struct {
	DType   tensor.DType
	Shape   []int
	Strides []int
	Offset  int
	N       int
	Contig  bool
}

func layoutOf(t *tensor.Tensor) layout {
	return layout{t.DType(), t.Shape(), t.Strides(), t.Offset(), t.NumElements(), t.IsContiguous()}
}

// fill sets element k (row-major) of t to f(k), through Set.
func fill(t testing.TB, x *tensor.Tensor, f func(k int) float64) {
	t.Helper()
	k := 0
	forEachIndex(x.Shape(), func(idx []int) {
		if err := x.Set(f(k), idx...); err != nil {
			require.NoError(t, err, "set %v", idx)
		}
		k++
	})
}

// values returns t's elements in row-major order, through At.
func values(t testing.TB, x *tensor.Tensor) []float64 {
	t.Helper()
	var out []float64
	forEachIndex(x.Shape(), func(idx []int) {
		v, err := x.At(idx...)
		if err != nil { // require only on failure: it is costly per element
			require.NoError(t, err, "at %v", idx)
		}
		out = append(out, v)
	})
	return out
}

// forEachIndex calls fn with every index of shape in row-major order (one,
// empty, for a scalar; none for an empty shape). idx is reused.
func forEachIndex(shape []int, fn func(idx []int)) {
	for _, s := range shape {
		if s == 0 {
			return
		}
	}
	idx := make([]int, len(shape))
	for {
		fn(idx)
		d := len(shape) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return
		}
	}
}

// name is v as a string, for test names and message fragments.
func name(v any) string { return fmt.Sprint(v) }
