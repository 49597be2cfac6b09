package serving

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestRequestTrace: each shape is deterministic for a seed and differs
// between seeds; its requests are in arrival order from 0 within the
// readers' bounds; named blocks are ceil(Input/BlockTokens) a request and
// keep Mooncake's rule (an id always follows the same id, or always
// starts the prompt; none twice in a request); the shared shapes share.
func TestRequestTrace(t *testing.T) {
	for _, shape := range RequestShapes {
		t.Run(shape, func(t *testing.T) {
			a, err := RequestTrace{Shape: shape, Seed: 7, Requests: 500}.Generate()
			require.NoError(t, err)
			b, err := RequestTrace{Shape: shape, Seed: 7, Requests: 500}.Generate()
			require.NoError(t, err)
			require.Equal(t, a, b, "the same seed, the same requests")
			c, err := RequestTrace{Shape: shape, Seed: 8, Requests: 500}.Generate()
			require.NoError(t, err)
			require.NotEqual(t, a, c)
			require.Len(t, a, 500)
			require.Zero(t, a[0].Arrival)
			prev := map[int64]int64{} // block id -> the id before it (-1: starts the prompt)
			shared := 0
			for i, r := range a {
				if i > 0 {
					require.GreaterOrEqual(t, r.Arrival, a[i-1].Arrival)
				}
				require.LessOrEqual(t, r.Arrival, MaxArrival)
				require.Positive(t, r.Input)
				require.LessOrEqual(t, r.Input, MaxTokens)
				require.Positive(t, r.Output)
				require.LessOrEqual(t, r.Output, MaxTokens)
				if shape == "bursts" {
					require.Nil(t, r.Blocks)
					continue
				}
				require.Len(t, r.Blocks, (r.Input+BlockTokens-1)/BlockTokens)
				seen := map[int64]bool{}
				before := int64(-1)
				for _, id := range r.Blocks {
					require.False(t, seen[id], "request %d names block %d twice", i, id)
					seen[id] = true
					if p, ok := prev[id]; ok {
						require.Equal(t, p, before, "block %d follows another block than before", id)
						shared++
					}
					prev[id] = before
					before = id
				}
			}
			if shape != "bursts" && shape != "parallel-sampling" {
				require.Positive(t, shared, "prefixes are shared")
			}
			samples := map[int]int{}
			for _, r := range a {
				samples[r.N]++
			}
			if shape == "parallel-sampling" {
				require.Positive(t, samples[1], "requests of one sample")
				require.Positive(t, samples[2]+samples[4]+samples[8], "requests of several")
				require.Equal(t, len(a), samples[1]+samples[2]+samples[4]+samples[8], "n of 1, 2, 4 or 8")
			} else {
				require.Equal(t, len(a), samples[0], "one sample each, n unsaid")
			}
			// Another rate: the same lengths, other arrivals.
			fast, err := RequestTrace{Shape: shape, Seed: 7, Requests: 500, Rate: 100}.Generate()
			require.NoError(t, err)
			require.Less(t, fast[len(fast)-1].Arrival, a[len(a)-1].Arrival)
		})
	}
	def, err := RequestTrace{Shape: "squeeze"}.Generate()
	require.NoError(t, err)
	require.Len(t, def, DefaultGeneratedRequests)
}

// TestRequestTraceRefuses: parameters no trace has are driver.ErrInvalid,
// saying what would do, and make no requests.
func TestRequestTraceRefuses(t *testing.T) {
	for _, tc := range []struct {
		g    RequestTrace
		says string
	}{
		{RequestTrace{}, `unknown shape "", want shared-prefix, bursts, squeeze`},
		{RequestTrace{Shape: "Bursts"}, `unknown shape "Bursts"`},
		{RequestTrace{Shape: "bursts", Requests: -1}, "-1 requests: want 1 to 1000000 (0 for the default 1000)"},
		{RequestTrace{Shape: "bursts", Requests: MaxGeneratedRequests + 1}, "1000001 requests: want 1 to 1000000"},
		{RequestTrace{Shape: "squeeze", Rate: -1}, "a rate of -1 requests a second: want more than 0"},
		{RequestTrace{Shape: "squeeze", Rate: math.NaN()}, "a rate of NaN requests a second"},
		{RequestTrace{Shape: "squeeze", Rate: math.Inf(1)}, "a rate of +Inf requests a second"},
		{RequestTrace{Shape: "squeeze", Rate: 2e6}, "a rate of 2e+06 requests a second"},
	} {
		reqs, err := tc.g.Generate()
		require.ErrorIs(t, err, driver.ErrInvalid, "%+v", tc.g)
		require.ErrorContains(t, err, "serving: generated requests: "+tc.says)
		require.Nil(t, reqs)
		require.ErrorIs(t, tc.g.Check(), driver.ErrInvalid)
	}
}
