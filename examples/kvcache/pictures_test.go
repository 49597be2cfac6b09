package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
)

// budgetSnapshot is a budget change and the memory map line printed after
// it: the budget, and the MiB committed.
var budgetSnapshot = regexp.MustCompile(`-- budget (\d+ \S+) \(.*\n *\d+ +\d+ +\d+ +\d+ +\d+  .*  +([\d.]+) MiB +[\d.]+ MiB\n`)

// chunkOf is the chunk a one-granule cell's tooltip names.
var chunkOf = regexp.MustCompile(`, chunk (\d+) on device 0,`)

// TestPictures serves a few requests with -svg and looks at the pictures:
// the first step, then one after each change of the budget, which counts
// as many distinct chunks (a page each) as the memory map printed then
// says are committed, the slots marked; the last holds one unit (mapped
// twice: in the prefix store, and kept in the slot that borrowed it).
func TestPictures(t *testing.T) {
	if race.Enabled {
		t.Skip("a long computation; run without -race")
	}
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, run(&out, config{requests: 4, scale: 64, svg: dir}))
	s := out.String()

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "step-01-first-step.svg"), files[0], "%v", files)
	svgtest.ReadFile(t, files[0])
	budgets := budgetSnapshot.FindAllStringSubmatch(s, -1)
	require.Len(t, budgets, 3, s)
	var pics []string
	for _, f := range files[1:] {
		if m, _ := filepath.Match("step-*-budget-*.svg", filepath.Base(f)); m {
			pics = append(pics, f)
		}
	}
	require.Len(t, pics, len(budgets), "a picture after each budget change: %v", files)
	for i, b := range budgets {
		d := svgtest.ReadFile(t, pics[i])
		require.Regexp(t, `^Step \d+: budget `+b[1]+` \(`, d.Title)
		chunks := map[string]bool{}
		for _, c := range d.Cells {
			if m := chunkOf.FindStringSubmatch(c.Tooltip); m != nil {
				chunks[m[1]] = true
			}
		}
		mib, err := strconv.ParseFloat(b[2], 64)
		require.NoError(t, err)
		require.Equal(t, b[2], fmt.Sprintf("%.1f", float64(len(chunks))*float64(page)/float64(units.MiB)),
			"%s: %d chunks of a page, %v MiB committed", pics[i], len(chunks), mib)
		c := d.Counts(t)
		t.Logf("%s: %d chunks, %s MiB committed, %+v", filepath.Base(pics[i]), len(chunks), b[2], c)
		require.GreaterOrEqual(t, c.Accessible, uint64(len(chunks)), "every chunk mapped once at least (a published page twice)")
		require.Zero(t, c.Mapped, "the cache grants access as it maps")
		require.True(t, d.Has("range", "the slots: 32 MiB at "), "8 slots of 4 MiB")
		require.True(t, d.Has("mark-list", "8: slot 7 (+28 MiB)"), "the slots are marked")
	}
	last := svgtest.ReadFile(t, pics[len(pics)-1])
	require.Equal(t, uint64(2*unit/page), last.Counts(t).Accessible,
		"one unit left at the end: mapped in the prefix store, and kept mapped in the slot its last sequence left")
}
