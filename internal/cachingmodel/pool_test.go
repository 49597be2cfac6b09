package cachingmodel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestPoolModel: random inserts, removals and best-fit searches against a
// sorted slice, compared after each step: the same blocks in the same
// order, the same ceil, a removal of a block not pooled refused with the
// pool unchanged.
func TestPoolModel(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 11))
		var p pool
		var ref []*block
		segs := []*segment{{id: 0}, {id: 1}, {id: 2}}
		for step := range 4000 {
			switch op := rng.IntN(5); {
			case op < 2 || len(ref) == 0:
				b := &block{seg: segs[rng.IntN(len(segs))], off: uint64(step) * MinBlock, size: uint64(1+rng.IntN(64)) * MinBlock, free: true}
				p.insert(b)
				i, _ := slices.BinarySearchFunc(ref, b, less)
				ref = slices.Insert(ref, i, b)
			case op < 4:
				i := rng.IntN(len(ref))
				require.True(t, p.remove(ref[i]))
				ref = slices.Delete(ref, i, i+1)
			default:
				require.False(t, p.remove(&block{seg: segs[0], off: 1, size: MinBlock}), "not pooled")
			}
			key := &block{seg: &segment{id: -1}, size: uint64(1+rng.IntN(64)) * MinBlock}
			i, _ := slices.BinarySearchFunc(ref, key, less)
			var want *block
			if i < len(ref) {
				want = ref[i]
			}
			require.Same(t, want, p.ceil(key), "seed %d step %d", seed, step)
			require.Equal(t, len(ref), p.n)
			if step%97 == 0 {
				require.Equal(t, ref, p.blocks())
			}
		}
		require.Equal(t, ref, p.blocks())
	}
}

// BenchmarkAllocFree is an Alloc and a Free of the model with n
// allocations of 512 B to 8 KiB live, their frees leaving about as many
// free blocks: the cost should grow with the logarithm of n, not with n.
func BenchmarkAllocFree(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			m := New(units.TiB)
			rng := rand.New(rand.NewPCG(1, 2))
			size := func() uint64 { return MinBlock * uint64(1+rng.IntN(16)) }
			for i := range 2 * n {
				if _, err := m.Alloc(int64(i), size(), nil); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < 2*n; i += 2 { // every other one freed: holes between live blocks
				if err := m.Free(int64(i)); err != nil {
					b.Fatal(err)
				}
			}
			id := int64(2 * n)
			b.ResetTimer()
			for range b.N {
				if _, err := m.Alloc(id, size(), nil); err != nil {
					b.Fatal(err)
				}
				if err := m.Free(id); err != nil {
					b.Fatal(err)
				}
				id++
			}
		})
	}
}
