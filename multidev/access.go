package multidev

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Reachable reports whether work on device dev can reach memory of device
// owner, as the driver reports it (CanAccessPeer). A device always reaches
// its own memory; on a driver without streams no device reaches another's.
func (a *Arena) Reachable(dev, owner driver.DeviceID) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false, a.errClosed("reachable")
	}
	return a.reachableLocked(dev, owner)
}

func (a *Arena) reachableLocked(dev, owner driver.DeviceID) (bool, error) {
	what := func() string { return fmt.Sprintf("multidev: can device %d reach device %d", dev, owner) }
	for _, d := range []driver.DeviceID{dev, owner} {
		if err := driver.CheckDevice(what, d, len(a.devs)); err != nil {
			return false, err
		}
	}
	if dev == owner {
		return true, nil
	}
	if a.streams == nil {
		return false, nil
	}
	ok, err := a.streams.CanAccessPeer(dev, owner)
	if err != nil {
		return false, errors.Wrapf(err, "%s", what())
	}
	return ok, nil
}

// unreachable is the refusal for a device that cannot reach another's
// memory; why says what needed it.
func unreachable(dev, owner driver.DeviceID, why string) error {
	return errors.WithHintf(
		errors.Wrapf(driver.ErrAccessDenied, "%s: device %d cannot reach memory of device %d (CanAccessPeer(%d, %d) is false)",
			why, dev, owner, dev, owner),
		"keep the range on device %d, or grant access only to devices that can reach device %d", dev, owner)
}

// Grant sets what dev may do over [off, off+n), which must be whole chunks
// of committed memory — only that range, only that device. Every chunk
// there must be on dev or on a device dev can reach; Grant enables peer
// access from dev to each such device first. An unreachable pair is
// ErrAccessDenied naming both devices, and nothing changes. Granting
// AccessNone revokes, and needs no reachability.
func (a *Arena) Grant(dev driver.DeviceID, off, n uint64, acc driver.Access) error {
	a.ops.Lock()
	defer a.ops.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	what := func() string {
		return fmt.Sprintf("multidev: grant device %d %s access over [%#x, +%s)", dev, acc, off, units.Bytes(n))
	}
	if a.closed {
		return a.errClosed("grant")
	}
	if err := driver.CheckDevice(what, dev, len(a.devs)); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, acc); err != nil {
		return err
	}
	lo, hi, err := a.chunkRangeLocked(what, off, n)
	if err != nil {
		return err
	}
	var peers []driver.DeviceID
	if acc != driver.AccessNone {
		seen := make([]bool, len(a.devs))
		for i := lo; i < hi; i++ {
			owner := a.chunks[i].dev()
			if owner == dev || seen[owner] {
				continue
			}
			seen[owner] = true
			ok, err := a.reachableLocked(dev, owner)
			if err != nil {
				return err
			}
			if !ok {
				return unreachable(dev, owner, fmt.Sprintf("%s: the chunk at %#x is on device %d", what(), uint64(i)*a.opts.ChunkSize, owner))
			}
			peers = append(peers, owner)
		}
	}
	for _, owner := range peers {
		if err := a.streams.EnablePeerAccess(dev, owner); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
	}
	if err := a.tab.SetAccess(a.Base()+driver.Addr(off), n, dev, acc); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	for i := lo; i < hi; i++ {
		a.chunks[i].access[dev] = acc
	}
	return nil
}

// chunkRangeLocked checks that [off, off+n) is whole committed chunks and
// returns their indices [lo, hi).
func (a *Arena) chunkRangeLocked(what func() string, off, n uint64) (lo, hi int, err error) {
	cs := a.opts.ChunkSize
	if n == 0 {
		return 0, 0, errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	if off%cs != 0 || n%cs != 0 {
		return 0, 0, errors.WithHint(
			errors.Wrapf(driver.ErrMisaligned, "%s: the range is not whole chunks of %s", what(), units.Bytes(cs)),
			"ranges are granted and migrated in whole chunks: round to the chunk size")
	}
	if committed := a.committedLocked(); off+n < off || off+n > committed {
		return 0, 0, errors.Wrapf(driver.ErrNotMapped, "%s: the arena has %s committed", what(), units.Bytes(committed))
	}
	return int(off / cs), int((off + n) / cs), nil
}

// Access reports what dev may do at offset off.
func (a *Arena) Access(dev driver.DeviceID, off uint64) (driver.Access, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	what := func() string { return fmt.Sprintf("multidev: access of device %d at offset %#x", dev, off) }
	if a.closed {
		return driver.AccessNone, a.errClosed("access")
	}
	if err := driver.CheckDevice(what, dev, len(a.devs)); err != nil {
		return driver.AccessNone, err
	}
	if committed := a.committedLocked(); off >= committed {
		return driver.AccessNone, errors.Wrapf(driver.ErrNotMapped, "%s: the arena has %s committed", what(), units.Bytes(committed))
	}
	return a.chunks[off/a.opts.ChunkSize].access[dev], nil
}

// Read copies len(p) bytes at offset off into p on behalf of dev, which
// must have read access over the whole range; [off, off+len(p)) must lie
// inside Len. No migration of the arena swaps mappings while it runs.
func (a *Arena) Read(dev driver.DeviceID, off uint64, p []byte) error {
	a.moving.RLock()
	defer a.moving.RUnlock()
	return a.touch("read", dev, off, p, a.tab.Read)
}

// Write copies p to offset off on behalf of dev, which must have
// read-write access over the whole range inside Len. No migration of the
// arena copies or swaps while it runs, so no write is lost to one.
func (a *Arena) Write(dev driver.DeviceID, off uint64, p []byte) error {
	a.writing.RLock()
	defer a.writing.RUnlock()
	a.moving.RLock()
	defer a.moving.RUnlock()
	return a.touch("write", dev, off, p, a.tab.Write)
}

// touch checks the arena's part of a read or write under mu, then lets the
// page table check dev's access and the driver move the bytes. The caller
// holds moving for reading, so the chunks under the range stay put; Close
// takes moving for writing, so the table stays open.
func (a *Arena) touch(op string, dev driver.DeviceID, off uint64, p []byte,
	move func(driver.DeviceID, driver.Addr, []byte) error) error {
	what := func() string {
		return fmt.Sprintf("multidev: %s %d bytes at offset %#x for device %d", op, len(p), off, dev)
	}
	a.mu.Lock()
	closed, length := a.closed, a.length
	a.mu.Unlock()
	if closed {
		return a.errClosed(op)
	}
	if err := driver.CheckDevice(what, dev, len(a.devs)); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if end := off + uint64(len(p)); end < off || end > length {
		return errors.Wrapf(driver.ErrAccessDenied, "%s: past the arena's length %s", what(), units.Bytes(length))
	}
	if err := move(dev, a.Base()+driver.Addr(off), p); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}
