package main

import (
	"sort"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// mode is how a sleep keeps the contents of a tag's memory: the C API's
// mode argument (VMARENA_SLEEP_DISCARD, _HOST, _FILE in vmarena.h).
type mode int

const (
	modeDiscard mode = iota
	modeHost
	modeFile
	modeCount // the number of modes: a C mode at or above it is refused
)

func (m mode) String() string {
	switch m {
	case modeDiscard:
		return "discard"
	case modeHost:
		return "host"
	case modeFile:
		return "file"
	}
	return "unknown"
}

// tagStats are one tag's figures, as the sleep package reports them:
// AwakeBytes is the memory committed under the tag (whole chunks, at least
// its live allocations' bytes), AsleepBytes what a sleep gave back,
// BackupBytes what its backup holds.
type tagStats struct {
	Tag                                  string
	Live                                 int
	Asleep                               bool
	Mode                                 mode
	AwakeBytes, AsleepBytes, BackupBytes uint64
	Cycles                               int
}

// backendOptions configure one device's backend (the sleep package's
// Options).
type backendOptions struct {
	Device driver.DeviceID
	// TagMax is the most memory one tag may hold (0: the device's
	// capacity).
	TagMax uint64
	// BackupDir is where file-mode sleeps write their backups.
	BackupDir string
}

// backend is the memory of one device, allocated under tags that sleep and
// wake together: the sleep package's Manager, whose methods these are.
type backend interface {
	Alloc(tag string, size uint64) (driver.Addr, error)
	Free(p driver.Addr) error
	Size(p driver.Addr) (uint64, error)
	Sleep(m mode, tags ...string) error
	Wake(tags ...string) error
	Stats() []tagStats
	Check() error
	Close() error
}

// newBackend makes the backend of one device of d. It is the one place
// that chooses the backend's implementation: until the sleep package is
// wired in, tagAllocators, which allocates but cannot sleep. Wiring it in
// is sleep.New(d, sleep.Options{Device, TagMax, BackupDir}) wrapped in a
// type that converts Sleep's mode and Stats' figures, and sleepCode = 0
// in cshared_test.go; the tests then check sleep and wake too.
func newBackend(d driver.Driver, o backendOptions) (backend, error) {
	if err := driver.CheckDevice(nil, o.Device, len(d.Devices())); err != nil {
		return nil, err
	}
	return &tagAllocators{d: d, o: o, space: vaspace.New(d), mem: physical.New(d), tags: map[string]*arena.Allocator{}}, nil
}

// tagAllocators is a backend without sleep: one allocator per tag (one
// that gives free chunks back from anywhere), made at the tag's first
// allocation, over one address space and physical memory.
type tagAllocators struct {
	d     driver.Driver
	o     backendOptions
	space *vaspace.Space
	mem   *physical.Memory

	// mu guards tags, ranges and closed; it is taken before an
	// allocator's lock.
	mu   sync.Mutex
	tags map[string]*arena.Allocator
	// ranges are the address ranges of every tag's allocator (which never
	// move), with their allocator: where free and size look a pointer up
	// without asking each allocator for its ranges.
	ranges []ownedRange
	closed bool
}

// ownedRange is an address range an allocator's allocations lie in.
type ownedRange struct {
	r  vaspace.Range
	al *arena.Allocator
}

// errNoSleep is what Sleep and Wake answer until the sleep package is
// wired in.
func errNoSleep(op string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "libvmarena: %s: sleep package not wired yet", op),
		"this build of libvmarena allocates under tags but cannot sleep or wake them")
}

func (b *tagAllocators) allocator(tag string) (*arena.Allocator, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errors.Wrap(driver.ErrClosed, "libvmarena: the device's memory is closed")
	}
	if al := b.tags[tag]; al != nil {
		return al, nil
	}
	al, err := arena.NewAllocator(b.space, b.mem, arena.AllocatorOptions{Device: b.o.Device, Max: b.o.TagMax})
	if err != nil {
		return nil, errors.Wrapf(err, "libvmarena: tag %q", tag)
	}
	b.tags[tag] = al
	for _, r := range al.Ranges() {
		b.ranges = append(b.ranges, ownedRange{r, al})
	}
	return al, nil
}

// owner is the allocator that owns p, nil when none does.
func (b *tagAllocators) owner(p driver.Addr) *arena.Allocator {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.ranges {
		if o.r.Contains(p) {
			return o.al
		}
	}
	return nil
}

func (b *tagAllocators) Alloc(tag string, size uint64) (driver.Addr, error) {
	al, err := b.allocator(tag)
	if err != nil {
		return 0, err
	}
	return al.Alloc(size, 0)
}

func (b *tagAllocators) notAllocated(op string, p driver.Addr) error {
	return errors.Wrapf(driver.ErrNotAllocated, "libvmarena: %s %#x: not an allocation of device %d (freed twice?)", op, uint64(p), b.o.Device)
}

func (b *tagAllocators) Free(p driver.Addr) error {
	al := b.owner(p)
	if al == nil {
		return b.notAllocated("free", p)
	}
	return al.Free(p)
}

func (b *tagAllocators) Size(p driver.Addr) (uint64, error) {
	al := b.owner(p)
	if al == nil {
		return 0, b.notAllocated("size", p)
	}
	return al.Size(p)
}

func (b *tagAllocators) Sleep(mode, ...string) error { return errNoSleep("sleep") }
func (b *tagAllocators) Wake(...string) error        { return errNoSleep("wake") }

// Stats lists the tags that have allocated, by name.
func (b *tagAllocators) Stats() []tagStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]tagStats, 0, len(b.tags))
	for tag, al := range b.tags {
		s := al.Stats()
		out = append(out, tagStats{Tag: tag, Live: s.Live, AwakeBytes: s.Committed})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out
}

func (b *tagAllocators) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var err error
	for tag, al := range b.tags {
		if e := al.Check(); e != nil {
			err = errors.CombineErrors(err, errors.Wrapf(e, "tag %q", tag))
		}
	}
	return errors.CombineErrors(err, b.mem.Check())
}

// Close refuses (driver.ErrBusy) while any tag has live allocations, and
// then frees nothing; else it closes every allocator and the address
// space and memory under them.
func (b *tagAllocators) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	live := 0
	for _, al := range b.tags {
		live += al.Stats().Live
	}
	if live > 0 {
		return errors.Wrapf(driver.ErrBusy, "libvmarena: device %d has %d live allocations", b.o.Device, live)
	}
	var err error
	for _, al := range b.tags {
		err = errors.CombineErrors(err, al.Close())
	}
	err = errors.CombineErrors(err, b.space.Close())
	err = errors.CombineErrors(err, b.mem.Close())
	if err == nil {
		b.closed = true
	}
	return err
}
