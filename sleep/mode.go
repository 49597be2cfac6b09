package sleep

import "fmt"

// Mode is what Sleep keeps of a tag's contents.
type Mode int

const (
	// Discard keeps nothing: a woken tag's memory is zeroed or stale,
	// whatever the driver gives new memory (a KV cache, scratch).
	Discard Mode = iota
	// Host copies every live allocation into host memory the Manager owns
	// (the driver's pinned buffers where it has streams, for allocations
	// of 1 MiB or more), freed at wake (or, with Options.HostCache, the
	// pinned ones kept up to that many bytes for the next sleep).
	Host
	// File writes every live allocation to a backup file in
	// Options.BackupDir, removed at wake, for tags larger than host memory.
	File
)

func (m Mode) String() string {
	switch m {
	case Discard:
		return "discard"
	case Host:
		return "host"
	case File:
		return "file"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

func (m Mode) valid() bool { return m >= Discard && m <= File }
