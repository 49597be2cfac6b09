package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun checks that the output shows the tensor striped a chunk per
// device, the first half on device 0 after the migration (one run with
// the chunk that was there already), each device's memory following it,
// and the same bytes at the same base.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)
	flat := regexp.MustCompile(` +`).ReplaceAllString(s, " ") // table columns are padded

	require.Regexp(t, `^A tensor of 512 × 256 float32 \(512 KiB\) at 0x[0-9a-f]+, striped over 4 devices in 64 KiB chunks;\n`, s)
	striped := " offset size device\n" +
		" 0x0 64 KiB 0\n 0x10000 64 KiB 1\n 0x20000 64 KiB 2\n 0x30000 64 KiB 3\n" +
		" 0x40000 64 KiB 0\n 0x50000 64 KiB 1\n 0x60000 64 KiB 2\n 0x70000 64 KiB 3\n" +
		" in use: device 0 128 KiB, device 1 128 KiB, device 2 128 KiB, device 3 128 KiB\n"
	require.Contains(t, flat, striped)
	require.Contains(t, s, "Migrate(0, 256 KiB, device 0): the first half moves onto device 0, at the same addresses;\n"+
		"3 of its 4 chunks were on other devices and are copied, the one on device 0 stays:\n")
	migrated := " offset size device\n" +
		" 0x0 320 KiB 0\n 0x50000 64 KiB 1\n 0x60000 64 KiB 2\n 0x70000 64 KiB 3\n" +
		" in use: device 0 320 KiB, device 1 64 KiB, device 2 64 KiB, device 3 64 KiB\n"
	require.Contains(t, flat, migrated)

	crcs := regexp.MustCompile(`crc32 ([0-9a-f]{8})`).FindAllStringSubmatch(s, -1)
	require.Len(t, crcs, 2)
	require.Equal(t, crcs[0][1], crcs[1][1], "the checksum before and after")
	bases := regexp.MustCompile(`0x[0-9a-f]{6,}`).FindAllString(s, -1)
	require.Len(t, bases, 2)
	require.Equal(t, bases[0], bases[1], "the base before and after")
	require.Contains(t, s, "(moved: false); all 512 KiB read back by device 0 are the same: true")
}
