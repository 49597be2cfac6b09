package main

import (
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/sleep"
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

// String is the sleep package's name of the mode.
func (m mode) String() string { return sleep.Mode(m).String() }

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
	// HostCache is sleep.Options.HostCache.
	HostCache uint64
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
	HostCached() uint64
	Check() error
	Close() error
}

// newBackend makes the backend of one device of d: the sleep package's
// Manager, each tag an allocator that gives free memory back from
// anywhere, sleeping and waking at the same addresses.
func newBackend(d driver.Driver, o backendOptions) (backend, error) {
	if err := driver.CheckDevice(nil, o.Device, len(d.Devices())); err != nil {
		return nil, err
	}
	m, err := sleep.New(d, sleep.Options{Device: o.Device, TagMax: o.TagMax, BackupDir: o.BackupDir, HostCache: o.HostCache})
	if err != nil {
		return nil, err
	}
	return sleepBackend{m}, nil
}

// sleepBackend is a sleep.Manager with the C API's mode and stats types.
type sleepBackend struct{ *sleep.Manager }

// Sleep converts the C API's mode: the sleep package's, in the same order
// (TestModesAreTheSleepPackages).
func (b sleepBackend) Sleep(m mode, tags ...string) error {
	return b.Manager.Sleep(sleep.Mode(m), tags...)
}

// Stats converts the sleep package's figures.
func (b sleepBackend) Stats() []tagStats {
	st := b.Manager.Stats()
	out := make([]tagStats, len(st))
	for i, s := range st {
		out[i] = tagStats{Tag: s.Tag, Live: s.Live, Asleep: s.Asleep, Mode: mode(s.Mode),
			AwakeBytes: s.AwakeBytes, AsleepBytes: s.AsleepBytes, BackupBytes: s.BackupBytes, Cycles: s.Cycles}
	}
	return out
}
