package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestRun checks that every checksum matched, that with the producer
// waiting on the consumer the pool reused the consumer's frees and reserved
// little, that without the wait it reused nothing and reserved a block a
// tensor, and that the high-water marks are set and TrimTo gave it all back.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)

	// row returns the two columns (waits, never waits) of a table row.
	row := func(name string) (string, string) {
		t.Helper()
		m := regexp.MustCompile(`(?m)^ *` + regexp.QuoteMeta(name) + `  +(\S+(?: \S+)*)  +(\S+(?: \S+)*)$`).FindStringSubmatch(s)
		require.NotNil(t, m, "row %q in\n%s", name, s)
		return m[1], m[2]
	}
	count := func(name string) (int, int) {
		t.Helper()
		a, b := row(name)
		x, err := strconv.Atoi(a)
		require.NoError(t, err)
		y, err := strconv.Atoi(b)
		require.NoError(t, err)
		return x, y
	}
	size := func(name string) (uint64, uint64) {
		t.Helper()
		a, b := row(name)
		x, err := units.Parse(a)
		require.NoError(t, err)
		y, err := units.Parse(b)
		require.NoError(t, err)
		return x, y
	}

	m1, m2 := row("checksums matched")
	require.Equal(t, "100 of 100", m1)
	require.Equal(t, "100 of 100", m2)
	require.Contains(t, s, "All 200 checksums matched in both runs.")

	fresh1, fresh2 := count("fresh blocks")
	reused1, reused2 := count("reused across streams")
	distinct1, distinct2 := count("distinct addresses")
	require.Equal(t, 100, fresh1+reused1)
	require.Equal(t, depth, fresh1, "one fresh block per tensor in flight")
	require.Equal(t, 100-depth, reused1)
	require.Equal(t, depth, distinct1)
	require.Equal(t, 100, fresh2, "never ordered after a free: no reuse")
	require.Zero(t, reused2)
	require.Equal(t, 100, distinct2)

	rh1, rh2 := size("ReservedMemHigh")
	uh1, uh2 := size("UsedMemHigh")
	rc1, rc2 := size("ReservedMemCurrent")
	uc1, uc2 := size("UsedMemCurrent")
	t1, t2 := size("reserved after TrimTo(0)")
	for _, h := range []uint64{rh1, rh2, uh1, uh2} {
		require.Positive(t, h)
	}
	require.Equal(t, uint64(depth*tensorBytes), uh1, "depth tensors live at once")
	require.Equal(t, uh1, uh2)
	require.GreaterOrEqual(t, rh1, uh1)
	require.LessOrEqual(t, rh1, uint64(512*units.KiB), "waiting, the pool holds a few blocks")
	require.GreaterOrEqual(t, rh2, uint64(100*tensorBytes), "not waiting, a block a tensor")
	require.LessOrEqual(t, rh2, uint64(8*units.MiB))
	require.Equal(t, rh1, rc1, "nothing released before TrimTo")
	require.Equal(t, rh2, rc2)
	require.Zero(t, uc1)
	require.Zero(t, uc2)
	require.Zero(t, t1)
	require.Zero(t, t2)
	require.Contains(t, s, "tensor i-4, the last free the producer was ordered after; 4 blocks carried all 100 tensors.")
}
