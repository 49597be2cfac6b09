package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemo runs the demo as a user would and checks that each step shows
// what it claims: the aliased bytes, every refusal, and memory returned.
func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"demo"}, &out, &errOut), errOut.String())
	s := out.String()
	flat := strings.Join(strings.Fields(s), " ") // table columns are padded
	for _, want := range []string{
		"0x0 64 GiB reserved",
		"0x0 2 MiB accessible 0 1 +0x0 dev0:read-write dev1:read",
		`device 1 reads it back: "hello from device 0"`,
		`Device 1 reads "hello from device 0" through the alias`,
		"0x800000000 2 MiB accessible 0 1 +0x0 dev1:read",
		"overlaps an existing mapping",
		"not a whole mapping",
		"is not mapped: not mapped",
		"out of memory",
		"in use",
		"device 0 has no access at",
		"device 0: 0 B used (peak 4 MiB) of 64 MiB; device 1: 0 B used (peak 2 MiB) of 64 MiB",
		"20 MiB 24 MiB 24 MiB",
		"shrink to 1 MiB and trim: committed 2 MiB",
		"the largest free range is 2 MiB",
		"trim: committed 12 MiB -> 6 MiB, 6 MiB given back in 2 unmap events from between live allocations",
		"where the 2nd and 3rd were (same address: true), committed 10 MiB again",
		"by mapping 3 scattered free chunks side by side (1 map event)",
		"committed before 16 MiB, after 16 MiB; stitches 1; commits 8 -> 8",
		"8 MiB at 0x",
		"striped over devices 0 and 1 a chunk at a time",
		"offset size device 0x0 2 MiB 0 0x200000 2 MiB 1 0x400000 2 MiB 0 0x600000 2 MiB 1 migrate the first half",
		`offset 0x200000 still reads "written before the move" offset size device 0x0 6 MiB 0 0x600000 2 MiB 1`,
	} {
		require.Contains(t, flat, want)
	}
	m := regexp.MustCompile(`8 MiB at (0x[0-9a-f]+) striped(?s:.*)the base is still (0x[0-9a-f]+) `).FindStringSubmatch(s)
	require.NotNil(t, m, s)
	require.Equal(t, m[1], m[2], "the multidev arena's base before and after the migration")
	require.NotContains(t, s, "expected a refusal")
	require.Len(t, regexp.MustCompile(`(?m)^\d+\. `).FindAllString(s, -1), 14, "fourteen numbered steps:\n%s", s)
}
