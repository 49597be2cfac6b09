package sim

import "golang.org/x/sys/unix"

// machineMemory is the machine's physical memory (sysinfo's totalram), or
// 0 where the kernel does not say.
func machineMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(max(si.Unit, 1))
}
