package main

import (
	"fmt"
	"os"
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

// demoSteps cuts the demo's output into its numbered steps (index 0 is
// step 1).
func demoSteps(t *testing.T, out string) []string {
	t.Helper()
	at := regexp.MustCompile(`(?m)^\d+\. `).FindAllStringIndex(out, -1)
	var steps []string
	for i, a := range at {
		end := len(out)
		if i+1 < len(at) {
			end = at[i+1][0]
		}
		steps = append(steps, out[a[0]:end])
	}
	return steps
}

// mapRow is a row of the memory map the demo prints: offset, size, state.
var mapRow = regexp.MustCompile(`(?m)^   0x[0-9a-f]+ +(\d+ [KMGT]?i?B) +(reserved|mapped|accessible) `)

// printedCounts are the granules of each state in the memory map a step
// printed, and whether it printed one.
func printedCounts(t *testing.T, step string) (memsvg.Counts, bool) {
	t.Helper()
	var c memsvg.Counts
	rows := mapRow.FindAllStringSubmatch(step, -1)
	for _, r := range rows {
		size, err := units.Parse(r[1])
		require.NoError(t, err)
		n := size / (2 * units.MiB)
		switch r[2] {
		case "reserved":
			c.Reserved += n
		case "mapped":
			c.Mapped += n
		default:
			c.Accessible += n
		}
	}
	return c, len(rows) > 0
}

// committed reads a figure of committed memory from a step's output
// (pattern's one group is a size) as granules.
func committed(t *testing.T, step, pattern string) uint64 {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(step)
	require.NotNil(t, m, "%s in:\n%s", pattern, step)
	size, err := units.Parse(m[1])
	require.NoError(t, err)
	return size / (2 * units.MiB)
}

// TestDemoSVG runs the demo with --svg as a user would and looks at every
// picture: one for each of the 14 steps, each a well-formed SVG titled
// with its step, whose caption counts what the demo printed at that step
// — the memory map where it printed one, the committed memory of the
// arenas' steps — with the alias of step 5 and the stitch of step 13
// outlined and listed. The demo's own output is what it is without --svg.
func TestDemoSVG(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pictures") // made by the demo
	code, out, errOut := runCmd(t, "demo", "--svg", dir)
	require.Equal(t, 0, code, errOut)
	steps := demoSteps(t, out)
	require.Len(t, steps, 14)

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Len(t, files, 14, "one picture a step: %v", files)
	docs := make([]*svgtest.Doc, 14)
	for i := range docs {
		m, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("step-%02d-*.svg", i+1)))
		require.NoError(t, err)
		require.Len(t, m, 1, "step %d", i+1)
		require.Regexp(t, `^step-\d\d-[a-z]+(-[a-z]+)*\.svg$`, filepath.Base(m[0]))
		docs[i] = svgtest.ReadFile(t, m[0])
		title, _, _ := strings.Cut(strings.TrimSpace(steps[i]), "\n")
		num, text, _ := strings.Cut(title, ". ")
		require.Equal(t, "Step "+num+". "+text, docs[i].Title)
	}
	count := func(step int) memsvg.Counts { return docs[step-1].Counts(t) }

	// The core's steps: the reservation of 64 GiB, 32768 granules.
	last := memsvg.Counts{}
	for step := 1; step <= 9; step++ {
		want, printed := printedCounts(t, steps[step-1])
		if !printed {
			want = last // the map is the last step's
		}
		require.Equal(t, want, count(step), "step %d:\n%s", step, steps[step-1])
		require.Equal(t, uint64(32768), want.Total())
		last = want
	}
	require.Equal(t, memsvg.Counts{Reserved: 32765, Accessible: 3}, count(3))
	require.Equal(t, []string{"chunk 1 (device 0) mapped twice: at +0 B and +32 GiB"}, docs[4].Aliases())
	require.Equal(t, docs[4].Aliases(), docs[7].Aliases(), "step 8 still maps chunk 1 twice")
	require.True(t, docs[7].Has("note", "Chunk 1's handle is released (dashed)"))
	require.Contains(t, docs[7].Swatches, "dashed: the chunk's handle is released; its memory stays while it is mapped")
	require.Empty(t, docs[8].Aliases(), "step 9 unmapped both")
	require.Equal(t, []string{"No reservation is live: nothing to draw."}, docs[9].Texts["empty"])
	require.Equal(t, memsvg.Counts{}, count(10))

	// The arenas' steps: what is committed is what is accessible.
	grown := committed(t, steps[10], `(?m)^   20 MiB +\S+ \S+ +(\d+ \S+) `)
	require.Equal(t, memsvg.Counts{Reserved: 8192 - grown, Accessible: grown}, count(11), "the arena's 16 GiB")
	require.Equal(t, committed(t, steps[11], `trim: committed \d+ \S+ -> (\d+ \S+),`), count(12).Accessible)
	stitched, err := strconv.Atoi(regexp.MustCompile(`by mapping (\d+) scattered free chunks`).FindStringSubmatch(steps[12])[1])
	require.NoError(t, err)
	require.Equal(t, committed(t, steps[12], `committed before \d+ \S+, after (\d+ \S+);`)+uint64(stitched), count(13).Accessible,
		"the heap's chunks, and those stitched counted again")
	require.Len(t, docs[12].Aliases(), stitched, "each stitched chunk is mapped twice")
	for _, a := range docs[12].Aliases() {
		require.Regexp(t, `^chunk \d+ \(device 0\) mapped twice: at \+\d+ \S+ of the allocator's stitch range and \+\d+ \S+ of the allocator's heap of large requests$`, a)
	}
	require.Equal(t, memsvg.Counts{Accessible: 4}, count(14), "8 MiB striped")
	byFill := docs[13].CellsByFill()
	require.Equal(t, 3, byFill[memsvg.Fill(memsvg.Accessible, 0)], "6 MiB on device 0 after the migration")
	require.Equal(t, 1, byFill[memsvg.Fill(memsvg.Accessible, 1)], "2 MiB on device 1")

	// Without --svg, the same output but for the addresses.
	code, plain, errOut := runCmd(t, "demo")
	require.Equal(t, 0, code, errOut)
	addr := regexp.MustCompile(`0x[0-9a-f]{8,}`)
	require.Equal(t, addr.ReplaceAllString(plain, "ADDR"), addr.ReplaceAllString(out, "ADDR"))
}

// TestDemoSVGFlags: --svg without a directory is a usage error; a
// directory that cannot be made is a clear error before the demo runs.
func TestDemoSVGFlags(t *testing.T) {
	code, out, errOut := runCmd(t, "demo", "--svg", "")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, "vmarena demo: --svg needs a directory\nrun 'vmarena demo --help' for usage\n", errOut)

	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, out, errOut = runCmd(t, "demo", "--svg", filepath.Join(file, "pictures"))
	require.Equal(t, 1, code)
	require.Empty(t, out, "nothing ran")
	require.Regexp(t, `^vmarena demo: the picture directory .*/a-file/pictures: cannot make it: mkdir .*: not a directory\n$`, errOut)

	code, out, _ = runCmd(t, "demo", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "[--svg DIR]")
	require.Contains(t, out, "-svg DIR")
}

// TestDemoSVGSim: on the sim driver, which keeps the books only, every
// step is drawn all the same, the stitch's aliases included.
func TestDemoSVGSim(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := runCmd(t, "demo", "--driver", "sim", "--svg", dir)
	require.Equal(t, 0, code, errOut)
	files, err := filepath.Glob(filepath.Join(dir, "step-*.svg"))
	require.NoError(t, err)
	require.Len(t, files, 14)
	for _, f := range files {
		svgtest.ReadFile(t, f)
	}
	require.Len(t, svgtest.ReadFile(t, files[12]).Aliases(), 3, "the stitch maps three chunks twice")
}
