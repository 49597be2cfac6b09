package sleep

import (
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// copyPiece bounds the staging buffer of a file backup: bytes move
// between device memory and the file through it, and each such piece of
// an allocation is checked on its own. A variable only so that tests
// can make pieces of several.
var copyPiece uint64 = 64 << 20

// castagnoli is the CRC-32C table a file backup's pieces are checked
// with (hardware-assisted on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A backup holds one tag's live allocations while it sleeps: each in a
// host buffer (Host) or at an offset of one file (File). Discard makes
// none. Invariant: bytes is the sum of the sizes in at; host holds
// exactly the buffers of at in Host mode; file is nil unless File mode.
type backup struct {
	mode  Mode
	cache *hostCache // the driver (cache.d), and where Host mode's buffers come from and go back to
	at    map[driver.Addr]piece
	bytes uint64
	file  *os.File
}

// piece is one allocation's backup: its host buffer or its file offset,
// and there the CRC-32C of each copyPiece of it as written, so that a
// wake restores only bytes the file still holds as the sleep wrote them.
type piece struct {
	size   uint64
	buf    []byte   // Host
	pinned bool     // buf is the driver's (HostAlloc)
	off    int64    // File
	sums   []uint32 // File: one a copyPiece, the last maybe shorter
}

// takeBackup copies the live allocations (address → size) out of device
// memory. On failure it frees what it made and returns the error.
func takeBackup(c *hostCache, mode Mode, dir, tag string, live map[driver.Addr]uint64) (*backup, error) {
	d := c.d
	b := &backup{mode: mode, cache: c, at: map[driver.Addr]piece{}}
	if mode == Discard {
		return b, nil
	}
	if !d.Supports(driver.FeatureHostAccess) {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrUnsupported, "sleep: %s backup of tag %q: the %s driver cannot copy device memory to the host", mode, tag, d.Name()),
			"sleep the tag in Discard mode")
	}
	fail := func(err error) (*backup, error) {
		return nil, errors.CombineErrors(errors.Wrapf(err, "sleep: %s backup of tag %q", mode, tag), b.free())
	}
	var stage []byte
	if mode == File {
		if dir == "" {
			dir = os.TempDir()
		}
		f, err := os.CreateTemp(dir, "vmarena-sleep-*.bak")
		if err != nil {
			return fail(fileErr(err))
		}
		b.file = f
		stage = make([]byte, copyPiece)
	}
	for p, n := range live {
		switch mode {
		case Host:
			buf, pinned, err := c.alloc(n)
			if err != nil {
				return fail(err)
			}
			pc := piece{size: n, buf: buf[:n], pinned: pinned}
			if err := d.Read(p, pc.buf); err != nil {
				return fail(errors.CombineErrors(err, c.release(pc.buf, pc.pinned)))
			}
			b.at[p] = pc
		case File:
			off, err := b.file.Seek(0, io.SeekEnd)
			if err != nil {
				return fail(err)
			}
			pc := piece{size: n, off: off, sums: make([]uint32, 0, (n+copyPiece-1)/copyPiece)}
			for done := uint64(0); done < n; {
				k := min(n-done, copyPiece)
				if err := d.Read(p+driver.Addr(done), stage[:k]); err != nil {
					return fail(err)
				}
				if _, err := b.file.WriteAt(stage[:k], off+int64(done)); err != nil {
					return fail(errors.Wrapf(fileErr(err), "write %s to %s", units.Bytes(k), b.file.Name()))
				}
				pc.sums = append(pc.sums, crc32.Checksum(stage[:k], castagnoli))
				done += k
			}
			b.at[p] = pc
		}
		b.bytes += n
	}
	return b, nil
}

// restore writes every backed-up allocation back to device memory. A
// file's piece is written only once its bytes read back as the sleep
// wrote them (their CRC-32C): a file cut short or changed since is
// ErrInvalid, naming the bytes, and the caller puts the tag back to
// sleep, so what was written before it is given back, not kept.
func (b *backup) restore() error {
	var stage []byte
	if b.mode == File {
		stage = make([]byte, copyPiece)
	}
	for p, pc := range b.at {
		switch b.mode {
		case Host:
			if err := b.cache.d.Write(p, pc.buf); err != nil {
				return err
			}
		case File:
			for done := uint64(0); done < pc.size; {
				k := min(pc.size-done, copyPiece)
				at := pc.off + int64(done)
				if _, err := b.file.ReadAt(stage[:k], at); err != nil {
					return errors.Wrapf(fileErr(err), "read %s at offset %d of %s (the backup of %s)", units.Bytes(k), at, b.file.Name(), p)
				}
				if got, want := crc32.Checksum(stage[:k], castagnoli), pc.sums[done/copyPiece]; got != want {
					return errors.Wrapf(driver.ErrInvalid, "the backup of %s in %s changed since the sleep: its %s at offset %d read back with CRC-32C %#08x, written as %#08x",
						p, b.file.Name(), units.Bytes(k), at, got, want)
				}
				if err := b.cache.d.Write(p+driver.Addr(done), stage[:k]); err != nil {
					return err
				}
				done += k
			}
		}
	}
	return nil
}

// drop forgets the backup of the allocation at p (freed while asleep),
// giving its host buffer, or its blocks of the file, back at once.
func (b *backup) drop(p driver.Addr) error {
	pc, ok := b.at[p]
	if !ok {
		return nil
	}
	delete(b.at, p)
	b.bytes -= pc.size
	switch b.mode {
	case Host:
		return b.cache.release(pc.buf, pc.pinned)
	case File:
		if err := punchHole(b.file, pc.off, pc.size); err != nil {
			return errors.Wrapf(err, "sleep: give back the backup of %s in %s", p, b.file.Name())
		}
	}
	return nil
}

// free gives back every host buffer and removes the file.
func (b *backup) free() error {
	var errs error
	for p := range b.at {
		errs = errors.CombineErrors(errs, b.drop(p))
	}
	if b.file != nil {
		name := b.file.Name()
		errs = errors.CombineErrors(errs, b.file.Close())
		// A file someone removed already is what removal wants: only a
		// file left behind is an error.
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = errors.CombineErrors(errs, err)
		}
		b.file = nil
	}
	return errs
}

// fileErr marks an error of the backup file with the sentinel a caller
// tests for: a directory that is not there (or not a directory)
// ErrInvalid, one the process may not write ErrAccessDenied, a full disk
// ErrOutOfMemory; any other the same as ErrInvalid.
func fileErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrPermission):
		return sentinel.Mark(err, driver.ErrAccessDenied)
	case errors.Is(err, syscall.ENOSPC):
		return sentinel.Mark(err, driver.ErrOutOfMemory)
	}
	return sentinel.Mark(err, driver.ErrInvalid)
}
