package tensor_test

import (
	"testing"

	"github.com/vmarena/vmarena/tensor"
)

// BenchmarkAt is one element read through At: over memory the caller
// owns (New, which nothing can release under its views), and over an
// arena view a Release ends, whose accesses are counted so that Release
// waits for those in flight (an atomic add and subtract each).
func BenchmarkAt(b *testing.B) {
	const n = 1 << 16
	run := func(b *testing.B, x *tensor.Tensor) {
		for i := 0; b.Loop(); i++ {
			if _, err := x.At(i & (n - 1)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("caller's memory", func(b *testing.B) {
		x, err := tensor.New(newHeap(n*4), tensor.Float32, n)
		if err != nil {
			b.Fatal(err)
		}
		run(b, x)
	})
	b.Run("arena view", func(b *testing.B) {
		x, err := tensor.OnArena(newArena(b, 1<<20), tensor.Float32, n)
		if err != nil {
			b.Fatal(err)
		}
		defer x.Release()
		run(b, x)
	})
}
