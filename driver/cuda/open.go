package cuda

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
	"github.com/vmarena/vmarena/driver/internal/dl"
	"github.com/vmarena/vmarena/internal/units"
)

// WaitMode is how the driver waits for the work it enqueued on a CUDA
// stream before the next operation of that stream runs.
type WaitMode uint8

const (
	// WaitAuto picks WaitHostFunc when the library has cuLaunchHostFunc,
	// else WaitEvent when it has the event calls, else WaitSync.
	WaitAuto WaitMode = iota
	// WaitHostFunc launches a host function behind the work
	// (cuLaunchHostFunc) and parks the goroutine until CUDA calls it; no
	// OS thread blocks in the driver.
	WaitHostFunc
	// WaitEvent records an event behind the work and waits for it
	// (cuEventRecord, cuEventSynchronize): it waits only for the work
	// before the event, and blocks an OS thread.
	WaitEvent
	// WaitSync waits for the whole stream (cuStreamSynchronize).
	WaitSync
)

func (w WaitMode) String() string {
	switch w {
	case WaitAuto:
		return "auto"
	case WaitHostFunc:
		return "host function"
	case WaitEvent:
		return "event"
	case WaitSync:
		return "stream synchronize"
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(w))
}

// Options configure Open. Zero fields take the defaults.
type Options struct {
	// Library is the CUDA driver library to load: a path, or a soname the
	// dynamic loader finds. Default: $VMARENA_CUDA_LIBRARY, else
	// libcuda.so.1.
	Library string
	// Devices are the CUDA device ordinals the driver uses, in order:
	// driver device i is CUDA device Devices[i]. Default: every device.
	Devices []int
	// Capacity caps each device's capacity (rounded down to its minimum
	// granularity); 0 means the device's total memory. The capacity is
	// what the driver lets this process commit; other processes share the
	// GPU, and running out there is still CUDA_ERROR_OUT_OF_MEMORY.
	Capacity uint64
	// Wait is how the driver waits for work on CUDA streams.
	Wait WaitMode
}

// DeviceReport is what Probe learns of one CUDA device.
type DeviceReport struct {
	Ordinal int
	Name    string
	// Memory is the device's total memory (cuDeviceTotalMem).
	Memory uint64
	// VMM, POSIXFD and Pools are the device attributes
	// VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	// HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED and
	// MEMORY_POOLS_SUPPORTED.
	VMM, POSIXFD, Pools bool
	// MinGranularity and RecommendedGranularity are
	// cuMemGetAllocationGranularity's answers (0 without VMM).
	MinGranularity, RecommendedGranularity uint64
}

// Report is what Probe learns of the CUDA driver.
type Report struct {
	// Library is the library loaded.
	Library string
	// Version is cuDriverGetVersion's answer (12060 for CUDA 12.6).
	Version int
	Devices []DeviceReport
	// Missing names the groups of symbols the library lacks, and what
	// they would have given.
	Missing []string
}

// Probe loads the CUDA driver and reports its devices without keeping
// anything open: what `vmarena devices` prints. Its error says why there
// is no usable driver (no libcuda.so.1, the toolkit's link stub, no GPU).
func Probe(library string) (Report, error) {
	x, err := initialised(libraryPath(library))
	if err != nil {
		return Report{}, err
	}
	l := x.l
	rep := Report{Library: l.path}
	var v int32
	if r := l.cuDriverGetVersion(&v); r == 0 {
		rep.Version = int(v)
	}
	for g := range groups {
		if !x.has[g] {
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s (%v)", groupTitles[g], x.missing[g]))
		}
	}
	var n int32
	if err := l.err("cuDeviceGetCount", l.cuDeviceGetCount(&n)); err != nil {
		return rep, errors.Wrap(err, "cuda: probe")
	}
	for i := range n {
		d, err := probeDevice(x, i)
		if err != nil {
			return rep, errors.Wrap(err, "cuda: probe")
		}
		rep.Devices = append(rep.Devices, d)
	}
	return rep, nil
}

// initialised loads the library at path and initialises the driver,
// turning each way a machine can lack CUDA into a clear error.
func initialised(path string) (*loaded, error) {
	x := load(path)
	if x.err != nil {
		return nil, x.err
	}
	if !x.has[groupCore] {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrUnsupported, "cuda: %s is not the CUDA driver: it lacks %v", path, x.missing[groupCore]),
			"name the NVIDIA driver's libcuda.so.1")
	}
	if err := x.l.err("cuInit", x.l.cuInit(0)); err != nil {
		return nil, errors.Wrapf(err, "cuda: initialising %s", path)
	}
	return x, nil
}

// probeDevice reads CUDA device ordinal's name, memory and attributes.
func probeDevice(x *loaded, ordinal int32) (DeviceReport, error) {
	l := x.l
	var dev int32
	if err := l.err("cuDeviceGet", l.cuDeviceGet(&dev, ordinal)); err != nil {
		return DeviceReport{}, err
	}
	d := DeviceReport{Ordinal: int(ordinal)}
	name := make([]byte, 256)
	if err := l.err("cuDeviceGetName", l.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return d, err
	}
	d.Name = dl.CString(&name[0], len(name))
	if err := l.err("cuDeviceTotalMem_v2", l.cuDeviceTotalMem(&d.Memory, dev)); err != nil {
		return d, err
	}
	attr := func(a int32) (bool, error) {
		var v int32
		err := l.err(fmt.Sprintf("cuDeviceGetAttribute(%d)", a), l.cuDeviceGetAttribute(&v, a, dev))
		return v != 0, err
	}
	var err error
	if d.VMM, err = attr(attrVMMSupported); err != nil {
		return d, err
	}
	if d.POSIXFD, err = attr(attrPOSIXFDSupported); err != nil {
		return d, err
	}
	if d.Pools, err = attr(attrPoolsSupported); err != nil {
		return d, err
	}
	if d.VMM && x.has[groupVMM] {
		prop := memAllocationProp{typ: allocationPinned, location: memLocation{typ: locationTypeDevice, id: dev}}
		if err := l.err("cuMemGetAllocationGranularity", l.cuMemGetAllocationGranularity(&d.MinGranularity, &prop, granularityMinimum)); err != nil {
			return d, err
		}
		if err := l.err("cuMemGetAllocationGranularity", l.cuMemGetAllocationGranularity(&d.RecommendedGranularity, &prop, granularityRecommended)); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Open loads the CUDA driver, checks that every device it will use
// supports virtual memory management, retains each one's primary context
// and returns a driver over them. A machine without CUDA gets an error
// that says why: no libcuda.so.1 ("no NVIDIA driver found", ErrUnsupported),
// the toolkit's link stub (CUDA_ERROR_STUB_LIBRARY), no GPU
// (CUDA_ERROR_NO_DEVICE, ErrNoDevice), a device or a library without
// virtual memory management (ErrUnsupported). A library path that is no
// regular file (a FIFO, a directory, a device) is ErrInvalid before the
// loader opens it, and a library whose load has not finished after a
// minute is ErrBusy (the load goes on; Opens of other paths never wait for
// it).
func Open(opts Options) (*Driver, error) {
	path := libraryPath(opts.Library)
	x, err := initialised(path)
	if err != nil {
		return nil, err
	}
	l := x.l
	if !x.has[groupVMM] {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrUnsupported, "cuda: %s has no virtual memory management (it lacks %v)", path, x.missing[groupVMM]),
			"vmarena needs CUDA 10.2 or later: update the NVIDIA driver")
	}
	var n int32
	if err := l.err("cuDeviceGetCount", l.cuDeviceGetCount(&n)); err != nil {
		return nil, errors.Wrap(err, "cuda: open")
	}
	if n == 0 {
		return nil, errors.WithHint(errors.Wrap(driver.ErrNoDevice, "cuda: open: the driver sees no GPU"), hintNoGPU)
	}
	ordinals := opts.Devices
	if len(ordinals) == 0 {
		for i := range n {
			ordinals = append(ordinals, int(i))
		}
	}
	if len(ordinals) > driver.MaxDevices {
		return nil, errors.Wrapf(driver.ErrInvalid, "cuda: open: %d devices (at most %d)", len(ordinals), driver.MaxDevices)
	}
	wait, err := chooseWait(opts.Wait, x)
	if err != nil {
		return nil, err
	}
	c := &cu{l: l, wait: wait}
	var devs []driver.Device
	for i, ord := range ordinals {
		if ord < 0 || ord >= int(n) || slices.Index(ordinals, ord) != i {
			return nil, errors.Wrapf(driver.ErrNoDevice, "cuda: open: device ordinal %d (the driver has %d; each may be named once)", ord, n)
		}
		rep, err := probeDevice(x, int32(ord))
		if err != nil {
			return nil, errors.Wrap(err, "cuda: open")
		}
		if !rep.VMM {
			return nil, errors.WithHint(
				errors.Wrapf(driver.ErrUnsupported, "cuda: open: device %d (%s) does not support virtual memory management", ord, rep.Name),
				"leave it out with cuda.Options.Devices")
		}
		capacity := rep.Memory
		if opts.Capacity != 0 {
			capacity = min(capacity, opts.Capacity)
		}
		capacity -= capacity % rep.MinGranularity
		if capacity == 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "cuda: open: device %d's capacity is below its granularity %s", ord, units.Bytes(rep.MinGranularity))
		}
		devs = append(devs, driver.Device{
			ID: driver.DeviceID(i), Name: rep.Name, Kind: driver.KindCUDA, Capacity: capacity,
			MinGranularity: rep.MinGranularity, RecommendedGranularity: rep.RecommendedGranularity,
			NUMANode: -1, CopyAlign: 1,
		})
		c.ordinal = append(c.ordinal, int32(ord))
		c.gran = append(c.gran, rep.MinGranularity)
	}
	c.ctx = make([]uintptr, len(ordinals))
	for i, ord := range c.ordinal {
		if err := l.err("cuDevicePrimaryCtxRetain", l.cuDevicePrimaryCtxRetain(&c.ctx[i], ord)); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "cuda: open: device %d", ord), c.Close())
		}
	}
	info := accel.Info{
		Name: "cuda", Devices: devs,
		HostAccess: x.has[groupSyncCopy],
		Shareable:  x.has[groupShare],
		Streams:    x.has[groupStreams],
		// cuMemSetAccess takes a range over adjacent mappings (PyTorch's
		// expandable segments grant a whole segment in one call), but
		// only whole ones: an H100 (CUDA 13.0) answered a range over
		// part of a mapping with CUDA_ERROR_INVALID_VALUE, as its
		// reference says ("the range must be a fully mapped address
		// range containing all allocations created by cuMemMap /
		// cuMemCreate"). The ledger keeps finer grants in its record.
		SpanAccess:    true,
		MappingAccess: true,
	}
	for i := range devs {
		info.Shareable = info.Shareable && devPOSIX(x, c.ordinal[i])
	}
	info.Peer = make([][]bool, len(devs))
	for i := range devs {
		info.Peer[i] = make([]bool, len(devs))
		for j := range devs {
			if i == j || !x.has[groupPeer] {
				continue
			}
			var can int32
			if err := l.err("cuDeviceCanAccessPeer", l.cuDeviceCanAccessPeer(&can, c.ordinal[i], c.ordinal[j])); err != nil {
				return nil, errors.CombineErrors(errors.Wrap(err, "cuda: open"), c.Close())
			}
			info.Peer[i][j] = can != 0
		}
	}
	core, err := accel.New(info, c)
	if err != nil {
		return nil, errors.CombineErrors(err, c.Close())
	}
	return &Driver{core: core, rt: c, wait: wait}, nil
}

// devPOSIX reports whether device ordinal can export POSIX descriptors.
func devPOSIX(x *loaded, ordinal int32) bool {
	var v int32
	return x.l.cuDeviceGetAttribute(&v, attrPOSIXFDSupported, ordinal) == 0 && v != 0
}

// chooseWait resolves WaitAuto and checks that the library has the calls
// the mode needs.
func chooseWait(w WaitMode, x *loaded) (WaitMode, error) {
	if w == WaitAuto {
		switch {
		case x.has[groupHostFunc]:
			return WaitHostFunc, nil
		case x.has[groupEvents]:
			return WaitEvent, nil
		}
		return WaitSync, nil
	}
	need := map[WaitMode]group{WaitHostFunc: groupHostFunc, WaitEvent: groupEvents, WaitSync: groupStreams}
	g, ok := need[w]
	if !ok {
		return 0, errors.Wrapf(driver.ErrInvalid, "cuda: open: wait mode %d", uint8(w))
	}
	if !x.has[g] {
		return 0, errors.Wrapf(driver.ErrUnsupported, "cuda: open: waiting by %s needs %v, which the library lacks", w, x.missing[g])
	}
	return w, nil
}
