// Package procmaps reads the kernel's list of this process's mappings
// (/proc/self/maps), so tests and the demo can compare the library's view of
// memory with what the kernel really has. It only reads.
package procmaps

import (
	"bufio"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"
)

// Entry is one line of /proc/self/maps: the mapping [Start, End).
type Entry struct {
	Start, End uint64
	// Perms is the kernel's four letters: r, w, x and p (private) or s
	// (shared), with '-' for each one missing.
	Perms  string
	Offset uint64
	Inode  uint64
	Path   string
}

// Readable, Writable and Shared decode Perms.
func (e Entry) Readable() bool { return e.Perms[0] == 'r' }
func (e Entry) Writable() bool { return e.Perms[1] == 'w' }
func (e Entry) Shared() bool   { return e.Perms[3] == 's' }

// Read returns the current mappings, sorted by address.
func Read() ([]Entry, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, errors.Wrap(err, "procmaps")
	}
	defer f.Close()
	var es []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, err := parse(sc.Text())
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	if err := sc.Err(); err != nil {
		return nil, errors.Wrap(err, "procmaps")
	}
	return es, nil
}

// parse reads "start-end perms offset dev inode   path".
func parse(line string) (Entry, error) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return Entry{}, errors.Newf("procmaps: malformed line %q", line)
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(fields[2], 16, 64)
	inode, err4 := strconv.ParseUint(fields[4], 10, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(fields[1]) != 4 {
		return Entry{}, errors.Newf("procmaps: malformed line %q", line)
	}
	e := Entry{Start: start, End: end, Perms: fields[1], Offset: off, Inode: inode}
	if len(fields) > 5 {
		e.Path = strings.Join(fields[5:], " ")
	}
	return e, nil
}

// Find returns the entry containing addr.
func Find(es []Entry, addr uint64) (Entry, bool) {
	i := sort.Search(len(es), func(i int) bool { return es[i].End > addr })
	if i < len(es) && es[i].Start <= addr {
		return es[i], true
	}
	return Entry{}, false
}

// Within returns the entries that overlap [lo, hi).
func Within(es []Entry, lo, hi uint64) []Entry {
	var out []Entry
	for _, e := range es {
		if e.End > lo && e.Start < hi {
			out = append(out, e)
		}
	}
	return out
}
