package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestRun checks that the output shows the fragmented arena, a request
// served by a stitch with nothing new committed, the stitched bytes seen
// through the arena, and the chunks back in the free space after Free.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, ""))
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
	require.Regexp(t, "lent to the stitch while it lives \\(S\\):\n  [.SU]{16}\n", s)
	lentAt := regexp.MustCompile(`lent to the stitch while it lives \(S\):\n  ([.SU]{16})\n`).FindStringSubmatch(s)[1]
	require.Equal(t, 4, strings.Count(lentAt, "S"), "four of the eight free chunks lent")
	require.Equal(t, ".U.U.U.U.U.U.U.U", strings.ReplaceAll(lentAt, "S", "."), "only free chunks lent")
	parts := regexp.MustCompile(`(?m)^  0x[0-9a-f]+: "stitched part (\d), written at 0x[0-9a-f]+" \(all 64 KiB the same: true\)$`).FindAllStringSubmatch(s, -1)
	require.Len(t, parts, 4, s)
	require.NotContains(t, s, "same: false")
	require.Contains(t, s, "Free unmaps the stitch (1 unmap event, 4 chunks) and returns the chunks to the free space:\n  .U.U.U.U.U.U.U.U\n")
	require.Contains(t, s, "Committed 1 MiB, Allocated 512 KiB, Live 8, largest free range 64 KiB.")
}

// TestPictures: with -svg the example draws the allocator's three ranges
// at each step, its output otherwise the same: sixteen chunks in the heap
// of large requests; then the four the output names mapped a second time,
// side by side, in the stitch range, each alias listed; then each mapped
// once again.
func TestPictures(t *testing.T) {
	dir := t.TempDir()
	var out, plain bytes.Buffer
	require.NoError(t, run(&out, dir))
	require.NoError(t, run(&plain, ""))
	addr := regexp.MustCompile(`0x[0-9a-f]{8,}`)
	require.Equal(t, addr.ReplaceAllString(plain.String(), "ADDR"), addr.ReplaceAllString(out.String(), "ADDR"))

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "step-01-fragmented.svg"), filepath.Join(dir, "step-02-stitched.svg"),
		filepath.Join(dir, "step-03-freed.svg")}, files)
	docs := make([]*svgtest.Doc, len(files))
	for i, f := range files {
		docs[i] = svgtest.ReadFile(t, f)
		var names []string
		for _, r := range docs[i].Texts["range"] {
			name, _, _ := strings.Cut(r, ":")
			names = append(names, name)
		}
		require.ElementsMatch(t, []string{"the heap of small requests", "the heap of large requests", "the stitch range"}, names)
	}
	// The heaps reserve Max (16 chunks) each, as does the stitch range.
	require.Equal(t, memsvg.Counts{Reserved: 48 - 16, Accessible: 16}, docs[0].Counts(t))
	require.Equal(t, memsvg.Counts{Reserved: 48 - 20, Accessible: 20}, docs[1].Counts(t))
	require.Equal(t, memsvg.Counts{Reserved: 48 - 16, Accessible: 16}, docs[2].Counts(t))
	require.Empty(t, docs[0].Aliases())
	require.Empty(t, docs[2].Aliases())
	require.True(t, docs[0].Has("note", "Allocations (U used, . free): .U.U.U.U.U.U.U.U"))
	require.Len(t, docs[1].Texts["note"], len(docs[0].Texts["note"]))
	var lentNote string
	for _, n := range docs[1].Texts["note"] {
		if rest, ok := strings.CutPrefix(n, "Allocations (U used, S lent to the stitch, . free): "); ok {
			lentNote = rest
		}
	}
	require.Equal(t, 4, strings.Count(lentNote, "S"), "the picture marks the four lent chunks")

	// The aliases are the chunks the output found at those addresses, in
	// the stitch range in the order it lists them.
	lent := regexp.MustCompile(`Its 4 chunks are the freed chunks at ((?:0x[0-9a-f]+ ?)+) \(`).FindStringSubmatch(out.String())
	require.NotNil(t, lent)
	base := addr.FindString(regexp.MustCompile(`outside \[(0x[0-9a-f]+)`).FindString(out.String()))
	aliases := docs[1].Aliases()
	require.Len(t, aliases, 4)
	for i, a := range strings.Fields(lent[1]) {
		at, err := strconv.ParseUint(a, 0, 64)
		require.NoError(t, err)
		b, err := strconv.ParseUint(base, 0, 64)
		require.NoError(t, err)
		// The ranges are listed by address, whichever comes first.
		heap, stitch := fmt.Sprintf("+%s of the heap of large requests", units.Bytes(at-b)), fmt.Sprintf("+%s of the stitch range", units.Bytes(uint64(i)*chunk))
		require.Regexp(t, `^chunk \d+ \(device 0\) mapped twice: at `, aliases[i])
		require.True(t, strings.HasSuffix(aliases[i], heap+" and "+stitch) || strings.HasSuffix(aliases[i], stitch+" and "+heap), "%q: %s, %s", aliases[i], heap, stitch)
	}
	require.Equal(t, []string{"1: the stitched Alloc(256 KiB) (+0 B)"}, docs[1].Texts["mark-list"])
}
