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
