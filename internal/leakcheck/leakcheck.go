// Package leakcheck takes a snapshot of what a process holds that memory
// management can leak — open file descriptors, kernel mappings, shared
// memory resident in the process — so a test can check that closing
// everything gives it all back.
package leakcheck

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
)

// Snapshot is what the process holds at one moment.
type Snapshot struct {
	// FDs is the number of open file descriptors.
	FDs int
	// Maps is the number of lines of /proc/self/maps.
	Maps int
	// VmarenaMaps is the number of mappings of vmarena's own memfds.
	VmarenaMaps int
	// RssShmemKiB is shared memory (memfd pages) resident in the process.
	RssShmemKiB uint64
}

func (s Snapshot) String() string {
	return fmt.Sprintf("fds %d, mappings %d (vmarena memfd %d), RssShmem %d KiB", s.FDs, s.Maps, s.VmarenaMaps, s.RssShmemKiB)
}

// Take returns the current snapshot. It runs a garbage collection first so
// that descriptors and mappings held only by unreachable Go objects with
// finalizers are gone.
func Take() (Snapshot, error) {
	runtime.GC()
	var s Snapshot
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return s, errors.Wrap(err, "leakcheck")
	}
	s.FDs = len(fds) - 1 // the directory read itself holds one
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return s, errors.Wrap(err, "leakcheck")
	}
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		s.Maps++
		if strings.Contains(line, "/memfd:vmarena") {
			s.VmarenaMaps++
		}
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return s, errors.Wrap(err, "leakcheck")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "RssShmem:" {
			s.RssShmemKiB, _ = strconv.ParseUint(fields[1], 10, 64)
		}
	}
	return s, sc.Err()
}

// Compare runs work once to warm up, then up to rounds more times, each
// between two snapshots, and reports whether some round left the process
// as it found it. The Go runtime maps memory of its own now and then (its
// heap grows; under -race, the detector's shadow memory), which can make a
// single round differ; a leak, unlike that, shows in every round, so only
// a difference in all of them is one. The last two snapshots are returned.
func Compare(rounds int, work func()) (before, after Snapshot, same bool, err error) {
	work()
	for i := 0; i < rounds; i++ {
		if before, err = Take(); err != nil {
			return before, after, false, err
		}
		work()
		if after, err = Take(); err != nil {
			return before, after, false, err
		}
		if before == after {
			return before, after, true, nil
		}
	}
	return before, after, false, nil
}
