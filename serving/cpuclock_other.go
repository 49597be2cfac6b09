//go:build !linux

package serving

import "time"

// threadCPU is 0 off Linux: no thread CPU clock is read there, and
// Result.CPUTime stays 0.
func threadCPU() time.Duration { return 0 }

// threadCPUMeasured says threadCPU reads no clock.
const threadCPUMeasured = false
