package arena

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time, user and system, the calling thread has used
// (getrusage RUSAGE_THREAD, to the microsecond): BenchmarkSoak reports it
// beside the wall clock, which counts what other processes take of a
// shared machine.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
