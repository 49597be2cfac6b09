package host

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// What the machine can back. A chunk's memory is shmem (memfd pages):
// fallocate commits it page by page, and the kernel's overcommit check
// sees one page at a time, so a commit larger than the memory left does
// not fail — the kernel reclaims, then its OOM killer ends a process (this
// one, or another) to find the pages. The driver keeps that from
// happening in two places:
//
//   - New refuses devices whose capacities together exceed what the
//     machine could ever hold for them: MemTotal + SwapTotal, or the memory
//     limit of the process's cgroup when that is lower (swap is not counted
//     there). Those figures do not move while the machine runs.
//   - Create refuses (ErrOutOfMemory) a chunk larger than the memory
//     available now: MemAvailable + SwapFree, and in a limited cgroup the
//     limit less what the cgroup uses (its inactive file cache counted as
//     free, as the kernel reclaims it first). The figure is read just before
//     the commit; memory other processes take between the reading and the
//     commit can still bring the OOM killer, which no check made here can
//     rule out.
//
// Reading /proc/meminfo costs about 11 µs; sysinfo(2) about 0.2 µs, and
// when its free RAM and swap cover the chunk with a margin (totalram/16,
// above the kernel's reserves) that answer is enough.

// machine is the memory of the machine, as the driver checks it.
type machine struct {
	meminfo string // the meminfo file: /proc/meminfo unless a test's
	// fast lets sysinfo(2) answer first: only when meminfo is the
	// kernel's, whose figures sysinfo reports too.
	fast bool
	// limit is the most the devices may hold together; limitWhy says where
	// it comes from, for messages.
	limit    uint64
	limitWhy string
	// cg is the cgroup whose memory limit binds (the lowest of the
	// process's cgroup and its ancestors), nil when none is limited.
	cg *cgroupMemory
}

// cgroupMemory is one memory cgroup's limit and the files its usage is
// read from.
type cgroupMemory struct {
	dir   string
	limit uint64
	usage string // memory.current (v2) or memory.usage_in_bytes (v1)
	stat  string // memory.stat
	// inactive is memory.stat's key for the inactive file cache.
	inactive string
}

// meminfoFigures are the lines of /proc/meminfo the driver reads, in bytes.
type meminfoFigures struct {
	memTotal, memAvailable, swapTotal, swapFree uint64
}

// The bounds on what the driver reads of the kernel's files (a test's
// stand-ins included), far above what a kernel writes: /proc/meminfo is
// about 60 lines of under 40 bytes; /proc/self/cgroup a line per
// hierarchy (13 in cgroup v1), each a path of at most PATH_MAX (4 KiB);
// memory.stat about 50 lines; a limit or usage file one number of at most
// 20 digits and a newline.
const (
	maxMeminfoBytes     = 64 << 10
	maxProcCgroupBytes  = 64 << 10
	maxCgroupStatBytes  = 64 << 10
	maxCgroupLimitBytes = 64
)

// readBounded reads the whole of path, refusing one of more than most
// bytes: procfs and sysfs files say size 0, so the bound is on what is
// read, not on a stat (a test's /dev/zero would never end).
func readBounded(path string, most int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > most {
		return nil, errors.Wrapf(driver.ErrInvalid, "host: %s holds more than the %d bytes it may have", path, most)
	}
	return b, nil
}

// readMeminfo reads path (/proc/meminfo when empty). A figure missing from
// the file is 0; MemTotal missing is an error.
func readMeminfo(path string) (meminfoFigures, error) {
	if path == "" {
		path = "/proc/meminfo"
	}
	text, err := readBounded(path, maxMeminfoBytes)
	if err != nil {
		return meminfoFigures{}, errors.Wrap(err, "host: reading the machine's memory")
	}
	return parseMeminfo(path, text)
}

// parseMeminfo reads the figures of a meminfo file's text (path names it
// in errors).
func parseMeminfo(path string, text []byte) (meminfoFigures, error) {
	var m meminfoFigures
	found := map[string]bool{}
	for _, line := range strings.Split(string(text), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		var dst *uint64
		switch fields[0] {
		case "MemTotal:":
			dst = &m.memTotal
		case "MemAvailable:":
			dst = &m.memAvailable
		case "SwapTotal:":
			dst = &m.swapTotal
		case "SwapFree:":
			dst = &m.swapFree
		default:
			continue
		}
		kb, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil || kb > math.MaxUint64/units.KiB {
			return meminfoFigures{}, errors.Newf("host: %s: cannot read %.80q", path, line)
		}
		*dst = kb * units.KiB
		found[fields[0]] = true
	}
	if !found["MemTotal:"] {
		return meminfoFigures{}, errors.Newf("host: %s has no MemTotal line", path)
	}
	if !found["MemAvailable:"] {
		return meminfoFigures{}, errors.Newf("host: %s has no MemAvailable line", path)
	}
	return m, nil
}

// newMachine reads the machine's fixed figures: meminfo (the kernel's when
// empty) and the memory cgroups of the process, found through procCgroup
// (/proc/self/cgroup) under cgroupRoot (/sys/fs/cgroup).
func newMachine(meminfo, procCgroup, cgroupRoot string) (*machine, error) {
	mi, err := readMeminfo(meminfo)
	if err != nil {
		return nil, err
	}
	m := &machine{meminfo: meminfo, fast: meminfo == "", limit: mi.memTotal + mi.swapTotal,
		limitWhy: "MemTotal " + units.Bytes(mi.memTotal) + " + SwapTotal " + units.Bytes(mi.swapTotal)}
	if procCgroup == "" {
		procCgroup = "/proc/self/cgroup"
	}
	if cgroupRoot == "" {
		cgroupRoot = "/sys/fs/cgroup"
	}
	if cg := findCgroupMemory(procCgroup, cgroupRoot); cg != nil && cg.limit < m.limit {
		m.cg = cg
		m.limit = cg.limit
		m.limitWhy = "the memory limit of cgroup " + cg.dir
	}
	return m, nil
}

// unlimited is the least cgroup v1 limit taken as none (v1 reports no limit
// as PAGE_COUNTER_MAX pages, 2^63 - 4096 bytes with 4 KiB pages).
const unlimited = 1 << 62

// findCgroupMemory returns the memory cgroup with the lowest limit among
// the process's cgroup and its ancestors, v2 or v1, or nil when none is
// limited or none can be read: a machine without cgroups is limited by
// its memory alone.
func findCgroupMemory(procCgroup, root string) *cgroupMemory {
	text, err := readBounded(procCgroup, maxProcCgroupBytes)
	if err != nil {
		return nil
	}
	var best *cgroupMemory
	consider := func(dir, base, limitFile, usage, inactive string) {
		// From the process's cgroup up to the root of the hierarchy: a
		// path that does not exist under this mount (the cgroup of another
		// namespace) starts at the root.
		if _, err := os.Stat(dir); err != nil {
			dir = base
		}
		for {
			if lim, ok := readCgroupLimit(filepath.Join(dir, limitFile)); ok && lim < unlimited && (best == nil || lim < best.limit) {
				best = &cgroupMemory{dir: dir, limit: lim, usage: filepath.Join(dir, usage),
					stat: filepath.Join(dir, "memory.stat"), inactive: inactive}
			}
			if dir == base || !strings.HasPrefix(dir, base) {
				return
			}
			dir = filepath.Dir(dir)
		}
	}
	for _, e := range parseProcCgroup(text) {
		if e.v2 {
			consider(filepath.Join(root, e.path), root, "memory.max", "memory.current", "inactive_file")
		} else {
			base := filepath.Join(root, "memory")
			consider(filepath.Join(base, e.path), base, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
		}
	}
	return best
}

// cgroupEntry is a line of /proc/self/cgroup that names a memory cgroup:
// the unified hierarchy's (v2) or the memory controller's (v1).
type cgroupEntry struct {
	v2   bool
	path string
}

// parseProcCgroup returns the memory cgroups /proc/self/cgroup's text
// names ("id:controllers:path" lines), in its order; other lines are
// skipped.
func parseProcCgroup(text []byte) []cgroupEntry {
	var es []cgroupEntry
	for _, line := range strings.Split(string(text), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		controllers, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			es = append(es, cgroupEntry{v2: true, path: path})
		case hasController(controllers, "memory"):
			es = append(es, cgroupEntry{path: path})
		}
	}
	return es
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readCgroupLimit reads a limit file: a number of bytes, or "max" (none).
func readCgroupLimit(path string) (uint64, bool) {
	b, err := readBounded(path, maxCgroupLimitBytes)
	if err != nil {
		return 0, false
	}
	return parseCgroupLimit(b)
}

// parseCgroupLimit reads a limit or usage file's text.
func parseCgroupLimit(b []byte) (uint64, bool) {
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return math.MaxUint64, true
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// checkCapacity refuses devices of capacity bytes each that together
// exceed what the machine can ever hold for them.
func (m *machine) checkCapacity(devices int, capacity uint64) error {
	hi, total := bits.Mul64(uint64(devices), capacity)
	if hi == 0 && total <= m.limit {
		return nil
	}
	what := units.Bytes(capacity)
	if devices > 1 {
		what = strconv.Itoa(devices) + " devices of " + what
	}
	return errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory,
		"host: a capacity of %s is more than this machine can back: %s (%s)", what, units.Bytes(m.limit), m.limitWhy),
		"lower Options.Capacity (0 takes a safe share of the machine); to plan for devices larger than this machine, use the sim driver")
}

// available is the memory the default capacity takes its share of:
// MemAvailable, or what the cgroup has free under its limit when less.
func (m *machine) available() (uint64, error) {
	mi, err := readMeminfo(m.meminfo)
	if err != nil {
		return 0, err
	}
	avail := mi.memAvailable
	if m.cg != nil {
		avail = min(avail, m.cg.free())
	}
	return avail, nil
}

// checkAvailable returns nil when size more bytes can be committed now
// without driving the kernel to its OOM killer, and ErrOutOfMemory naming
// the figure otherwise.
func (m *machine) checkAvailable(size uint64) error {
	if err := m.checkMachine(size); err != nil {
		return err
	}
	if m.cg != nil {
		return m.cg.checkAvailable(size)
	}
	return nil
}

func (m *machine) checkMachine(size uint64) error {
	if m.fast {
		var si unix.Sysinfo_t
		if unix.Sysinfo(&si) == nil {
			unit := max(uint64(si.Unit), 1)
			free := (uint64(si.Freeram) + uint64(si.Freeswap)) * unit
			if margin := uint64(si.Totalram) * unit / 16; free >= margin && free-margin >= size {
				return nil
			}
		}
	}
	mi, err := readMeminfo(m.meminfo)
	if err != nil {
		return errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "cannot tell whether the machine has %s available: %v", units.Bytes(size), err),
			"the host driver reads /proc/meminfo before each commit")
	}
	if avail := mi.memAvailable + mi.swapFree; size > avail {
		return errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "the machine has %s available (MemAvailable %s + SwapFree %s), %s asked",
			units.Bytes(avail), units.Bytes(mi.memAvailable), units.Bytes(mi.swapFree), units.Bytes(size)),
			"free memory (release chunks, or stop other processes); committing more would bring the kernel's OOM killer")
	}
	return nil
}

// free is what the cgroup has free under its limit. Its usage counts file
// cache; the inactive part is reclaimed before the OOM killer runs, so it
// counts as free (memory.stat is read only when the rest is short of
// want). A cgroup whose usage cannot be read has its whole limit free: the
// machine's figure stands.
func (cg *cgroupMemory) freeFor(want uint64) uint64 {
	used, ok := readCgroupLimit(cg.usage)
	if !ok {
		return cg.limit
	}
	free := cg.limit - min(used, cg.limit)
	if want > free {
		free += min(cg.inactiveFile(), used)
	}
	return free
}

// free is freeFor with the inactive file cache always counted.
func (cg *cgroupMemory) free() uint64 { return cg.freeFor(math.MaxUint64) }

// checkAvailable refuses size more bytes above the cgroup's limit.
func (cg *cgroupMemory) checkAvailable(size uint64) error {
	if free := cg.freeFor(size); size > free {
		return errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "cgroup %s has %s free under its memory limit of %s, %s asked",
			cg.dir, units.Bytes(free), units.Bytes(cg.limit), units.Bytes(size)),
			"free memory in the cgroup, or raise its limit; committing more would bring the cgroup's OOM killer")
	}
	return nil
}

// inactiveFile reads the inactive file cache from memory.stat (0 when it
// cannot).
func (cg *cgroupMemory) inactiveFile() uint64 {
	f, err := os.Open(cg.stat)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxCgroupStatBytes))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == cg.inactive {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}
