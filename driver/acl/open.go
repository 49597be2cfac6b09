package acl

import (
	"fmt"
	"runtime"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
	"github.com/vmarena/vmarena/driver/internal/dl"
	"github.com/vmarena/vmarena/internal/units"
)

// WaitMode is how the driver waits for the work it enqueued on an
// AscendCL stream before the next operation of that stream runs.
type WaitMode uint8

const (
	// WaitAuto picks WaitEvent when the library has the event calls, else
	// WaitSync.
	WaitAuto WaitMode = iota
	// WaitEvent records an event behind the work and waits for it
	// (aclrtRecordEvent, aclrtSynchronizeEvent): only the work before it.
	WaitEvent
	// WaitSync waits for the whole stream (aclrtSynchronizeStream).
	WaitSync
)

func (w WaitMode) String() string {
	switch w {
	case WaitAuto:
		return "auto"
	case WaitEvent:
		return "event"
	case WaitSync:
		return "stream synchronize"
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(w))
}

// Options configure Open. Zero fields take the defaults.
type Options struct {
	// Library is the AscendCL runtime to load: a path, or a soname the
	// dynamic loader finds. Default: $VMARENA_ACL_LIBRARY, else
	// libascendcl.so.
	Library string
	// Devices are the AscendCL device IDs the driver uses, in order:
	// driver device i is NPU Devices[i]. Default: every device.
	Devices []int
	// Capacity caps each device's capacity (rounded down to its minimum
	// granularity); 0 means the device memory aclrtGetMemInfo reports.
	Capacity uint64
	// Wait is how the driver waits for work on AscendCL streams.
	Wait WaitMode
}

// DeviceReport is what Probe learns of one NPU.
type DeviceReport struct {
	ID   int
	Name string
	// Memory is the device memory aclrtGetMemInfo(ACL_HBM_MEM) reports
	// in total, and Free what is free now.
	Memory, Free uint64
	// MinGranularity and RecommendedGranularity are
	// aclrtMemGetAllocationGranularity's answers (0 when the library or
	// the device has no virtual memory management).
	MinGranularity, RecommendedGranularity uint64

	// noVMM is the runtime's answer when the device has no virtual memory
	// management (ACL_ERROR_RT_FEATURE_NOT_SUPPORT): what Open reports.
	noVMM error
}

// Report is what Probe learns of the AscendCL runtime.
type Report struct {
	Library string
	Devices []DeviceReport
	// Missing names the groups of symbols the library lacks.
	Missing []string
}

// initialised loads the library at path and calls aclInit once per
// process (a second aclInit is ACL_ERROR_REPEAT_INITIALIZE, which is
// fine; aclFinalize is never called, since no later aclInit would work).
func initialised(path string) (*loaded, error) {
	x := load(path)
	if x.err != nil {
		return nil, x.err
	}
	if !x.has[groupCore] {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrUnsupported, "acl: %s is not the AscendCL runtime: it lacks %v", path, x.missing[groupCore]),
			"name CANN's libascendcl.so")
	}
	x.initOnce.Do(func() {
		const repeatInitialize = 100002
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if e := x.l.aclInit(nil); e != 0 && e != repeatInitialize {
			x.initErr = errors.Wrapf(x.l.err("aclInit", e), "acl: initialising %s", path)
		}
	})
	return x, x.initErr
}

// deviceCount is how many NPUs the runtime sees.
func deviceCount(l *lib) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var n uint32
	if err := l.err("aclrtGetDeviceCount", l.aclrtGetDeviceCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Probe loads the runtime and reports its NPUs without keeping anything
// open: what `vmarena devices` prints.
func Probe(library string) (Report, error) {
	x, err := initialised(libraryPath(library))
	if err != nil {
		return Report{}, err
	}
	rep := Report{Library: x.l.path}
	for g := range groups {
		if !x.has[g] {
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s (%v)", groupTitles[g], x.missing[g]))
		}
	}
	n, err := deviceCount(x.l)
	if err != nil {
		return rep, errors.Wrap(err, "acl: probe")
	}
	for id := range n {
		d, err := probeDevice(x, int32(id))
		if err != nil {
			return rep, errors.Wrap(err, "acl: probe")
		}
		rep.Devices = append(rep.Devices, d)
	}
	return rep, nil
}

// probeDevice makes a context on NPU id for as long as it reads the
// device's memory and granularity.
func probeDevice(x *loaded, id int32) (DeviceReport, error) {
	l := x.l
	d := DeviceReport{ID: int(id), Name: socName(x, id)}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer l.keepCurrent()() // the probe's context is gone after: the caller's is current again
	if err := l.err("aclrtSetDevice", l.aclrtSetDevice(id)); err != nil {
		return d, err
	}
	defer l.aclrtResetDevice(id)
	var ctx uintptr
	if err := l.err("aclrtCreateContext", l.aclrtCreateContext(&ctx, id)); err != nil {
		return d, err
	}
	defer l.aclrtDestroyContext(ctx)
	if err := l.err("aclrtSetCurrentContext", l.aclrtSetCurrentContext(ctx)); err != nil {
		return d, err
	}
	if err := l.err("aclrtGetMemInfo", l.aclrtGetMemInfo(memAttrHBM, &d.Free, &d.Memory)); err != nil {
		return d, err
	}
	if x.has[groupVMM] {
		prop := physicalMemProp{handleType: handleTypeNone, allocationType: allocationPinned, memAttr: memAttrHBMHuge,
			location: memLocation{id: uint32(id), typ: locationTypeDevice}}
		err := l.err("aclrtMemGetAllocationGranularity", l.aclrtMemGetAllocationGranularity(&prop, granularityMinimum, &d.MinGranularity))
		if errors.Is(err, driver.ErrUnsupported) {
			// A device without VMM is still a device to report.
			d.MinGranularity, d.noVMM = 0, err
			return d, nil
		}
		if err != nil {
			return d, err
		}
		if err := l.err("aclrtMemGetAllocationGranularity", l.aclrtMemGetAllocationGranularity(&prop, granularityRecommended, &d.RecommendedGranularity)); err != nil {
			return d, err
		}
	}
	return d, nil
}

// socName names NPU id by the runtime's SoC name (aclrtGetSocName: one per
// process, "Ascend910B2").
func socName(x *loaded, id int32) string {
	name := "Ascend NPU"
	if x.has[groupSocName] {
		if p := x.l.aclrtGetSocName(); p != nil {
			if s := dl.CString(p, 128); s != "" {
				name = s
			}
		}
	}
	return fmt.Sprintf("%s #%d", name, id)
}

// Open loads AscendCL, sets up each NPU it will use with a context of its
// own, and returns a driver over them. A machine without the runtime gets
// an error that says why: no libascendcl.so ("no Ascend runtime found",
// ErrUnsupported), no NPU (ErrNoDevice), a runtime or an NPU without the
// physical-memory calls (ErrUnsupported). A library path that is no
// regular file (a FIFO, a directory, a device) is ErrInvalid before the
// loader opens it, and a library whose load has not finished after a
// minute is ErrBusy (the load goes on; Opens of other paths never wait for
// it). A refused Open leaves no device set and no context behind.
func Open(opts Options) (*Driver, error) {
	path := libraryPath(opts.Library)
	x, err := initialised(path)
	if err != nil {
		return nil, err
	}
	l := x.l
	if !x.has[groupVMM] {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrUnsupported, "acl: %s has no virtual memory management (it lacks %v)", path, x.missing[groupVMM]),
			"vmarena needs a CANN release with aclrtReserveMemAddress and aclrtMallocPhysical")
	}
	n, err := deviceCount(l)
	if err != nil {
		return nil, errors.Wrap(err, "acl: open")
	}
	if n == 0 {
		return nil, errors.WithHint(errors.Wrap(driver.ErrNoDevice, "acl: open: the runtime sees no NPU"),
			"check npu-smi info: the runtime sees no usable NPU")
	}
	ids := opts.Devices
	if len(ids) == 0 {
		for i := range n {
			ids = append(ids, i)
		}
	}
	if len(ids) > driver.MaxDevices {
		return nil, errors.Wrapf(driver.ErrInvalid, "acl: open: %d devices (at most %d)", len(ids), driver.MaxDevices)
	}
	wait := opts.Wait
	switch {
	case wait == WaitAuto && x.has[groupEvents]:
		wait = WaitEvent
	case wait == WaitAuto:
		wait = WaitSync
	case wait == WaitEvent && !x.has[groupEvents]:
		return nil, errors.Wrapf(driver.ErrUnsupported, "acl: open: waiting by event needs %v, which the library lacks", x.missing[groupEvents])
	case wait != WaitEvent && wait != WaitSync:
		return nil, errors.Wrapf(driver.ErrInvalid, "acl: open: wait mode %d", uint8(wait))
	}
	a := &ascend{x: x, wait: wait}
	var devs []driver.Device
	for i, id := range ids {
		if id < 0 || id >= n || slices.Index(ids, id) != i {
			return nil, errors.Wrapf(driver.ErrNoDevice, "acl: open: device %d (the runtime has %d; each may be named once)", id, n)
		}
		rep, err := probeDevice(x, int32(id))
		if err != nil {
			return nil, errors.Wrap(err, "acl: open")
		}
		if rep.noVMM != nil {
			return nil, errors.WithHint(errors.Wrapf(rep.noVMM, "acl: open: NPU %d has no virtual memory management", id),
				"vmarena needs an NPU and a CANN release with aclrtReserveMemAddress and aclrtMallocPhysical; leave this one out with acl.Options.Devices")
		}
		capacity := rep.Memory
		if opts.Capacity != 0 {
			capacity = min(capacity, opts.Capacity)
		}
		if rep.MinGranularity == 0 || rep.RecommendedGranularity%rep.MinGranularity != 0 {
			return nil, errors.Wrapf(driver.ErrUnsupported, "acl: open: device %d reports granularities %d and %d", id, rep.MinGranularity, rep.RecommendedGranularity)
		}
		capacity -= capacity % rep.MinGranularity
		if capacity == 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "acl: open: device %d's capacity is below its granularity %s", id, units.Bytes(rep.MinGranularity))
		}
		devs = append(devs, driver.Device{
			ID: driver.DeviceID(i), Name: rep.Name, Kind: driver.KindAscend, Capacity: capacity,
			MinGranularity: rep.MinGranularity, RecommendedGranularity: rep.RecommendedGranularity,
			NUMANode: -1, CopyAlign: copyAlign,
		})
		a.ordinal = append(a.ordinal, int32(id))
	}
	a.ctx = make([]uintptr, len(ids))
	if err := a.openContexts(); err != nil {
		return nil, errors.CombineErrors(err, a.Close())
	}
	info := accel.Info{
		Name: "acl", Devices: devs,
		HostAccess: x.has[groupSyncCopy],
		Shareable:  x.has[groupShare],
		Streams:    x.has[groupStreams],
		// aclrtMemSetAccess takes exactly aclrtMapMem's virPtr and size,
		// and aclrtMapMem binds a reservation to one NPU's memory, local
		// or imported (Huawei's reference for both calls).
		MappingAccess:           true,
		OneDevicePerReservation: true,
	}
	info.Peer = make([][]bool, len(devs))
	for i := range devs {
		info.Peer[i] = make([]bool, len(devs))
		for j := range devs {
			if i == j || !x.has[groupPeer] {
				continue
			}
			var can int32
			err := a.on(driver.DeviceID(i), "aclrtDeviceCanAccessPeer", func() aclError {
				return l.aclrtDeviceCanAccessPeer(&can, a.ordinal[i], a.ordinal[j])
			})
			if err != nil {
				return nil, errors.CombineErrors(errors.Wrap(err, "acl: open"), a.Close())
			}
			info.Peer[i][j] = can != 0
		}
	}
	core, err := accel.New(info, a)
	if err != nil {
		return nil, errors.CombineErrors(err, a.Close())
	}
	return &Driver{core: core, rt: a, wait: wait}, nil
}

// openContexts sets each device up (aclrtSetDevice, counted by the
// runtime, undone by aclrtResetDevice at Close) and makes it a context.
func (a *ascend) openContexts() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer a.x.l.keepCurrent()()
	for i, id := range a.ordinal {
		if err := a.x.l.err("aclrtSetDevice", a.x.l.aclrtSetDevice(id)); err != nil {
			return errors.Wrapf(err, "acl: open: device %d", id)
		}
		if err := a.x.l.err("aclrtCreateContext", a.x.l.aclrtCreateContext(&a.ctx[i], id)); err != nil {
			a.x.l.aclrtResetDevice(id)
			return errors.Wrapf(err, "acl: open: device %d", id)
		}
	}
	return nil
}
