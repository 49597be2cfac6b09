package series

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestThinnedKeepsPeaks: random walks of every length up to far past the
// limit come back as at most the limit of points, each one of the samples
// in the order added, with the first, the last, the highest and the
// lowest among them.
func TestThinnedKeepsPeaks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, max := range []int{MinPoints, 7, 50, 2000} {
		for _, n := range []int{0, 1, 2, max - 1, max, max + 1, 3 * max, 100 * max, 100_000} {
			tt := New(max)
			var xs, ys []float64
			y := 0.0
			for i := range n {
				y += rng.NormFloat64()
				x := float64(i) / 3
				tt.Add(x, y)
				xs, ys = append(xs, x), append(ys, y)
			}
			require.Equal(t, n, tt.Len())
			px, py := tt.Points()
			require.Len(t, py, len(px))
			require.Equal(t, Series{X: px, Y: py}, tt.Series())
			require.LessOrEqual(t, len(px), max, "max %d, %d samples", max, n)
			if n == 0 {
				require.Empty(t, px)
				continue
			}
			// Every point is a sample, in order.
			j := 0
			for k := range px {
				for j < n && (xs[j] != px[k] || ys[j] != py[k]) {
					j++
				}
				require.Less(t, j, n, "point %d (%v, %v) is not a later sample", k, px[k], py[k])
				j++
			}
			require.Equal(t, xs[0], px[0], "the first sample")
			require.Equal(t, xs[n-1], px[len(px)-1], "the last sample")
			require.Equal(t, slices.Max(ys), slices.Max(py), "the peak")
			require.Equal(t, slices.Min(ys), slices.Min(py), "the trough")
		}
	}
}

// TestThinnedShortSeriesWhole: a series of at most Max/2 samples comes
// back whole.
func TestThinnedShortSeriesWhole(t *testing.T) {
	for _, max := range []int{MinPoints, 7, 8, 9, 100, 101} {
		for n := 1; n <= max/2; n++ {
			tt := New(max)
			for i := range n {
				tt.Add(float64(i), math.Sin(float64(i)))
			}
			px, _ := tt.Points()
			require.Len(t, px, n, "max %d", max)
		}
	}
	require.Equal(t, New(MinPoints).max, New(1).max, "a limit below MinPoints is MinPoints")
}

// TestThin: slices as Thinned keeps them; a short series as it is.
func TestThin(t *testing.T) {
	xs, ys := []float64{1, 2, 3}, []float64{5, 4, 6}
	gx, gy := Thin(xs, ys, 100)
	require.Equal(t, xs, gx)
	require.Equal(t, ys, gy)
	xs, ys = make([]float64, 10_000), make([]float64, 10_000)
	for i := range xs {
		xs[i], ys[i] = float64(i), float64(i%977)
	}
	gx, gy = Thin(xs, ys, 100)
	require.LessOrEqual(t, len(gx), 100)
	require.Equal(t, 976.0, slices.Max(gy))
	require.Equal(t, 0.0, slices.Min(gy))
}
