package leakcheck

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCompareSeesALeak(t *testing.T) {
	var leaked []*os.File
	defer func() {
		for _, f := range leaked {
			f.Close()
		}
	}()
	_, _, same, err := Compare(3, func() {
		f, err := os.Open(os.DevNull)
		require.NoError(t, err)
		leaked = append(leaked, f) // one more descriptor every round
	})
	require.NoError(t, err)
	require.False(t, same, "a descriptor leaked in every round is a leak")

	before, after, same, err := Compare(3, func() {
		f, err := os.Open(os.DevNull)
		require.NoError(t, err)
		f.Close()
	})
	require.NoError(t, err)
	require.True(t, same, "%v / %v", before, after)
}

// TestVerdict: a round that leaves the holdings as they were passed,
// whatever the threads did; one that changes them is evidence, unless a
// thread came or went meanwhile (its stack is a mapping): that round is
// run again.
func TestVerdict(t *testing.T) {
	base := Snapshot{FDs: 10, Maps: 80, Threads: 5}
	moreMaps := base
	moreMaps.Maps += 2
	newThread := moreMaps
	newThread.Threads++
	onlyThreads := base
	onlyThreads.Threads++
	leakedFD := base
	leakedFD.FDs++
	require.Equal(t, held, verdict(base, base))
	require.Equal(t, held, verdict(base, onlyThreads), "threads alone are not holdings")
	require.Equal(t, differs, verdict(base, moreMaps))
	require.Equal(t, differs, verdict(base, leakedFD))
	require.Equal(t, inconclusive, verdict(base, newThread))
}

// TestTakeCountsThreads: a snapshot reads the thread count.
func TestTakeCountsThreads(t *testing.T) {
	s, err := Take()
	require.NoError(t, err)
	require.Positive(t, s.Threads)
}
