package serving

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time the calling thread has used
// (CLOCK_THREAD_CPUTIME_ID): what Simulate charges a scheme's calls, so
// that the time other processes take the core from it is not counted
// (the machine may be shared). Simulate locks its goroutine to its thread
// while it runs.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// threadCPUMeasured says threadCPU reads a clock.
const threadCPUMeasured = true
