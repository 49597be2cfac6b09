package host

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
)

// fakeNodes writes a /sys/devices/system/node tree under a temporary
// directory: for each entry, a directory of that name holding a cpulist
// with the given contents (no cpulist file when the contents are "-").
func fakeNodes(t *testing.T, dirs map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, cpus := range dirs {
		require.NoError(t, os.Mkdir(filepath.Join(root, name), 0o755))
		if cpus != "-" {
			require.NoError(t, os.WriteFile(filepath.Join(root, name, "cpulist"), []byte(cpus), 0o644))
		}
	}
	return root
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"":              nil,
		"\n":            nil,
		"0\n":           {0},
		"0-3\n":         {0, 1, 2, 3},
		"0-1,8,10-11\n": {0, 1, 8, 10, 11},
	} {
		got, err := parseCPUList(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
	for _, bad := range []string{"x", "1-", "-1", "3-1", "0,,1", "0-1000000", "1 2"} {
		_, err := parseCPUList(bad)
		require.Error(t, err, "%q", bad)
	}
}

// FuzzParseCPUList: any text is a list of at most maxListed IDs, each at
// least 0, or an error; never a panic.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"", "0-3\n", "0-1,8,10-11\n", "3-1", "0-1000000", "0,,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := parseCPUList(s)
		if err != nil {
			require.Nil(t, ids)
			return
		}
		require.LessOrEqual(t, len(ids), maxListed)
		for _, id := range ids {
			require.GreaterOrEqual(t, id, 0)
		}
	})
}

func TestNUMANodes(t *testing.T) {
	t.Run("one node", func(t *testing.T) {
		nodes, err := numaNodes(fakeNodes(t, map[string]string{"node0": "0-7\n"}))
		require.NoError(t, err)
		require.Equal(t, []numaNode{{ID: 0, CPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}, nodes)
	})
	t.Run("four nodes", func(t *testing.T) {
		nodes, err := numaNodes(fakeNodes(t, map[string]string{
			"node0": "0-1\n", "node1": "2-3\n", "node2": "4-5\n", "node3": "\n", // node3: memory only, no CPUs
		}))
		require.NoError(t, err)
		require.Equal(t, []numaNode{
			{ID: 0, CPUs: []int{0, 1}}, {ID: 1, CPUs: []int{2, 3}}, {ID: 2, CPUs: []int{4, 5}}, {ID: 3},
		}, nodes)
	})
	t.Run("malformed entries are ignored", func(t *testing.T) {
		root := fakeNodes(t, map[string]string{
			"node0": "0\n", "node2": "1\n", // IDs need not be consecutive
			"node":   "0\n",  // no ID
			"nodeX":  "0\n",  // not a number
			"node01": "0\n",  // not canonical
			"node-1": "0\n",  // negative
			"node4":  "-",    // no cpulist
			"node5":  "junk", // cpulist that does not parse
			"cpu0":   "0\n",  // not a node
			"power":  "-",
		})
		require.NoError(t, os.WriteFile(filepath.Join(root, "node7"), nil, 0o644)) // a file, not a directory
		require.NoError(t, os.WriteFile(filepath.Join(root, "online"), []byte("0-7\n"), 0o644))
		nodes, err := numaNodes(root)
		require.NoError(t, err)
		require.Equal(t, []numaNode{{ID: 0, CPUs: []int{0}}, {ID: 2, CPUs: []int{1}}}, nodes)

		// has_memory, where present, leaves out nodes without memory.
		require.NoError(t, os.WriteFile(filepath.Join(root, "has_memory"), []byte("2\n"), 0o644))
		nodes, err = numaNodes(root)
		require.NoError(t, err)
		require.Equal(t, []numaNode{{ID: 2, CPUs: []int{1}}}, nodes)
	})
	t.Run("no tree", func(t *testing.T) {
		nodes, err := numaNodes(filepath.Join(t.TempDir(), "absent"))
		require.NoError(t, err)
		require.Empty(t, nodes)
	})
	t.Run("this machine", func(t *testing.T) {
		nodes, err := numaNodes(sysNodeRoot)
		require.NoError(t, err)
		t.Logf("NUMA nodes here: %+v", nodes)
	})
}

func TestNUMAPlan(t *testing.T) {
	four := fakeNodes(t, map[string]string{"node0": "0\n", "node1": "1\n", "node2": "2\n", "node3": "3\n"})
	plan, err := numaPlan(four, 6, false)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3, 0, 1}, plan, "round robin")

	sparse := fakeNodes(t, map[string]string{"node0": "0\n", "node4": "1\n"})
	plan, err = numaPlan(sparse, 3, false)
	require.NoError(t, err)
	require.Equal(t, []int{0, 4, 0}, plan, "round robin over the nodes found, not their IDs")

	one := fakeNodes(t, map[string]string{"node0": "0-3\n"})
	plan, err = numaPlan(one, 2, false)
	require.NoError(t, err)
	require.Equal(t, []int{-1, -1}, plan, "one node: nothing to choose, nothing bound")
	plan, err = numaPlan(one, 2, true)
	require.NoError(t, err)
	require.Equal(t, []int{0, 0}, plan, "one node, RequireNUMA: all bound to it")

	none := filepath.Join(t.TempDir(), "absent")
	plan, err = numaPlan(none, 2, false)
	require.NoError(t, err)
	require.Equal(t, []int{-1, -1}, plan)
	_, err = numaPlan(none, 2, true)
	require.True(t, errors.Is(err, driver.ErrUnsupported), "%v", err)
	require.ErrorContains(t, err, "RequireNUMA")
}

// memPolicy returns the memory policy of the page at p and the nodes it
// names (get_mempolicy with MPOL_F_ADDR: for a shmem mapping, the policy
// the file holds for that offset).
func memPolicy(t *testing.T, p unsafe.Pointer) (mode int, nodes []int) {
	t.Helper()
	const mpolFAddr = 1 << 1
	var mask [16]uint64 // 1024 nodes
	_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&mode)),
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64), uintptr(p), mpolFAddr, 0)
	require.Zero(t, errno, "get_mempolicy: %v", errno)
	for i := range len(mask) * 64 {
		if mask[i/64]&(1<<(i%64)) != 0 {
			nodes = append(nodes, i)
		}
	}
	return mode, nodes
}

// TestNUMAThisMachine: on this machine's own tree, New works with its
// defaults; with one node nothing is bound and every device reports -1.
func TestNUMAThisMachine(t *testing.T) {
	nodes, err := numaNodes(sysNodeRoot)
	require.NoError(t, err)
	d := newTest(t, Options{Devices: 4, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	for i, dev := range d.Devices() {
		switch len(nodes) {
		case 0, 1:
			require.Equal(t, -1, dev.NUMANode, "device %d", i)
		default:
			require.Equal(t, nodes[i%len(nodes)].ID, dev.NUMANode, "device %d", i)
		}
	}
}

// TestNUMABinding binds for real on whatever nodes this machine has
// (RequireNUMA binds even with one node) and reads the policy back from a
// mapped chunk of the heap and from a shareable chunk: MPOL_BIND to the
// device's node, kept across a punch-hole and a new commit.
func TestNUMABinding(t *testing.T) {
	nodes, err := numaNodes(sysNodeRoot)
	require.NoError(t, err)
	if len(nodes) == 0 {
		t.Skip("no NUMA nodes listed under " + sysNodeRoot)
	}
	d := newTest(t, Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB, RequireNUMA: true})
	g := d.Granularity()
	base, err := d.Reserve(8*g, 0, 0)
	require.NoError(t, err)
	for i, dev := range d.Devices() {
		want := nodes[i%len(nodes)].ID
		require.Equal(t, want, dev.NUMANode, "device %d", i)
		for _, shareable := range []bool{false, true} {
			for round := 0; round < 2; round++ { // the second commit reuses the heap range punched out
				h, err := d.Create(dev.ID, 2*g, driver.ChunkOptions{Shareable: shareable})
				require.NoError(t, err)
				require.NoError(t, d.Map(base, h))
				require.NoError(t, d.SetAccess(base, 2*g, 0, driver.AccessReadWrite))
				require.NoError(t, d.Write(base+driver.Addr(g), []byte{1}))
				b, err := d.HostBytes(base, 2*g)
				require.NoError(t, err)
				mode, bound := memPolicy(t, unsafe.Pointer(&b[g]))
				require.Equal(t, mpolBind, mode, "device %d shareable=%v", i, shareable)
				require.Equal(t, []int{want}, bound, "device %d shareable=%v", i, shareable)
				require.NoError(t, d.Unmap(base, 2*g))
				require.NoError(t, d.Release(h))
			}
		}
	}
}

// TestNUMAFakeTree runs New on a tree naming nodes this machine may not
// have: devices on real nodes with memory are bound and report them; the
// rest report -1, or fail New with RequireNUMA, leaving nothing open.
func TestNUMAFakeTree(t *testing.T) {
	root := fakeNodes(t, map[string]string{"node0": "0\n", "node1": "1\n", "node2": "2\n", "node3": "3\n"})
	var real []int
	if b, err := os.ReadFile(filepath.Join(sysNodeRoot, "has_memory")); err == nil {
		real, err = parseCPUList(string(b))
		require.NoError(t, err)
	}
	d := newTest(t, Options{Devices: 5, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB, numaRoot: root})
	for i, dev := range d.Devices() {
		want := -1
		if node := i % 4; slices.Contains(real, node) {
			want = node
		}
		require.Equal(t, want, dev.NUMANode, "device %d", i)
	}
	if slices.Contains(real, 1) && slices.Contains(real, 2) && slices.Contains(real, 3) {
		t.Skip("this machine has nodes 0 to 3: every device binds")
	}

	opts := Options{Devices: 4, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB, numaRoot: root, RequireNUMA: true}
	before, after, same, err := leakcheck.Compare(3, func() {
		_, err := New(opts)
		require.True(t, errors.Is(err, driver.ErrUnsupported), "%v", err)
		require.Regexp(t, `binding device \d's heap \(Options.RequireNUMA\).*mbind\(MPOL_BIND\) to NUMA node \d`, err.Error())
	})
	require.NoError(t, err)
	require.True(t, same, "a failed New leaves no heap open: %v before, %v after", before, after)
}
