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

// threadClock is the calling thread's CPU clock to the nanosecond
// (CLOCK_THREAD_CPUTIME_ID): what the pair benchmark reads around batches
// of a few microseconds' work, finer than getrusage's accounting.
func threadClock() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
