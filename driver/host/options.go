package host

import (
	"os"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Options configure a host driver. Zero fields take the defaults.
type Options struct {
	// Devices is the number of logical devices (default 1).
	Devices int
	// Capacity is each device's capacity. The default is a safe share of
	// the machine: half of MemAvailable (or of what the process's memory
	// cgroup has free under its limit, when that is less), split evenly
	// between the devices. New refuses (ErrOutOfMemory) capacities that
	// together exceed what the machine could ever back: MemTotal +
	// SwapTotal, or its cgroup's memory limit when lower.
	Capacity uint64
	// Granularity is each device's minimum granularity: a power of two, at
	// least the OS page size (default 2 MiB, as on current GPUs). The
	// recommended granularity is max(Granularity, 2 MiB).
	Granularity uint64
	// NoPopulate turns off filling page tables when access is granted;
	// the first touch of each page then takes a fault.
	NoPopulate bool
	// CopyAlign is the alignment async copies require (default 1: none).
	// Set it to 64 to behave as AscendCL does.
	CopyAlign uint64
	// NoPeerAccess makes CanAccessPeer false between different devices, as
	// on machines whose accelerators cannot reach each other.
	NoPeerAccess bool
	// RequireNUMA makes New fail unless every device's memory is bound to
	// a NUMA node, and binds them even on a machine with one node (then
	// all to it). Without it, a device whose memory cannot be bound
	// reports NUMANode -1, and on a machine with one node nothing is bound.
	RequireNUMA bool

	// numaRoot is the sysfs tree NUMA nodes are read from when not empty
	// (by default /sys/devices/system/node); tests point it at their own.
	numaRoot string
	// meminfo is the file the machine's memory is read from when not
	// empty (by default /proc/meminfo), procCgroup the file the process's
	// cgroups are (by default /proc/self/cgroup) and cgroupRoot where
	// their file system is (by default /sys/fs/cgroup); tests point them
	// at their own, since the machine's figures move with every other
	// process.
	meminfo, procCgroup, cgroupRoot string
}

// withDefaults fills the zero fields and checks the rest. available is
// the memory the default capacity takes its share of.
func (o Options) withDefaults(available func() (uint64, error)) (Options, error) {
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.Devices < 0 || o.Devices > driver.MaxDevices {
		return o, errors.Wrapf(driver.ErrInvalid, "host: %d devices (1 to %d are supported)", o.Devices, driver.MaxDevices)
	}
	if o.Granularity == 0 {
		o.Granularity = 2 * units.MiB
	}
	page := uint64(os.Getpagesize())
	if g := o.Granularity; g&(g-1) != 0 || g < page {
		return o, errors.Wrapf(driver.ErrInvalid, "host: granularity %d is not a power of two of at least the page size %d", g, page)
	}
	if o.CopyAlign == 0 {
		o.CopyAlign = 1
	}
	if o.CopyAlign&(o.CopyAlign-1) != 0 {
		return o, errors.Wrapf(driver.ErrInvalid, "host: copy alignment %d is not a power of two", o.CopyAlign)
	}
	if o.Capacity == 0 {
		avail, err := available()
		if err != nil {
			return o, errors.WithHint(err, "set Options.Capacity explicitly")
		}
		o.Capacity = avail / 2 / uint64(o.Devices) / o.Granularity * o.Granularity
		if o.Capacity == 0 {
			return o, errors.Wrapf(driver.ErrOutOfMemory, "host: %s available, too little for %d devices", units.Bytes(avail), o.Devices)
		}
	}
	if err := driver.CheckSize(func() string { return "host: device capacity" }, o.Capacity, o.Granularity); err != nil {
		return o, err
	}
	return o, nil
}
