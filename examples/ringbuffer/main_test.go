package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun checks that the output shows one chunk at two addresses, the
// message written in two pieces and read in one across the seam, and a
// stream whose wrapped messages all read back.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)

	maps := regexp.MustCompile(`(?m)^  \[(0x[0-9a-f]+), (0x[0-9a-f]+)\)  (chunk \d+ \(64 KiB on device 0\))$`).FindAllStringSubmatch(s, -1)
	require.Len(t, maps, 2, s)
	require.Equal(t, maps[0][3], maps[1][3], "the same chunk behind both mappings")
	require.Equal(t, maps[0][2], maps[1][1], "back to back")
	require.Contains(t, s, "device memory used: 64 KiB")

	require.Contains(t, s, "the other 23 wrap to offset 0 (2 Writes)")
	require.Contains(t, s, `Offset 0 of the ring (`+maps[0][1]+`) holds "ast the end of the ring"`)
	require.Contains(t, s, `and so does the second mapping at `+maps[1][1]+`: "ast the end of the ring"`)
	require.Regexp(t, `The reader reads 43 bytes at 0x[0-9a-f]+ with one Read, straight across `+maps[1][1]+
		`: "this message wraps past the end of the ring"`, s)

	m := regexp.MustCompile(`went (\d+) times round the ring; (\d+) of them\ncrossed its end, and every one was read back intact`).FindStringSubmatch(s)
	require.NotNil(t, m, s)
	laps, _ := strconv.Atoi(m[1])
	wrapped, _ := strconv.Atoi(m[2])
	require.Greater(t, laps, 10)
	require.Greater(t, wrapped, 10)
}
