package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// SetAccess sets what dev may do with every chunk the range holds now and
// every chunk it commits later. If the driver refuses part-way, the chunks
// already changed are set back and nothing changes. It refuses (ErrBusy,
// changing nothing) to leave a chunk that a live view covers writable by
// no device, or a chunk that a live read-only view covers readable by no
// device: the view's bytes would fault.
func (s *Sparse) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	if s.unmade() {
		return unmade("Sparse.SetAccess", "NewSparse")
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string { return fmt.Sprintf("arena: set access of device %d to %s", dev, acc) }
	if s.closed {
		return s.errClosed("set access")
	}
	if err := driver.CheckDevice(what, dev, len(s.devs)); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, acc); err != nil {
		return err
	}
	if err := s.grantLocked(what, dev, 0, s.slots.Len(), acc); err != nil {
		return err
	}
	s.access[dev] = acc
	if invariants.Enabled {
		invariants.Fail("arena: set access", s.checkLocked())
	}
	return nil
}

// Access reports what dev gets on the chunks the range commits.
func (s *Sparse) Access(dev driver.DeviceID) driver.Access {
	if s.unmade() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if dev < 0 || int(dev) >= len(s.access) {
		return driver.AccessNone
	}
	return s.access[dev]
}

// Grant sets what dev may do over [off, off+n), which must be whole chunks,
// all committed — only that range, only that device; chunks committed
// later get the range's access (SetAccess). Granting AccessNone revokes.
// As SetAccess, it refuses (ErrBusy) to leave a chunk that a live view
// covers writable by no device (readable by none, for a read-only view).
// On failure nothing changes.
func (s *Sparse) Grant(dev driver.DeviceID, off, n uint64, acc driver.Access) error {
	if s.unmade() {
		return unmade("Sparse.Grant", "NewSparse")
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string {
		return fmt.Sprintf("arena: grant device %d %s access over [%#x, +%s)", dev, acc, off, units.Bytes(n))
	}
	if s.closed {
		return s.errClosed("grant")
	}
	lo, hi, err := s.chunksLocked(what, off, n)
	if err != nil {
		return err
	}
	if err := driver.CheckDevice(what, dev, len(s.devs)); err != nil {
		return err
	}
	if err := driver.CheckAccess(what, acc); err != nil {
		return err
	}
	err = s.grantLocked(what, dev, lo, hi, acc)
	if invariants.Enabled {
		invariants.Fail("arena: grant", s.checkLocked())
	}
	return err
}

// WholeChunks reports whether [off, off+n) is whole chunks, all committed:
// nil, or the error Grant and Move give for such a range.
func (s *Sparse) WholeChunks(off, n uint64) error {
	if s.unmade() {
		return unmade("Sparse.WholeChunks", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("range check")
	}
	what := func() string { return fmt.Sprintf("arena: [%#x, +%s)", off, units.Bytes(n)) }
	_, _, err := s.chunksLocked(what, off, n)
	return err
}

// chunksLocked checks that [off, off+n) is whole chunks of the range, all
// committed, and returns the indices [lo, hi) of its slots.
func (s *Sparse) chunksLocked(what func() string, off, n uint64) (lo, hi int, err error) {
	if err := s.checkSpan(what, off, n); err != nil {
		if errors.Is(err, driver.ErrNotReserved) {
			// Past the end is not committed either: that is what these
			// callers want to hear.
			return 0, 0, errors.Wrapf(driver.ErrNotMapped, "%s: past the range's end at %s, and nothing is committed there",
				what(), units.Bytes(s.opts.Max))
		}
		return 0, 0, err
	}
	if holes := s.holesLocked(off, off+n); len(holes) > 0 {
		return 0, 0, errors.Wrapf(driver.ErrNotMapped, "%s: [%#x, %#x) is not committed", what(), holes[0].start, holes[0].end)
	}
	lo, hi = s.slots.Overlapping(off, off+n)
	if err := s.wholeLocked(what, lo, hi, off, off+n); err != nil {
		return 0, 0, err
	}
	return lo, hi, nil
}

// grantLocked sets dev's access to acc on slots [lo, hi), one driver call
// per run of adjacent slots whose access for dev is already alike, and
// puts back what it changed if the driver refuses part-way. It walks the
// slots in order from one descent (From): O(log n + hi-lo), never a
// counted descent per slot.
func (s *Sparse) grantLocked(what func() string, dev driver.DeviceID, lo, hi int, acc driver.Access) error {
	if err := s.keepsViewsLocked(what, dev, lo, hi, acc); err != nil {
		return err
	}
	type run struct {
		start, end uint64
		old        driver.Access
	}
	var (
		done []run
		cur  run
		open bool
	)
	// flush gives the run in cur its driver call, when it changes
	// anything, and puts back the runs done before it if the driver
	// refuses.
	flush := func() error {
		if !open || cur.old == acc {
			return nil
		}
		err := s.tab.SetAccess(s.Base()+driver.Addr(cur.start), cur.end-cur.start, dev, acc)
		if err == nil {
			done = append(done, cur)
			return nil
		}
		for _, r := range done {
			err = errors.CombineErrors(err, s.tab.SetAccess(s.Base()+driver.Addr(r.start), r.end-r.start, dev, r.old))
		}
		return errors.Wrapf(err, "%s", what())
	}
	for i, it := range s.slots.From(lo) {
		if i >= hi {
			break
		}
		old := it.Val.access[dev]
		if open && it.Start == cur.end && old == cur.old {
			cur.end = it.End
			continue
		}
		if err := flush(); err != nil {
			return err
		}
		cur, open = run{it.Start, it.End, old}, true
	}
	if err := flush(); err != nil {
		return err
	}
	for i, it := range s.slots.From(lo) {
		if i >= hi {
			break
		}
		it.Val.access[dev] = acc
	}
	return nil
}

// widest is the widest access any device has to a chunk with access accs:
// on the host driver it is the pages' own protection, so that is what the
// process's loads and stores meet.
func widest(accs []driver.Access) driver.Access {
	var w driver.Access
	for _, a := range accs {
		w |= a
	}
	return w
}

// writable reports whether some device may write a chunk with access accs.
func writable(accs []driver.Access) bool { return widest(accs).Allows(driver.AccessReadWrite) }

// readable reports whether some device may read a chunk with access accs.
func readable(accs []driver.Access) bool { return widest(accs).Allows(driver.AccessRead) }

// keepsViewsLocked refuses (ErrBusy, naming the first) a change of dev's
// access to acc over slots [lo, hi) that would leave a chunk a live view
// covers writable by no device, or a chunk a live read-only view covers
// readable by no device: a view hands out writable memory (Bytes), a
// read-only view readable memory, and taking that access away under it
// would turn the next store or load through it — a tensor's Set or At —
// into a fault. A chunk that is not writable (readable) now pins nothing
// of the kind: its views' bytes are refused already.
func (s *Sparse) keepsViewsLocked(what func() string, dev driver.DeviceID, lo, hi int, acc driver.Access) error {
	if acc.Allows(driver.AccessReadWrite) {
		return nil
	}
	for i, it := range s.slots.From(lo) {
		if i >= hi {
			break
		}
		sl := it.Val
		if sl.views == 0 {
			continue
		}
		after := acc
		for d, a := range sl.access {
			if driver.DeviceID(d) != dev {
				after |= a
			}
		}
		switch writers := sl.views - sl.readViews; {
		case writers > 0 && writable(sl.access) && !after.Allows(driver.AccessReadWrite):
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "%s: %d live view(s) pin the chunk at [%#x, +%s), which no device could write any more",
					what(), writers, it.Start, units.Bytes(it.Size())),
				"release the views (and the tensors over them) first, or give another device write access first")
		case sl.readViews > 0 && readable(sl.access) && !after.Allows(driver.AccessRead):
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "%s: %d live read-only view(s) pin the chunk at [%#x, +%s), which no device could read any more",
					what(), sl.readViews, it.Start, units.Bytes(it.Size())),
				"release the views (and the tensors over them) first, or give another device read access first")
		}
	}
	return nil
}

// losesWrite reports whether setting dev's access to acc leaves the
// range's access (what its chunks get) writable by no device when it is
// writable now.
func (s *Sparse) losesWrite(dev driver.DeviceID, acc driver.Access) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !writable(s.access) || acc.Allows(driver.AccessReadWrite) {
		return false
	}
	w := acc
	for d, a := range s.access {
		if driver.DeviceID(d) != dev {
			w |= a
		}
	}
	return !w.Allows(driver.AccessReadWrite)
}

// writableLocked refuses (ErrAccessDenied) [off, end) when a chunk there
// is not writable by any device: the memory views and allocations hand out
// as bytes is written through them.
func (s *Sparse) writableLocked(what func() string, off, end uint64) error {
	lo, hi := s.slots.Overlapping(off, end)
	for i := lo; i < hi; i++ {
		if it := s.slots.At(i); !writable(it.Val.access) {
			return errors.WithHint(
				errors.Wrapf(driver.ErrAccessDenied, "%s: the chunk at [%#x, +%s) is not writable by any device",
					what(), it.Start, units.Bytes(it.Size())),
				"grant a device read-write access first (SetAccess or Grant); read read-only memory with Read")
		}
	}
	return nil
}

// readableLocked refuses (ErrAccessDenied) [off, end) when a chunk there
// is not readable by any device: the memory read-only views hand out as
// bytes is read through them.
func (s *Sparse) readableLocked(what func() string, off, end uint64) error {
	lo, hi := s.slots.Overlapping(off, end)
	for i := lo; i < hi; i++ {
		if it := s.slots.At(i); !readable(it.Val.access) {
			return errors.WithHint(
				errors.Wrapf(driver.ErrAccessDenied, "%s: the chunk at [%#x, +%s) is not readable by any device",
					what(), it.Start, units.Bytes(it.Size())),
				"grant a device read access first (SetAccess or Grant)")
		}
	}
	return nil
}

// AccessAt reports what dev may do at offset off.
func (s *Sparse) AccessAt(dev driver.DeviceID, off uint64) (driver.Access, error) {
	if s.unmade() {
		return 0, unmade("Sparse.AccessAt", "NewSparse")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string { return fmt.Sprintf("arena: access of device %d at offset %#x", dev, off) }
	if s.closed {
		return driver.AccessNone, s.errClosed("access")
	}
	if err := driver.CheckDevice(what, dev, len(s.devs)); err != nil {
		return driver.AccessNone, err
	}
	i, ok := s.slots.Find(off)
	if !ok {
		return driver.AccessNone, errors.Wrapf(driver.ErrNotMapped, "%s: nothing is committed there", what())
	}
	return s.slots.At(i).Val.access[dev], nil
}

// checkDevice refuses a device the driver does not have.
func (s *Sparse) checkDevice(what func() string, dev driver.DeviceID) error {
	return driver.CheckDevice(what, dev, len(s.devs))
}

// Read copies len(p) bytes at offset off into p on behalf of dev, which
// must have read access over the whole range, all committed. No Move swaps
// the chunks while it runs.
func (s *Sparse) Read(dev driver.DeviceID, off uint64, p []byte) error {
	if s.unmade() {
		return unmade("Sparse.Read", "NewSparse")
	}
	s.moving.RLock()
	defer s.moving.RUnlock()
	return s.touch("read", dev, off, p, s.tab.Read)
}

// Write copies p to offset off on behalf of dev, which must have read-write
// access over the whole range, all committed. No Move copies or swaps while
// it runs, so no write is lost to one.
func (s *Sparse) Write(dev driver.DeviceID, off uint64, p []byte) error {
	if s.unmade() {
		return unmade("Sparse.Write", "NewSparse")
	}
	s.writing.RLock()
	defer s.writing.RUnlock()
	s.moving.RLock()
	defer s.moving.RUnlock()
	return s.touch("write", dev, off, p, s.tab.Write)
}

// touch checks the range's part of a read or write under mu, then lets the
// page table check dev's access and the driver move the bytes. The caller
// holds moving for reading, so the chunks stay put and the table open.
func (s *Sparse) touch(op string, dev driver.DeviceID, off uint64, p []byte,
	move func(driver.DeviceID, driver.Addr, []byte) error) error {
	what := func() string {
		return fmt.Sprintf("arena: %s %d bytes at offset %#x for device %d", op, len(p), off, dev)
	}
	if err := driver.CheckDevice(what, dev, len(s.devs)); err != nil {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	var holes []span
	end := off + uint64(len(p))
	inside := end >= off && end <= s.opts.Max
	if !closed && inside && len(p) > 0 {
		holes = s.holesLocked(off, end)
	}
	s.mu.Unlock()
	switch {
	case closed:
		return s.errClosed(op)
	case len(p) == 0:
		return nil
	case !inside:
		return errors.Wrapf(driver.ErrAccessDenied, "%s: past the range's end at %s", what(), units.Bytes(s.opts.Max))
	case len(holes) > 0:
		return errors.Wrapf(driver.ErrAccessDenied, "%s: [%#x, %#x) is not committed", what(), holes[0].start, holes[0].end)
	}
	if err := move(dev, s.Base()+driver.Addr(off), p); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return nil
}
