//go:build !linux

package transfer_test

import "time"

// cpuTime is 0 where the process's CPU time is not read (the benchmarks
// that print it run on Linux).
func cpuTime() time.Duration { return 0 }
