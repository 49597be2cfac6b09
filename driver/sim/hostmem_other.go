//go:build !linux

package sim

// machineMemory is 0 off Linux: this package does not read the
// machine's memory there.
func machineMemory() uint64 { return 0 }
