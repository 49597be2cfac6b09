package sleep

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fileBlocks is the number of 512-byte blocks the file name holds.
func fileBlocks(t *testing.T, name string) int64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(name, &st))
	return st.Blocks
}
