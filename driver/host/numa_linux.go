package host

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// sysNodeRoot is where Linux lists the machine's NUMA nodes.
const sysNodeRoot = "/sys/devices/system/node"

// maxCPUListBytes bounds a cpulist or has_memory file: sysfs writes at
// most a page (4 KiB) per attribute.
const maxCPUListBytes = 64 << 10

// numaNode is one NUMA node as sysfs lists it: root/node<ID>, whose cpulist
// names its CPUs (none for a node of memory only).
type numaNode struct {
	ID   int
	CPUs []int
}

// numaNodes lists the NUMA nodes under root, a /sys/devices/system/node
// tree, in ID order. A node is a directory node<N> (N in decimal, no
// leading zeros) with a cpulist that parses; anything else is skipped.
// When root has a has_memory list (sysfs does), nodes not on it are
// skipped too: memory cannot be bound to a node that has none. A root that
// does not exist (a kernel built without NUMA) has no nodes.
func numaNodes(root string) ([]numaNode, error) {
	es, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errors.Wrap(err, "host: listing NUMA nodes")
	}
	var withMemory []int
	if b, err := readBounded(filepath.Join(root, "has_memory"), maxCPUListBytes); err == nil {
		if withMemory, err = parseCPUList(string(b)); err != nil {
			withMemory = nil // unreadable: do not filter
		}
	}
	var nodes []numaNode
	for _, e := range es {
		rest, ok := strings.CutPrefix(e.Name(), "node")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(rest)
		if err != nil || id < 0 || strconv.Itoa(id) != rest {
			continue
		}
		if withMemory != nil && !slices.Contains(withMemory, id) {
			continue
		}
		b, err := readBounded(filepath.Join(root, e.Name(), "cpulist"), maxCPUListBytes)
		if err != nil {
			continue
		}
		cpus, err := parseCPUList(string(b))
		if err != nil {
			continue
		}
		nodes = append(nodes, numaNode{ID: id, CPUs: cpus})
	}
	slices.SortFunc(nodes, func(a, b numaNode) int { return a.ID - b.ID })
	return nodes, nil
}

// maxListed bounds a list in the kernel's list format, so a malformed file
// cannot make us build a huge slice.
const maxListed = 1 << 16

// parseCPUList parses the kernel's list format ("0-3,8,10-11"; empty for
// none), as cpulist and has_memory hold it.
func parseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var ids []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, errors.Newf("host: %q is not a list of IDs", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, errors.Newf("host: %q is not a list of IDs", s)
			}
		}
		if b-a >= maxListed || len(ids)+b-a >= maxListed {
			return nil, errors.Newf("host: %q lists more than %d IDs", s, maxListed)
		}
		for id := a; id <= b; id++ {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// numaPlan returns the node each of the n devices is to be bound to, -1
// for none. With several nodes, device i goes to the i%len(nodes)-th node
// in ID order (round robin). With one node binding is skipped (all memory
// is there anyway), unless require is set: then every device is bound to
// it, so NUMANode reports a node. With no nodes found, or a tree that
// cannot be read, nothing is bound; require makes that an error.
func numaPlan(root string, n int, require bool) ([]int, error) {
	if root == "" {
		root = sysNodeRoot
	}
	plan := make([]int, n)
	for i := range plan {
		plan[i] = -1
	}
	nodes, err := numaNodes(root)
	if err != nil || len(nodes) == 0 {
		if !require {
			return plan, nil
		}
		if err == nil {
			err = errors.Newf("host: no NUMA node with memory under %s", root)
		}
		return nil, sentinel.Mark(errors.Wrap(err, "host: Options.RequireNUMA"), driver.ErrUnsupported)
	}
	if len(nodes) == 1 && !require {
		return plan, nil
	}
	for i := range plan {
		plan[i] = nodes[i%len(nodes)].ID
	}
	return plan, nil
}

// mpolBind is MPOL_BIND (linux/mempolicy.h): allocate only on the nodes
// named; fail rather than fall back to others.
const mpolBind = 2

// bindWindow is the most address space bindFile maps at once.
const bindWindow = units.TiB

// bindFile binds the pages of [0, size) of a shmem file (a memfd) to node
// with MPOL_BIND. shmem keeps a shared policy on the file itself, by
// offset, and allocates every page of the file under it — fallocate
// included, and again after a punch-hole — so one mbind when the file is
// created covers every later commit. mbind needs an address, so the file
// is mapped PROT_NONE a window at a time (at most 1 TiB of address space
// at once: a heap's offset space may be 64 TiB), bound, and unmapped; no
// page is touched.
func bindFile(fd int, size uint64, node int) error {
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	for off := uint64(0); off < size; off += bindWindow {
		n := min(size-off, bindWindow)
		p, err := unix.MmapPtr(fd, int64(off), nil, uintptr(n), unix.PROT_NONE, unix.MAP_SHARED)
		if err != nil {
			return errors.Wrapf(err, "host: mmap of a window to bind to NUMA node %d", node)
		}
		// maxnode counts one more than the bits the kernel reads.
		_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(p), uintptr(n), mpolBind,
			uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), 0)
		if err := unix.MunmapPtr(p, uintptr(n)); err != nil {
			return errors.Wrap(err, "host: munmap of a window bound to a NUMA node")
		}
		if errno != 0 {
			return sentinel.Mark(errors.Wrapf(errno, "host: mbind(MPOL_BIND) to NUMA node %d", node), driver.ErrUnsupported)
		}
	}
	return nil
}
