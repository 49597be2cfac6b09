package multidev

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// migration is a Migrate under way: the chunks it moves, their new chunks
// on the target device, and the scratch reservation the bytes are copied
// through.
type migration struct {
	to    driver.DeviceID
	idx   []int             // indices of the chunks moved, ascending
	from  []driver.DeviceID // from[j] is the device of chunks[idx[j]]
	fresh []*physical.Chunk // fresh[j] replaces chunks[idx[j]]
	// The scratch reservation maps old chunk j at j×ChunkSize, readable by
	// its device, and fresh[j] at (len(idx)+j)×ChunkSize, read-write for
	// to. nil on a driver with no bytes to move.
	scratch *vaspace.Reservation
	stab    *mapping.Table
}

// Migrate moves the backing of [off, off+n) — whole chunks, all committed —
// to device to, at the same addresses. It creates new chunks on to, copies
// the bytes into them while writes are held off, then, with reads held off
// too, unmaps the old chunks, maps the new ones at the same addresses with
// the same grants, and releases the old ones. Chunks already on to stay.
//
// Every device holding a grant over a moved chunk must reach to (Migrate
// enables its peer access); one that cannot is ErrAccessDenied naming both.
// On any failure — to out of memory, an unreachable grantee, a range not
// committed or not whole chunks — nothing changes and the new chunks are
// released.
//
// The bytes go through the host (driver Read and Write): the drivers here
// have no device-to-device copy between devices that cannot reach each
// other. On a driver without host access whose devices are all simulated
// there are no bytes, and only the backing moves.
func (a *Arena) Migrate(off, n uint64, to driver.DeviceID) error {
	a.ops.Lock()
	defer a.ops.Unlock()
	what := func() string {
		return fmt.Sprintf("multidev: migrate [%#x, +%s) to device %d", off, units.Bytes(n), to)
	}
	m, err := a.planMigration(what, off, n, to)
	if err != nil || m == nil {
		return err
	}
	a.writing.Lock()
	defer a.writing.Unlock()
	err = a.copyMigration(m)
	err = errors.CombineErrors(err, m.dropScratch())
	if err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "%s", what()), m.releaseFresh())
	}
	a.moving.Lock()
	defer a.moving.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	old, err := a.swapLocked(m)
	if err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "%s", what()), m.releaseFresh())
	}
	var errs error
	for _, c := range old {
		errs = errors.CombineErrors(errs, c.Release())
	}
	if errs != nil {
		return errors.WithAssertionFailure(errors.Wrapf(errs, "%s: releasing the old chunks", what()))
	}
	return nil
}

// planMigration checks the request, creates the new chunks and maps old
// and new in a scratch reservation. It returns nil when every chunk is on
// to already. On failure it leaves nothing behind.
func (a *Arena) planMigration(what func() string, off, n uint64, to driver.DeviceID) (*migration, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, a.errClosed("migrate")
	}
	if err := driver.CheckDevice(what, to, len(a.devs)); err != nil {
		return nil, err
	}
	lo, hi, err := a.chunkRangeLocked(what, off, n)
	if err != nil {
		return nil, err
	}
	m := &migration{to: to}
	var peers []driver.DeviceID
	seen := make([]bool, len(a.devs))
	for i := lo; i < hi; i++ {
		ch := a.chunks[i]
		if ch.dev() == to {
			continue
		}
		m.idx = append(m.idx, i)
		m.from = append(m.from, ch.dev())
		for d, acc := range ch.access {
			dev := driver.DeviceID(d)
			if acc == driver.AccessNone || dev == to || seen[d] {
				continue
			}
			seen[d] = true
			ok, err := a.reachableLocked(dev, to)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, unreachable(dev, to, fmt.Sprintf("%s: device %d holds %s access over the chunk at %#x",
					what(), dev, acc, uint64(i)*a.opts.ChunkSize))
			}
			peers = append(peers, dev)
		}
	}
	if len(m.idx) == 0 {
		return nil, nil
	}
	cs := a.opts.ChunkSize
	need := uint64(len(m.idx)) * cs
	hostBytes := a.drv.Supports(driver.FeatureHostAccess)
	if !hostBytes && !a.simulated() {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver cannot copy the bytes (no host access)", what(), a.drv.Name())
	}
	if free := a.freeLocked()[to]; free < need {
		return nil, errors.WithHintf(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: %d chunk(s) of %s need %s on device %d, which has %s free",
				what(), len(m.idx), units.Bytes(cs), units.Bytes(need), to, units.Bytes(free)),
			"trim or free memory on device %d, or migrate less", to)
	}
	for range m.idx {
		c, err := a.mem.Create(to, cs, driver.ChunkOptions{})
		if err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), m.releaseFresh())
		}
		m.fresh = append(m.fresh, c)
	}
	for _, dev := range peers {
		if err := a.streams.EnablePeerAccess(dev, to); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), m.releaseFresh())
		}
	}
	if hostBytes {
		if err := a.mapScratchLocked(m); err != nil {
			err = errors.CombineErrors(err, m.dropScratch())
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s: scratch mapping", what()), m.releaseFresh())
		}
	}
	return m, nil
}

// simulated reports whether every device of the driver is simulated: there
// are no bytes to copy.
func (a *Arena) simulated() bool {
	for _, d := range a.devs {
		if d.Kind != driver.KindSim {
			return false
		}
	}
	return true
}

// mapScratchLocked reserves the scratch range and maps the old chunks
// (readable by their own devices) and the new ones (read-write for the
// target) in it. The old chunks are mapped twice meanwhile: the arena's
// mapping is untouched, and readers go on reading it.
func (a *Arena) mapScratchLocked(m *migration) error {
	cs := a.opts.ChunkSize
	k := len(m.idx)
	res, err := a.space.Reserve(2*uint64(k)*cs, 0)
	if err != nil {
		return err
	}
	m.scratch = res
	if m.stab, err = mapping.New(res, a.mem); err != nil {
		return err
	}
	base := res.Base()
	for j, i := range m.idx {
		old := a.chunks[i].c
		at := base + driver.Addr(uint64(j)*cs)
		if err := m.stab.Map(at, old); err != nil {
			return err
		}
		if err := m.stab.SetAccess(at, cs, old.Device(), driver.AccessRead); err != nil {
			return err
		}
		if err := m.stab.Map(base+driver.Addr(uint64(k+j)*cs), m.fresh[j]); err != nil {
			return err
		}
	}
	return m.stab.SetAccess(base+driver.Addr(uint64(k)*cs), uint64(k)*cs, m.to, driver.AccessReadWrite)
}

// copyMigration copies each old chunk into its new one through the
// scratch mappings, a chunk at a time. Writers are held off.
func (a *Arena) copyMigration(m *migration) error {
	if m.stab == nil {
		return nil
	}
	cs := a.opts.ChunkSize
	k := len(m.idx)
	base := m.scratch.Base()
	// Where the process addresses the memory, move each byte once, from the
	// old chunk's scratch mapping straight into the new one's (both are
	// mapped and granted in the scratch table, which nothing else touches).
	// Reading into a buffer and writing it out again moved every byte twice:
	// a 1 GiB migration took 2.5 times a plain copy.
	if hm, ok := a.drv.(driver.HostMapper); ok {
		for j := range m.idx {
			src, err := hm.HostBytes(base+driver.Addr(uint64(j)*cs), cs)
			if err != nil {
				return err
			}
			dst, err := hm.HostBytes(base+driver.Addr(uint64(k+j)*cs), cs)
			if err != nil {
				return err
			}
			copy(dst, src)
		}
		return nil
	}
	buf := make([]byte, cs)
	for j := range m.idx {
		src := base + driver.Addr(uint64(j)*cs)
		if err := m.stab.Read(m.from[j], src, buf); err != nil {
			return err
		}
		if err := m.stab.Write(m.to, base+driver.Addr(uint64(k+j)*cs), buf); err != nil {
			return err
		}
	}
	return nil
}

// dropScratch unmaps everything in the scratch reservation and frees it.
func (m *migration) dropScratch() error {
	var errs error
	if m.stab != nil {
		errs = m.stab.Close()
		m.stab = nil
	}
	if m.scratch != nil && errs == nil {
		errs = m.scratch.Free()
		m.scratch = nil
	}
	return errs
}

// releaseFresh releases the new chunks (after a failure).
func (m *migration) releaseFresh() error {
	var errs error
	for _, c := range m.fresh {
		errs = errors.CombineErrors(errs, c.Release())
	}
	m.fresh = nil
	return errs
}

// swapLocked replaces each moved chunk's mapping by its new chunk's, with
// the same grants, and returns the old chunks. On failure it puts back
// what it had swapped: the arena is as it was.
func (a *Arena) swapLocked(m *migration) ([]*physical.Chunk, error) {
	old := make([]*physical.Chunk, len(m.idx))
	for j, i := range m.idx {
		old[j] = a.chunks[i].c
		if err := a.replaceLocked(i, m.fresh[j]); err != nil {
			var rerr error
			for b := j - 1; b >= 0; b-- {
				rerr = errors.CombineErrors(rerr, a.replaceLocked(m.idx[b], old[b]))
			}
			if rerr != nil {
				rerr = errors.WithAssertionFailure(errors.Wrap(rerr, "multidev: putting back a failed migration"))
			}
			return nil, errors.CombineErrors(err, rerr)
		}
	}
	return old, nil
}

// replaceLocked maps c at chunk i in place of the chunk there, with chunk
// i's grants. On failure chunk i is as it was.
func (a *Arena) replaceLocked(i int, c *physical.Chunk) error {
	at, cs := a.at(i), a.opts.ChunkSize
	ch := a.chunks[i]
	put := func(c *physical.Chunk) error {
		if err := a.tab.Map(at, c); err != nil {
			return err
		}
		for d, acc := range ch.access {
			if acc == driver.AccessNone {
				continue
			}
			if err := a.tab.SetAccess(at, cs, driver.DeviceID(d), acc); err != nil {
				return errors.CombineErrors(err, a.tab.Unmap(at))
			}
		}
		return nil
	}
	if err := a.tab.Unmap(at); err != nil {
		return err
	}
	if err := put(c); err != nil {
		return errors.CombineErrors(err, put(ch.c))
	}
	a.chunks[i].c = c
	return nil
}
