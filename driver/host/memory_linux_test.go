package host

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// fakeMachine returns Options that read the machine's memory from a
// meminfo file holding text, in no cgroup: the figures of a test's own.
func fakeMachine(t testing.TB, text string) Options {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return Options{meminfo: path, procCgroup: filepath.Join(dir, "no-cgroup")}
}

// writeFiles writes each file (a path under root) with its content.
func writeFiles(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		path := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	}
}

// TestCapacityBeyondTheMachine: New refuses capacities that together
// exceed MemTotal + SwapTotal, naming the figure (1 PiB is refused), so
// that no Create the machine cannot back is ended by the kernel's OOM
// killer. The real machine is
// asked only for its MemTotal, a figure that does not move.
func TestCapacityBeyondTheMachine(t *testing.T) {
	_, err := New(Options{Capacity: 1024 * units.TiB})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "1024 TiB is more than this machine can back", "MemTotal")

	opts := fakeMachine(t, "MemTotal: 1048576 kB\nMemAvailable: 1048576 kB\nSwapTotal: 524288 kB\nSwapFree: 0 kB\n")
	opts.Granularity = 64 * units.KiB
	for _, c := range []struct {
		devices  int
		capacity uint64
		ok       bool
	}{
		{1, 1536 * units.MiB, true}, // MemTotal + SwapTotal
		{1, 1536*units.MiB + 64*units.KiB, false},
		{3, 512 * units.MiB, true},
		{4, 512 * units.MiB, false},
		{2, 1 << 63, false}, // the product overflows
	} {
		o := opts
		o.Devices, o.Capacity = c.devices, c.capacity
		d, err := New(o)
		if c.ok {
			require.NoError(t, err, "%d devices of %s", c.devices, units.Bytes(c.capacity))
			require.NoError(t, d.Close())
			continue
		}
		drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "more than this machine can back: 1536 MiB (MemTotal 1 GiB + SwapTotal 512 MiB)")
	}
}

// TestCreateBeyondAvailable: a chunk larger than the memory
// available now (MemAvailable + SwapFree, from the test's own meminfo) is
// refused at Create with ErrOutOfMemory instead of being committed into
// the OOM killer, and changes nothing; one that fits is committed. A
// pinned host buffer (HostAlloc, populated at once) is checked the same
// way.
func TestCreateBeyondAvailable(t *testing.T) {
	opts := fakeMachine(t, "MemTotal: 1048576 kB\nMemAvailable: 6144 kB\nSwapTotal: 0 kB\nSwapFree: 2048 kB\n")
	opts.Devices, opts.Capacity, opts.Granularity = 2, 64*units.MiB, 64*units.KiB
	d := newTest(t, opts)
	h, err := d.Create(0, 8*units.MiB, driver.ChunkOptions{})
	require.NoError(t, err, "MemAvailable + SwapFree is 8 MiB")
	heap, err := d.HeapBytes(1)
	require.NoError(t, err)
	for _, shareable := range []bool{false, true} {
		_, err := d.Create(1, 8*units.MiB+64*units.KiB, driver.ChunkOptions{Shareable: shareable})
		drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "the machine has 8 MiB available (MemAvailable 6 MiB + SwapFree 2 MiB), 8256 KiB asked")
		require.Zero(t, d.Used(1))
		after, err := d.HeapBytes(1)
		require.NoError(t, err)
		require.Equal(t, heap, after)
		require.NoError(t, d.Check())
	}
	_, err = d.HostAlloc(8*units.MiB + 4096)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "host alloc of 8196 KiB", "the machine has 8 MiB available")
	require.NoError(t, d.Release(h))
	b, err := d.HostAlloc(64 * units.KiB)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(b))
	require.NoError(t, d.Close(), "no host buffer left live")
}

// TestCgroupLimit: in a cgroup with a memory limit (v2 here, a tree of the
// test's own), New refuses capacities above the limit and Create chunks
// above what the cgroup has free, counting its inactive file cache as
// free; the lowest limit among the cgroup and its ancestors binds.
func TestCgroupLimit(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"self-cgroup":                  "0::/a/b\n",
		"fs/a/memory.max":              "67108864\n", // 64 MiB
		"fs/a/memory.current":          "62914560\n", // 60 MiB
		"fs/a/memory.stat":             "anon 1\ninactive_file 0\n",
		"fs/a/b/memory.max":            "max\n",
		"fs/a/b/memory.current":        "0\n",
		"fs/memory.max":                "1073741824\n", // the mount's root: a limit that does not bind
		"fs/a/b/unrelated/memory.max":  "1\n",
		"fs/a/b/unrelated/memory.stat": "\n",
	})
	opts := fakeMachine(t, "MemTotal: 1048576 kB\nMemAvailable: 1048576 kB\n")
	opts.procCgroup, opts.cgroupRoot = filepath.Join(root, "self-cgroup"), filepath.Join(root, "fs")
	opts.Granularity = 64 * units.KiB

	o := opts
	o.Capacity = 128 * units.MiB
	_, err := New(o)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "128 MiB is more than this machine can back: 64 MiB (the memory limit of cgroup "+filepath.Join(root, "fs", "a")+")")

	o = opts // default capacity: half of the cgroup's 4 MiB free
	d := newTest(t, o)
	require.Equal(t, 2*units.MiB, d.Devices()[0].Capacity)

	o.Capacity = 32 * units.MiB
	d = newTest(t, o)
	_, err = d.Create(0, 8*units.MiB, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "has 4 MiB free under its memory limit of 64 MiB, 8 MiB asked")
	require.Zero(t, d.Used(0))
	writeFiles(t, root, map[string]string{"fs/a/memory.stat": "anon 1\ninactive_file 4194304\n"})
	h, err := d.Create(0, 8*units.MiB, driver.ChunkOptions{})
	require.NoError(t, err, "4 MiB free and 4 MiB of inactive file cache")
	require.NoError(t, d.Release(h))
}

// TestFindCgroupMemory: the cgroup whose limit binds, v2 or v1, or none;
// a cgroup path that is not under the mount (another namespace's) starts
// at the mount's root.
func TestFindCgroupMemory(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"v1":                                  "9:pids:/\n4:cpu,memory:/x/y\n0::/\n",
		"v1-unlimited":                        "4:memory:/u\n",
		"v2-elsewhere":                        "0::/not/here\n",
		"none":                                "0::/\n",
		"fs/memory/x/memory.limit_in_bytes":   "1048576\n",
		"fs/memory/x/y/memory.limit_in_bytes": "9223372036854771712\n",
		"fs/memory/u/memory.limit_in_bytes":   "9223372036854771712\n",
		"fs/memory.max":                       "2097152\n",
	})
	fs := filepath.Join(root, "fs")
	cg := findCgroupMemory(filepath.Join(root, "v1"), fs)
	require.NotNil(t, cg)
	require.Equal(t, filepath.Join(fs, "memory", "x"), cg.dir)
	require.Equal(t, uint64(1<<20), cg.limit)
	require.Equal(t, filepath.Join(fs, "memory", "x", "memory.usage_in_bytes"), cg.usage)
	require.Equal(t, "total_inactive_file", cg.inactive)
	require.Nil(t, findCgroupMemory(filepath.Join(root, "v1-unlimited"), fs), "v1's no limit")
	cg = findCgroupMemory(filepath.Join(root, "v2-elsewhere"), fs)
	require.NotNil(t, cg)
	require.Equal(t, fs, cg.dir, "a path of another namespace: the mount's root")
	require.Nil(t, findCgroupMemory(filepath.Join(root, "missing"), fs))
	cg = findCgroupMemory(filepath.Join(root, "none"), filepath.Join(root, "empty"))
	require.Nil(t, cg)
}
