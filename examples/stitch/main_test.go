package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun checks that the output shows the fragmented arena, a request
// served by a stitch with nothing new committed, the stitched bytes seen
// through the arena, and the chunks back in the free space after Free.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)
	flat := regexp.MustCompile(` +`).ReplaceAllString(s, " ") // table columns are padded

	require.Contains(t, s, "every other one freed. Its memory now reads (U used, . free):\n  .U.U.U.U.U.U.U.U\n")
	require.Contains(t, s, "512 KiB free in all, but the largest free range is 64 KiB.")
	require.Regexp(t, `Alloc\(256 KiB\) is served at 0x[0-9a-f]+, outside \[0x[0-9a-f]+, \+1 MiB\) where the chunks lie: a stitch\.`, s)
	for _, row := range []string{
		" Stitches 0 1\n", " Grows 16 16\n", " Committed 1 MiB 1 MiB\n",
		" Allocated 512 KiB 768 KiB\n", " MapEvents 16 17\n", " ChunkMaps 16 20\n", " Live 8 9\n",
	} {
		require.Contains(t, flat, row)
	}
	require.Contains(t, s, "lent to the stitch while it lives (S):\n  SUSUSUSU.U.U.U.U\n")
	parts := regexp.MustCompile(`(?m)^  0x[0-9a-f]+: "stitched part (\d), written at 0x[0-9a-f]+" \(all 64 KiB the same: true\)$`).FindAllStringSubmatch(s, -1)
	require.Len(t, parts, 4, s)
	require.NotContains(t, s, "same: false")
	require.Contains(t, s, "Free unmaps the stitch (1 unmap event, 4 chunks) and returns the chunks to the free space:\n  .U.U.U.U.U.U.U.U\n")
	require.Contains(t, s, "Committed 1 MiB, Allocated 512 KiB, Live 8, largest free range 64 KiB.")
}
