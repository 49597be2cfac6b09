package cachemiss

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCycleVisitsEveryLink: the links form one cycle through all of them,
// whatever the span, and Walk follows them.
func TestCycleVisitsEveryLink(t *testing.T) {
	for _, span := range []uint64{0, 4, 8, 12, 4096, 1 << 20} {
		next, start := Cycle(span)
		require.Len(t, next, int(max(span/4, 2)))
		require.Less(t, int(start), len(next))
		seen := make([]bool, len(next))
		p := start
		for range next {
			require.False(t, seen[p], "span %d: link %d visited twice before the cycle closed", span, p)
			seen[p] = true
			p = Walk(next, p, 1)
		}
		require.Equal(t, start, p, "span %d: the walk is back where it started after every link", span)
	}
}
