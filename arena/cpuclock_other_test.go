//go:build !linux

package arena

import "time"

var clockStart = time.Now()

// threadCPU falls back on the wall clock where the thread's CPU clock is
// not at hand.
func threadCPU() time.Duration { return time.Since(clockStart) }

// threadClock falls back on the wall clock too.
func threadClock() time.Duration { return time.Since(clockStart) }
