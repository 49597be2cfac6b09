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
	"testing"

	"github.com/vmarena/vmarena/internal/errors"
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
	// Threads is the number of the process's threads: not something a
	// test's objects hold, but a new one brings a stack, which is a
	// mapping (see Compare).
	Threads int
}

func (s Snapshot) String() string {
	return fmt.Sprintf("fds %d, mappings %d (vmarena memfd %d), RssShmem %d KiB, threads %d", s.FDs, s.Maps, s.VmarenaMaps, s.RssShmemKiB, s.Threads)
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
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "RssShmem:":
			s.RssShmemKiB, _ = strconv.ParseUint(fields[1], 10, 64)
		case "Threads:":
			s.Threads, _ = strconv.Atoi(fields[1])
		}
	}
	return s, sc.Err()
}

// Compare runs work once to warm up, then up to rounds more times, each
// between two snapshots, and reports whether some round left the process
// holding what it held before (threads aside). The Go runtime maps memory
// of its own now and then (its heap grows; under -race, the detector's
// shadow memory; a thread it starts brings its stack), which can make a
// single round differ; a leak, unlike that, shows in every round, so only
// a difference in all of them is one. A round that differs while the
// process's thread count changed proves nothing either way and is run
// again, up to rounds more times. The last two snapshots are returned.
func Compare(rounds int, work func()) (before, after Snapshot, same bool, err error) {
	work()
	for tries, evidence := 0, 0; evidence < rounds && tries < 2*rounds; tries++ {
		if before, err = Take(); err != nil {
			return before, after, false, err
		}
		work()
		if after, err = Take(); err != nil {
			return before, after, false, err
		}
		switch verdict(before, after) {
		case held:
			return before, after, true, nil
		case differs:
			evidence++
		}
	}
	return before, after, false, nil
}

// Require is Compare for a test: it fails t (Fatal) when the snapshots
// cannot be taken, or when every round left the process holding
// something else, naming both snapshots.
func Require(t testing.TB, rounds int, work func()) {
	t.Helper()
	before, after, same, err := Compare(rounds, work)
	if err != nil {
		t.Fatalf("leakcheck: %v", err)
	}
	if !same {
		t.Fatalf("%v before, %v after", before, after)
	}
}

// A round's verdict.
const (
	held         = iota // the process holds what it held
	differs             // it holds something else: a leak, or the runtime's own
	inconclusive        // it holds something else, and a thread came or went
)

// verdict compares two snapshots taken around one round of work.
func verdict(before, after Snapshot) int {
	b, a := before, after
	b.Threads, a.Threads = 0, 0
	switch {
	case b == a:
		return held
	case before.Threads != after.Threads:
		return inconclusive
	}
	return differs
}
