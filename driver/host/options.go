package host

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Options configure a host driver. Zero fields take the defaults.
type Options struct {
	// Devices is the number of logical devices (default 1).
	Devices int
	// Capacity is each device's capacity. The default is a safe share of
	// the machine: half of MemAvailable, split evenly between the devices.
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
	// meminfo is the file MemAvailable is read from when not empty (by
	// default /proc/meminfo); tests point it at their own, since the
	// machine's figure moves with every other process.
	meminfo string
}

// withDefaults fills the zero fields and checks the rest.
func (o Options) withDefaults() (Options, error) {
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
		avail, err := memAvailable(o.meminfo)
		if err != nil {
			return o, errors.WithHint(err, "set Options.Capacity explicitly")
		}
		o.Capacity = avail / 2 / uint64(o.Devices) / o.Granularity * o.Granularity
		if o.Capacity == 0 {
			return o, errors.Wrapf(driver.ErrOutOfMemory, "host: MemAvailable is %s, too little for %d devices", units.Bytes(avail), o.Devices)
		}
	}
	if err := driver.CheckSize(func() string { return "host: device capacity" }, o.Capacity, o.Granularity); err != nil {
		return o, err
	}
	return o, nil
}

// memAvailable reads MemAvailable from path, /proc/meminfo when empty.
func memAvailable(path string) (uint64, error) {
	if path == "" {
		path = "/proc/meminfo"
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, errors.Wrap(err, "host: reading MemAvailable")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, errors.Wrapf(err, "host: parsing %q", sc.Text())
			}
			return kb * units.KiB, nil
		}
	}
	return 0, errors.Newf("host: %s has no MemAvailable line", path)
}
