package kvcache

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTokenLog: appends and truncations of random sizes across blocks
// leave the log holding what a plain slice does.
func TestTokenLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 1))
	var l tokenLog
	var want []int
	next := 0
	for range 400 {
		if rng.UintN(4) == 0 && len(want) > 0 {
			n := rng.IntN(len(want) + 1)
			l.truncate(n)
			want = want[:n]
		} else {
			ts := make([]int, rng.IntN(3*logBlock/2))
			for i := range ts {
				ts[i] = next
				next++
			}
			l.append(ts)
			want = append(want, ts...)
		}
		require.Equal(t, len(want), l.n)
		require.True(t, l.check())
		if got := l.appendTo(nil); len(want) > 0 {
			require.Equal(t, want, got)
		} else {
			require.Empty(t, got)
		}
	}
	l.truncate(0)
	require.Empty(t, l.blocks)
	require.Nil(t, l.appendTo(nil))
}

// TestTokenLogFirstBlockGrows: a short log holds a small block, which
// doubles up to logBlock as tokens come one at a time (as decode steps
// append them), keeping every token; the blocks after it are full-sized.
func TestTokenLogFirstBlockGrows(t *testing.T) {
	var l tokenLog
	l.append([]int{7})
	require.Equal(t, firstBlock, cap(l.blocks[0]), "the first Append makes a small block")
	var want []int
	want = append(want, 7)
	caps := []int{cap(l.blocks[0])}
	for i := 1; i < 2*logBlock+5; i++ {
		l.append([]int{i})
		want = append(want, i)
		if c := cap(l.blocks[0]); c != caps[len(caps)-1] {
			caps = append(caps, c)
		}
		require.True(t, l.check(), "after %d tokens", i+1)
	}
	require.Equal(t, []int{16, 32, 64, 128, 256, 512, 1024}, caps, "doubling up to logBlock")
	require.Len(t, l.blocks, 3)
	require.Equal(t, logBlock, cap(l.blocks[1]))
	require.Equal(t, want, l.appendTo(nil))
	l.truncate(3)
	require.Equal(t, want[:3], l.appendTo(nil))
	require.True(t, l.check())
	l.append([]int{99})
	require.Equal(t, append(want[:3:3], 99), l.appendTo(nil))
}
