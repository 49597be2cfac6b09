package multidev

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Migrate moves the backing of [off, off+n) — whole chunks, all committed —
// to device to, at the same addresses (arena.Arena.Move: new chunks on to,
// the bytes copied while writes are held off, the mappings swapped while
// reads are held off, the same grants). Chunks already on to stay.
//
// Every device holding a grant over a moved chunk must reach to (Migrate
// enables its peer access); one that cannot is ErrAccessDenied naming both.
// On any failure — to out of memory, an unreachable grantee, a range not
// committed or not whole chunks — nothing changes and the new chunks are
// released. On a driver without host access whose devices are all
// simulated there are no bytes, and only the backing moves.
func (m *Arena) Migrate(off, n uint64, to driver.DeviceID) error {
	if m.unmade() {
		return unmade("Arena.Migrate", "New")
	}
	m.grants.Lock()
	defer m.grants.Unlock()
	what := func() string {
		return fmt.Sprintf("multidev: migrate [%#x, +%s) to device %d", off, units.Bytes(n), to)
	}
	if m.a.Closed() {
		return errClosed("migrate")
	}
	if err := driver.CheckDevice(what, to, m.ndev); err != nil {
		return err
	}
	if err := m.a.WholeChunks(off, n); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	var peers []driver.DeviceID
	seen := make([]bool, m.ndev)
	cs := m.ChunkSize()
	for c := off; c < off+n; c += cs {
		owner, err := m.a.DeviceAt(c)
		if err != nil {
			return errors.Wrapf(err, "%s", what())
		}
		if owner == to {
			continue
		}
		for d := range m.ndev {
			dev := driver.DeviceID(d)
			acc, err := m.a.AccessAt(dev, c)
			if err != nil {
				return errors.Wrapf(err, "%s", what())
			}
			if acc == driver.AccessNone || dev == to || seen[d] {
				continue
			}
			seen[d] = true
			ok, err := m.Reachable(dev, to)
			if err != nil {
				return err
			}
			if !ok {
				return unreachable(dev, to, fmt.Sprintf("%s: device %d holds %s access over the chunk at %#x", what(), dev, acc, c))
			}
			peers = append(peers, dev)
		}
	}
	for _, dev := range peers {
		if err := m.streams.EnablePeerAccess(dev, to); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
	}
	err := m.a.Move(off, n, to)
	m.checkAfter("migrate", err)
	return errors.Wrapf(err, "%s", what())
}
