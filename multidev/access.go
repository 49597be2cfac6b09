package multidev

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Reachable reports whether work on device dev can reach memory of device
// owner, as the driver reports it (CanAccessPeer). A device always reaches
// its own memory; on a driver without streams no device reaches another's.
func (m *Arena) Reachable(dev, owner driver.DeviceID) (bool, error) {
	if m.unmade() {
		return false, unmade("Arena.Reachable", "New")
	}
	if m.a.Closed() {
		return false, errClosed("reachable")
	}
	what := func() string { return fmt.Sprintf("multidev: can device %d reach device %d", dev, owner) }
	for _, d := range []driver.DeviceID{dev, owner} {
		if err := driver.CheckDevice(what, d, m.ndev); err != nil {
			return false, err
		}
	}
	if dev == owner {
		return true, nil
	}
	if m.streams == nil {
		return false, nil
	}
	ok, err := m.streams.CanAccessPeer(dev, owner)
	if err != nil {
		return false, errors.Wrapf(err, "%s", what())
	}
	return ok, nil
}

func errClosed(op string) error { return driver.Closed("multidev: " + op + " on a closed arena") }

// unreachable is the refusal for a device that cannot reach another's
// memory; why says what needed it.
func unreachable(dev, owner driver.DeviceID, why string) error {
	return errors.WithHintf(
		errors.Wrapf(driver.ErrAccessDenied, "%s: device %d cannot reach memory of device %d (CanAccessPeer(%d, %d) is false)",
			why, dev, owner, dev, owner),
		"keep the range on device %d, or grant access only to devices that can reach device %d", dev, owner)
}

// owners lists the devices whose chunks back [off, off+n), each once, in
// address order: what a grant or move there must be able to reach.
func (m *Arena) owners(off, n uint64) (devs []driver.DeviceID, at []uint64) {
	for _, e := range m.a.Layout() {
		if e.Offset+e.Size <= off || e.Offset >= off+n {
			continue
		}
		seen := false
		for _, d := range devs {
			seen = seen || d == e.Device
		}
		if !seen {
			devs = append(devs, e.Device)
			at = append(at, max(e.Offset, off))
		}
	}
	return devs, at
}

// Grant sets what dev may do over [off, off+n), which must be whole chunks
// of committed memory — only that range, only that device. Every chunk
// there must be on dev or on a device dev can reach; Grant enables peer
// access from dev to each such device first. An unreachable pair is
// ErrAccessDenied naming both devices, and nothing changes. Granting
// AccessNone revokes, and needs no reachability.
func (m *Arena) Grant(dev driver.DeviceID, off, n uint64, acc driver.Access) error {
	if m.unmade() {
		return unmade("Arena.Grant", "New")
	}
	m.grants.Lock()
	defer m.grants.Unlock()
	what := func() string {
		return fmt.Sprintf("multidev: grant device %d %s access over [%#x, +%s)", dev, acc, off, units.Bytes(n))
	}
	if m.a.Closed() {
		return errClosed("grant")
	}
	if err := driver.CheckDevice(what, dev, m.ndev); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, acc); err != nil {
		return err
	}
	if err := m.a.WholeChunks(off, n); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	var peers []driver.DeviceID
	if acc != driver.AccessNone {
		owners, at := m.owners(off, n)
		for i, owner := range owners {
			if owner == dev {
				continue
			}
			ok, err := m.Reachable(dev, owner)
			if err != nil {
				return err
			}
			if !ok {
				return unreachable(dev, owner, fmt.Sprintf("%s: the chunk at %#x is on device %d", what(), at[i], owner))
			}
			peers = append(peers, owner)
		}
	}
	for _, owner := range peers {
		if err := m.streams.EnablePeerAccess(dev, owner); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
	}
	err := m.a.Grant(dev, off, n, acc)
	m.checkAfter("grant", err)
	return errors.Wrapf(err, "%s", what())
}

// Access reports what dev may do at offset off.
func (m *Arena) Access(dev driver.DeviceID, off uint64) (driver.Access, error) {
	if m.unmade() {
		return 0, unmade("Arena.Access", "New")
	}
	acc, err := m.a.AccessAt(dev, off)
	return acc, errors.Wrap(err, "multidev")
}

// Read copies len(p) bytes at offset off into p on behalf of dev, which
// must have read access over the whole range; [off, off+len(p)) must lie
// inside Len. No migration of the arena swaps mappings while it runs.
func (m *Arena) Read(dev driver.DeviceID, off uint64, p []byte) error {
	if m.unmade() {
		return unmade("Arena.Read", "New")
	}
	return errors.Wrap(m.a.Read(dev, off, p), "multidev")
}

// Write copies p to offset off on behalf of dev, which must have
// read-write access over the whole range inside Len. No migration of the
// arena copies or swaps while it runs, so no write is lost to one.
func (m *Arena) Write(dev driver.DeviceID, off uint64, p []byte) error {
	if m.unmade() {
		return unmade("Arena.Write", "New")
	}
	return errors.Wrap(m.a.Write(dev, off, p), "multidev")
}
