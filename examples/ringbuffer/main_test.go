package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
)

// TestRun checks that the output shows one chunk at two addresses, the
// message written in two pieces and read in one across the seam, and a
// stream whose wrapped messages all read back.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, ""))
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

// TestPictures: with -svg the example draws the ring's reservation twice,
// its output otherwise the same: the chunk the output names mapped at +0
// and again at +64 KiB, inaccessible, then accessible, the alias listed
// and the message's start marked.
func TestPictures(t *testing.T) {
	dir := t.TempDir()
	var out, plain bytes.Buffer
	require.NoError(t, run(&out, dir))
	require.NoError(t, run(&plain, ""))
	addr := regexp.MustCompile(`0x[0-9a-f]{8,}`)
	require.Equal(t, addr.ReplaceAllString(plain.String(), "ADDR"), addr.ReplaceAllString(out.String(), "ADDR"))
	chunk := regexp.MustCompile(`chunk (\d+) \(64 KiB on device 0\)`).FindStringSubmatch(out.String())
	require.NotNil(t, chunk)

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "step-01-mapped-twice.svg"), filepath.Join(dir, "step-02-accessible.svg")}, files)
	for i, want := range []memsvg.Counts{{Mapped: 2}, {Accessible: 2}} {
		d := svgtest.ReadFile(t, files[i])
		require.Equal(t, want, d.Counts(t), files[i])
		require.Equal(t, []string{"chunk " + chunk[1] + " (device 0) mapped twice: at +0 B and +64 KiB"}, d.Aliases())
		require.Len(t, d.Cells, 2)
		require.Equal(t, []string{"the ring's reservation: 128 KiB at " + addr.FindString(out.String()) + ", 2 granules of 64 KiB"}, d.Texts["range"])
		require.Contains(t, d.Swatches, "dashed: the chunk's handle is released; its memory stays while it is mapped")
	}
	d := svgtest.ReadFile(t, files[1])
	require.Equal(t, []string{"1: the ring (+0 B)", "2: the same chunk again (+64 KiB)",
		"3: the message starts, 20 bytes before the ring's end (+65516 B)"}, d.Texts["mark-list"])
}
