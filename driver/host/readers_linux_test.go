package host

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestReadersAreBounded: every file of the kernel's the driver reads is
// read up to a bound: a meminfo, /proc/self/cgroup, limit, usage, stat or
// cpulist file that never ends (/dev/zero) or holds more than the bound is
// refused (meminfo: an error marked ErrInvalid naming the bound; the
// others count as unreadable, as a missing file does), never read whole.
func TestReadersAreBounded(t *testing.T) {
	_, err := readMeminfo("/dev/zero")
	drivertest.RequireIs(t, err, driver.ErrInvalid, "/dev/zero holds more than the 65536 bytes")
	big := filepath.Join(t.TempDir(), "meminfo")
	line := "MemTotal:       16318576 kB\nMemAvailable:    9000000 kB\n"
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat(line, maxMeminfoBytes/len(line)+1)), 0o600))
	_, err = readMeminfo(big)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "more than the 65536 bytes")
	require.NoError(t, os.WriteFile(big, []byte(line), 0o600))
	m, err := readMeminfo(big)
	require.NoError(t, err)
	require.Equal(t, uint64(16318576*units.KiB), m.memTotal)

	require.Nil(t, findCgroupMemory("/dev/zero", t.TempDir()))
	_, ok := readCgroupLimit("/dev/zero")
	require.False(t, ok)
	cg := &cgroupMemory{limit: 1 << 30, usage: "/dev/zero", stat: "/dev/zero", inactive: "inactive_file"}
	require.Equal(t, uint64(1<<30), cg.free(), "an unreadable usage leaves the whole limit free")
	require.Zero(t, cg.inactiveFile())
	root := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(root, "node0"), 0o700))
	require.NoError(t, os.Symlink("/dev/zero", filepath.Join(root, "node0", "cpulist")))
	nodes, err := numaNodes(root)
	require.NoError(t, err)
	require.Empty(t, nodes, "a node whose cpulist cannot be read is skipped")
}

// FuzzMeminfo: any text is read as a meminfo file without a panic; what
// is read is each figure's kB times 1024, with MemTotal and MemAvailable
// present, and no figure wraps.
func FuzzMeminfo(f *testing.F) {
	for _, s := range []string{
		"MemTotal:       16318576 kB\nMemFree: 1 kB\nMemAvailable:    9000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
		"MemTotal: 18014398509481983 kB\nMemAvailable: 1\n", "MemTotal: 18014398509481984 kB\n",
		"MemTotal:\nMemAvailable: x kB\n", "", "\n\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		m, err := parseMeminfo("fuzz", text)
		if err != nil {
			require.Equal(t, meminfoFigures{}, m)
			return
		}
		s := string(text)
		require.Contains(t, s, "MemTotal:")
		require.Contains(t, s, "MemAvailable:")
		for _, v := range []uint64{m.memTotal, m.memAvailable, m.swapTotal, m.swapFree} {
			require.Zero(t, v%units.KiB, "figures are whole kB")
		}
	})
}

// FuzzCgroupLimit: a limit or usage file's text is a number, "max" (no
// limit) or unreadable, never a panic.
func FuzzCgroupLimit(f *testing.F) {
	for _, s := range []string{"max\n", "1073741824\n", "18446744073709551616", "-1", " 12 ", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, ok := parseCgroupLimit(b)
		if !ok {
			return
		}
		if strings.TrimSpace(string(b)) == "max" {
			require.Equal(t, uint64(math.MaxUint64), n)
		}
	})
}

// FuzzProcCgroup: any /proc/self/cgroup text yields at most one memory
// cgroup per line, each a v2 line ("0::path") or one whose controllers
// name memory, never a panic.
func FuzzProcCgroup(f *testing.F) {
	for _, s := range []string{
		"0::/user.slice/user-1000.slice/session-2.scope\n",
		"12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n0::/\n",
		"::", "0::", "1:memory,cpu:", "x:y", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		es := parseProcCgroup(text)
		require.LessOrEqual(t, len(es), strings.Count(string(text), "\n")+1)
		for _, e := range es {
			require.Contains(t, string(text), ":"+e.path)
		}
	})
}
