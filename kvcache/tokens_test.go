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
