package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
)

// The return codes of the C API (vmarena.h names them): 0 for success, a
// negative code per class of failure, each the class of a driver sentinel.
const (
	codeOK          = 0
	codeInvalid     = -1 // driver.ErrInvalid, ErrMisaligned, ErrNotAllocated and the other caller's mistakes
	codeOutOfMemory = -2 // driver.ErrOutOfMemory
	codeBusy        = -3 // driver.ErrBusy
	codeUnsupported = -4 // driver.ErrUnsupported: also no vendor library to load
	codeClosed      = -5 // driver.ErrClosed
	codeNoDevice    = -6 // driver.ErrNoDevice: no such device
	codeOther       = -7 // anything else, a recovered panic among them
)

// codeOf is the return code of err.
func codeOf(err error) int {
	switch {
	case err == nil:
		return codeOK
	case errors.Is(err, driver.ErrOutOfMemory):
		return codeOutOfMemory
	case errors.Is(err, driver.ErrBusy):
		return codeBusy
	case errors.Is(err, driver.ErrUnsupported):
		return codeUnsupported
	case errors.Is(err, driver.ErrClosed):
		return codeClosed
	case errors.Is(err, driver.ErrNoDevice):
		return codeNoDevice
	case errors.IsAny(err, driver.ErrInvalid, driver.ErrMisaligned, driver.ErrNotAllocated, driver.ErrNotReserved,
		driver.ErrOverlap, driver.ErrNotMapped, driver.ErrPartial, driver.ErrBadHandle, driver.ErrAccessDenied):
		return codeInvalid
	}
	return codeOther
}

// defaultTag is the tag of allocations made before a thread sets one.
const defaultTag = "default"

// maxTags bounds how many distinct tags a process may name (each is kept
// for the process's life); maxTagLen bounds a tag's length in bytes.
const (
	maxTags   = 1024
	maxTagLen = 128
)

// library is the state behind the C API: the driver, opened from the
// environment at the first call that needs it, one backend per device,
// made at the device's first use, and the tags by number (a thread's tag
// is kept in C as its number, so that an allocation looks it up without
// copying a string).
type library struct {
	// getenv reads the configuration (os.Getenv; tests give their own).
	getenv func(string) string

	// mu guards everything below. It is taken before a backend's locks
	// and held across backend calls: the C API is not a hot lock (one
	// call per segment PyTorch's caching allocator asks for), and one
	// lock makes shutdown's "nothing live" check exact.
	mu  sync.Mutex
	cfg config
	d   driver.Driver // nil until opened, and after shutdown
	// ordinals[i] is the caller's number of driver device i (a CUDA or
	// AscendCL ordinal, or i on host); devs[i] its backend, nil until
	// its first use.
	ordinals []int
	devs     []backend
	// tags[n] is tag number n; tagIDs inverts it. Number 0 is defaultTag.
	tags   []string
	tagIDs map[string]int32
	// freeErrors counts vmarena_free calls that failed (free returns
	// nothing, so the stats report them).
	freeErrors uint64
}

func newLibrary(getenv func(string) string) *library {
	return &library{getenv: getenv, tags: []string{defaultTag}, tagIDs: map[string]int32{defaultTag: 0}}
}

// openLocked opens the driver the environment names, once.
func (l *library) openLocked() error {
	if l.d != nil {
		return nil
	}
	cfg, err := configFrom(l.getenv)
	if err != nil {
		return err
	}
	var d driver.Driver
	switch cfg.Driver {
	case "host":
		d, err = host.New(host.Options{Devices: len(cfg.Devices), Capacity: cfg.Capacity})
	case "cuda":
		d, err = cuda.Open(cuda.Options{Devices: cfg.Devices, Capacity: cfg.Capacity})
	case "acl":
		d, err = acl.Open(acl.Options{Devices: cfg.Devices, Capacity: cfg.Capacity})
	}
	if err != nil {
		if cfg.Capacity != 0 {
			return errors.Wrapf(err, "libvmarena: open the %s driver (%s=%s, %s=%d)", cfg.Driver, envDriver, cfg.Driver, envCapacity, cfg.Capacity)
		}
		return errors.Wrapf(err, "libvmarena: open the %s driver (%s=%s)", cfg.Driver, envDriver, cfg.Driver)
	}
	n := len(d.Devices())
	l.ordinals = cfg.Devices
	if l.ordinals == nil {
		for i := range n {
			l.ordinals = append(l.ordinals, i)
		}
	}
	if len(l.ordinals) != n {
		err := errors.AssertionFailedf("libvmarena: the %s driver opened %d devices for %d ordinals", cfg.Driver, n, len(l.ordinals))
		return errors.CombineErrors(err, d.Close())
	}
	l.cfg, l.d, l.devs = cfg, d, make([]backend, n)
	return nil
}

// deviceLocked is the backend of the caller's device ordinal and its
// index in devs, opening the driver and making the backend as needed;
// made says this call made it.
func (l *library) deviceLocked(ordinal int) (_ backend, i int, made bool, _ error) {
	if err := l.openLocked(); err != nil {
		return nil, 0, false, err
	}
	i = slices.Index(l.ordinals, ordinal)
	if i < 0 {
		return nil, 0, false, errors.WithHintf(errors.Wrapf(driver.ErrNoDevice, "libvmarena: device %d is not one of the %s driver's devices %v", ordinal, l.cfg.Driver, l.ordinals),
			"%s lists the devices the library opens", envDevices)
	}
	if l.devs[i] == nil {
		b, err := newBackend(l.d, backendOptions{Device: driver.DeviceID(i), TagMax: l.cfg.TagMax, BackupDir: l.cfg.BackupDir, HostCache: l.cfg.HostCache})
		if err != nil {
			if l.cfg.TagMax != 0 {
				return nil, 0, false, errors.Wrapf(err, "libvmarena: device %d (%s=%d)", ordinal, envTagMax, l.cfg.TagMax)
			}
			return nil, 0, false, errors.Wrapf(err, "libvmarena: device %d", ordinal)
		}
		l.devs[i], made = b, true
	}
	return l.devs[i], i, made, nil
}

// usedDeviceLocked is the backend of the caller's device ordinal for a
// free: it opens nothing and makes no backend (a device with none has
// nothing to free, and a bad free changes nothing).
func (l *library) usedDeviceLocked(p driver.Addr, ordinal int) (backend, error) {
	i := slices.Index(l.ordinals, ordinal)
	if i < 0 {
		return nil, errors.WithHintf(errors.Wrapf(driver.ErrNoDevice, "libvmarena: free %#x: device %d is not one of the %s driver's devices %v", uint64(p), ordinal, l.cfg.Driver, l.ordinals),
			"%s lists the devices the library opens", envDevices)
	}
	if l.devs[i] == nil {
		return nil, errors.Wrapf(driver.ErrNotAllocated, "libvmarena: free %#x: nothing is allocated on device %d", uint64(p), ordinal)
	}
	return l.devs[i], nil
}

// tagID is the number of tag, registered at its first use. An empty tag is
// the default one.
func (l *library) tagID(tag string) (int32, error) {
	if tag == "" {
		return 0, nil
	}
	if len(tag) > maxTagLen {
		return 0, errors.Wrapf(driver.ErrInvalid, "libvmarena: a tag of %d bytes (at most %d)", len(tag), maxTagLen)
	}
	for i := 0; i < len(tag); i++ {
		if c := tag[i]; c < 0x20 || c > 0x7e {
			return 0, errors.Wrapf(driver.ErrInvalid, "libvmarena: tag %q: byte %d is not printable ASCII", tag, i)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if id, ok := l.tagIDs[tag]; ok {
		return id, nil
	}
	if len(l.tags) >= maxTags {
		return 0, errors.Wrapf(driver.ErrInvalid, "libvmarena: tag %q would be the %d-th (at most %d distinct tags)", tag, len(l.tags)+1, maxTags)
	}
	id := int32(len(l.tags))
	l.tags = append(l.tags, tag)
	l.tagIDs[tag] = id
	return id, nil
}

// alloc allocates size bytes on device ordinal under tag number tag.
func (l *library) alloc(tag int32, size int64, ordinal int) (driver.Addr, error) {
	if size <= 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "libvmarena: alloc of %d bytes", size)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if tag < 0 || int(tag) >= len(l.tags) {
		return 0, errors.AssertionFailedf("libvmarena: the thread's tag number %d is not registered", tag)
	}
	b, i, made, err := l.deviceLocked(ordinal)
	if err != nil {
		return 0, err
	}
	a, err := b.Alloc(l.tags[tag], uint64(size))
	if err != nil {
		err = errors.Wrapf(err, "libvmarena: alloc of %d bytes on device %d under tag %q", size, ordinal, l.tags[tag])
		if made {
			// The backend is this call's: a refused allocation leaves the
			// device as it found it, without one (and the tag the
			// backend made for it).
			if e := b.Close(); e != nil {
				return 0, errors.CombineErrors(err, errors.Wrapf(e, "libvmarena: device %d: close the backend made for the refused alloc", ordinal))
			}
			l.devs[i] = nil
		}
		return 0, err
	}
	return a, nil
}

// free frees the allocation at p of device ordinal. size, when not 0, must
// be the size it was allocated with. A nil p is nothing to free.
func (l *library) free(p driver.Addr, size uint64, ordinal int) error {
	return l.freeOn(p, size, ordinal, 0)
}

// streamSyncer is a driver that can wait for the work of a stream it did
// not make, given by its vendor handle: cuda.Driver's SyncStreamHandle.
type streamSyncer interface {
	SyncStreamHandle(dev driver.DeviceID, stream uintptr) error
}

// freeOn is free for vmarena_free, whose caller names the stream whose
// work may still use the memory (PyTorch's allocation stream). On a
// driver that can wait for such a stream (cuda), it waits for the work
// queued on it so far before the memory is freed — which may unmap it and
// give it back, and CUDA's cuMemUnmap and cuMemRelease do not wait for
// kernels as cudaFree does. It waits without the library's lock, after
// the checks (a bad free waits for nothing). On other drivers the stream
// means nothing (the host driver's work runs on its own streams) and is
// not looked at.
func (l *library) freeOn(p driver.Addr, size uint64, ordinal int, stream uintptr) (err error) {
	if p == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() {
		if err != nil {
			l.freeErrors++
		}
	}()
	if l.d == nil {
		return errors.Wrapf(driver.ErrNotAllocated, "libvmarena: free %#x: nothing is allocated", uint64(p))
	}
	b, err := l.usedDeviceLocked(p, ordinal)
	if err != nil {
		return err
	}
	s, syncs := l.d.(streamSyncer)
	if size != 0 || syncs {
		got, err := b.Size(p)
		if err != nil {
			return errors.Wrapf(err, "libvmarena: free %#x on device %d", uint64(p), ordinal)
		}
		if size != 0 && got != size {
			return errors.Wrapf(driver.ErrInvalid, "libvmarena: free %#x of %d bytes: it was allocated with %d", uint64(p), size, got)
		}
	}
	if syncs {
		dev := driver.DeviceID(slices.Index(l.ordinals, ordinal))
		l.mu.Unlock()
		err := call("free", func() error { return s.SyncStreamHandle(dev, stream) })
		l.mu.Lock()
		if err != nil {
			return errors.Wrapf(err, "libvmarena: free %#x on device %d: wait for the work of stream %#x", uint64(p), ordinal, stream)
		}
		// Another thread may have freed p in the wait, and shut the
		// library down: look again (without opening it anew).
		if l.d == nil {
			return errors.Wrapf(driver.ErrNotAllocated, "libvmarena: free %#x: the library was shut down in the wait", uint64(p))
		}
		if b, err = l.usedDeviceLocked(p, ordinal); err != nil {
			return err
		}
	}
	if err := b.Free(p); err != nil {
		return errors.Wrapf(err, "libvmarena: free %#x on device %d", uint64(p), ordinal)
	}
	return nil
}

// sleepWake runs op on every device's backend that holds tag (a tag
// exists on a device from its first allocation there); a tag of "" means
// every tag of every device. A tag no device holds is driver.ErrInvalid.
// It stops at the first device that fails.
func (l *library) sleepWake(what, tag string, op func(b backend, tags ...string) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var tags []string
	if tag != "" {
		tags = []string{tag}
	}
	found := false
	for i, b := range l.devs {
		if b == nil || (tag != "" && !slices.ContainsFunc(b.Stats(), func(s tagStats) bool { return s.Tag == tag })) {
			continue
		}
		found = true
		if err := op(b, tags...); err != nil {
			return errors.Wrapf(err, "libvmarena: %s: device %d", what, l.ordinals[i])
		}
	}
	if tag != "" && !found {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "libvmarena: %s: no tag %q on any device", what, tag),
			"a tag exists from its first allocation; pass NULL for every tag")
	}
	return nil
}

func (l *library) sleep(tag string, m int) error {
	if m < 0 || m >= int(modeCount) {
		return errors.Wrapf(driver.ErrInvalid, "libvmarena: sleep mode %d (0 discard, 1 host, 2 file)", m)
	}
	return l.sleepWake("sleep", tag, func(b backend, tags ...string) error {
		err := b.Sleep(mode(m), tags...)
		if err != nil && mode(m) == modeFile {
			// A file sleep is VMARENA_BACKUP_DIR's first use (nothing
			// checks it before): its error names the variable.
			return errors.Wrapf(err, "backups under %s=%q", envBackupDir, l.cfg.BackupDir)
		}
		return err
	})
}

func (l *library) wake(tag string) error {
	return l.sleepWake("wake", tag, func(b backend, tags ...string) error { return b.Wake(tags...) })
}

// Stats, as vmarena_stats_json writes them.
type (
	statsJSON struct {
		Driver     string       `json:"driver"`
		Open       bool         `json:"open"`
		FreeErrors uint64       `json:"free_errors"`
		Devices    []deviceJSON `json:"devices"`
	}
	deviceJSON struct {
		Device int `json:"device"`
		// HostCacheBytes is the pinned host memory kept for later
		// host-mode sleeps (VMARENA_HOST_CACHE).
		HostCacheBytes uint64    `json:"host_cache_bytes"`
		Tags           []tagJSON `json:"tags"`
	}
	tagJSON struct {
		Tag         string `json:"tag"`
		Live        int    `json:"live"`
		Asleep      bool   `json:"asleep"`
		Mode        string `json:"mode"`
		AwakeBytes  uint64 `json:"awake_bytes"`
		AsleepBytes uint64 `json:"asleep_bytes"`
		BackupBytes uint64 `json:"backup_bytes"`
		Cycles      int    `json:"cycles"`
	}
)

// statsJSON reports every device's tags. It opens nothing: before the
// first allocation it reports no devices.
func (l *library) statsJSON() ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := statsJSON{Driver: l.cfg.Driver, Open: l.d != nil, FreeErrors: l.freeErrors, Devices: []deviceJSON{}}
	for i, b := range l.devs {
		if b == nil {
			continue
		}
		dj := deviceJSON{Device: l.ordinals[i], HostCacheBytes: b.HostCached(), Tags: []tagJSON{}}
		for _, t := range b.Stats() {
			dj.Tags = append(dj.Tags, tagJSON{Tag: t.Tag, Live: t.Live, Asleep: t.Asleep, Mode: t.Mode.String(),
				AwakeBytes: t.AwakeBytes, AsleepBytes: t.AsleepBytes, BackupBytes: t.BackupBytes, Cycles: t.Cycles})
		}
		s.Devices = append(s.Devices, dj)
	}
	return json.Marshal(s)
}

// check runs every backend's Check.
func (l *library) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	for i, b := range l.devs {
		if b != nil {
			if e := b.Check(); e != nil {
				err = errors.CombineErrors(err, errors.Wrapf(e, "device %d", l.ordinals[i]))
			}
		}
	}
	return err
}

// shutdown closes every backend and the driver, so that the next call
// opens them again from the environment. While any allocation lives it
// refuses (driver.ErrBusy) and closes nothing. Tags stay registered.
func (l *library) shutdown() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.d == nil {
		return nil
	}
	live := 0
	for _, b := range l.devs {
		if b != nil {
			for _, t := range b.Stats() {
				live += t.Live
			}
		}
	}
	if live > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "libvmarena: shutdown: %d allocations are live", live),
			"free them first (vmarena_free)")
	}
	var err error
	for i, b := range l.devs {
		if b != nil {
			if e := b.Close(); e != nil {
				err = errors.CombineErrors(err, errors.Wrapf(e, "device %d", l.ordinals[i]))
				continue
			}
			l.devs[i] = nil
		}
	}
	if err != nil {
		return errors.Wrap(err, "libvmarena: shutdown")
	}
	if err := l.d.Close(); err != nil {
		return errors.Wrap(err, "libvmarena: shutdown: close the driver")
	}
	l.d, l.devs, l.ordinals, l.cfg = nil, nil, nil, config{}
	return nil
}

// panicError is a recovered panic as an error.
func panicError(op string, r any) error {
	return errors.AssertionFailedf("libvmarena: %s: panic: %s", op, fmt.Sprint(r))
}
