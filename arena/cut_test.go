package arena

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCutAfterARun: the chunks a commit cuts for a request of two chunks
// or more are its interior, one chunk; then the shared granule and the
// interior of each more like it that fits; then what is left in pieces
// that double from edgeChunk, each as large as the pieces before it; and
// after a smaller request, pieces of at most edgeChunk.
func TestCutAfterARun(t *testing.T) {
	e := newEnv(t, 64*g)
	al := e.fine(t, 64*g, PolicyDefault)
	h := al.heaps[large]
	require.Equal(t, g, h.edgeChunk(), "one granule at this scale")
	sp := func(lo, hi uint64) span { return span{lo * g, hi * g} }

	got := h.cut(0, 8*g+256)(sp(0, 30))
	require.Equal(t, []span{
		sp(0, 8),            // the request's interior
		sp(8, 9), sp(9, 16), // the granule it shares with the next, the next one's interior
		sp(16, 17), sp(17, 24), // and the one after
		sp(24, 25), sp(25, 26), sp(26, 28), sp(28, 30), // too short for one more: doubling, the last cut short
	}, got)
	require.NoError(t, h.s.checkCut(sp(0, 30), got))

	got = h.cut(0, 2*g)(sp(0, 40))
	var want []span
	for n := uint64(0); n < 40; n += 2 {
		want = append(want, sp(n, n+2))
	}
	require.Equal(t, want, got, "requests of whole chunks packed: each an interior of its own, nothing over")

	// With a larger live set edgeChunk is larger, and the doubling starts
	// from it.
	held := *h.held
	*h.held = 2 * g * edgeDivisor
	require.Equal(t, 2*g, h.edgeChunk())
	got = h.cut(0, 8*g+256)(sp(0, 30))
	require.Equal(t, []span{sp(0, 8), sp(8, 9), sp(9, 16), sp(16, 17), sp(17, 24), sp(24, 26), sp(26, 28), sp(28, 30)}, got)
	*h.held = held

	got = h.cut(0, g/2)(sp(0, 5))
	require.Equal(t, []span{sp(0, 1), sp(1, 2), sp(2, 3), sp(3, 4), sp(4, 5)}, got, "after a small request: edge chunks")

	got = h.cut(3*g+256, 3*g)(sp(0, 20))
	require.NoError(t, h.s.checkCut(sp(0, 20), got))
	for _, p := range got {
		if p.end <= 3*g {
			require.LessOrEqual(t, p.size(), g, "before the request: edge chunks")
		}
	}
}
