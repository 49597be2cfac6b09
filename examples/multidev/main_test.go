package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
)

// TestRun checks that the output shows the tensor striped a chunk per
// device, the first half on device 0 after the migration (one run with
// the chunk that was there already), each device's memory following it,
// and the same bytes at the same base.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, ""))
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

// TestPictures: with -svg the example draws the tensor's range before and
// after the migration, its output otherwise the same: a cell a chunk in
// the colour of its device, as many of each as the printed layout says.
func TestPictures(t *testing.T) {
	dir := t.TempDir()
	var out, plain bytes.Buffer
	require.NoError(t, run(&out, dir))
	require.NoError(t, run(&plain, ""))
	addr := regexp.MustCompile(`0x[0-9a-f]{8,}`)
	require.Equal(t, addr.ReplaceAllString(plain.String(), "ADDR"), addr.ReplaceAllString(out.String(), "ADDR"))

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "step-01-striped.svg"), filepath.Join(dir, "step-02-migrated.svg")}, files)
	for i, perDevice := range [][devices]int{{2, 2, 2, 2}, {5, 1, 1, 1}} {
		d := svgtest.ReadFile(t, files[i])
		require.Equal(t, memsvg.Counts{Accessible: 8}, d.Counts(t), files[i])
		require.Equal(t, []string{"reservation " + addr.FindString(out.String()) + ": 512 KiB at " + addr.FindString(out.String()) + ", 8 granules of 64 KiB"},
			d.Texts["range"])
		byFill := d.CellsByFill()
		for dev, n := range perDevice {
			label := fmt.Sprintf("a chunk on device %d, accessible: some device may read it", dev)
			require.Equal(t, memsvg.Fill(memsvg.Accessible, dev), d.Swatches[label], label)
			require.Equal(t, n, byFill[d.Swatches[label]], "%s: cells of device %d", files[i], dev)
		}
		require.Empty(t, d.Aliases())
	}
	first := svgtest.ReadFile(t, files[0]).Cells
	for i, c := range first {
		require.Equal(t, memsvg.Fill(memsvg.Accessible, i%devices), c.Fill, "chunk %d is on device %d", i, i%devices)
	}
}
