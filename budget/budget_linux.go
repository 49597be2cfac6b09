//go:build linux

package budget

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Book is one process's view of a shared budget: the mapped file and
// its lock. Members join through it; every method is safe for concurrent
// use.
type Book struct {
	path     string
	wait     time.Duration
	capacity uint64

	mu      lockrank.Mutex[lockrank.BudgetBook]
	f       *os.File // the book lock's descriptor; nil once closed
	mem     []byte   // the shared mapping
	members int      // this Book's live members
	buf     [copy1 + stateSize]byte
}

// Open opens the book at path, creating it (with mode Options.Perm) when
// no file is there. A new book's capacity is Options.Capacity; opening an
// existing one, a nonzero Options.Capacity must be the book's. A path
// that is not a regular file of FileSize bytes, or a book that does not
// decode, is refused (ErrInvalid) with nothing changed.
func Open(path string, opts Options) (*Book, error) {
	what := func() string { return fmt.Sprintf("budget: open %s", path) }
	if err := opts.check(what); err != nil {
		return nil, err
	}
	perm := opts.Perm
	if perm == 0 {
		perm = 0o600
	}
	// Without a capacity no book is made: the file is not created, so a
	// refused open leaves nothing behind.
	flags := unix.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if opts.Capacity != 0 {
		flags |= unix.O_CREAT
	}
	fd, err := unix.Open(path, flags, uint32(perm))
	if errors.Is(err, unix.ENOENT) && opts.Capacity == 0 {
		return nil, errors.WithHint(errors.Wrapf(mark(err), "%s: no book there, and a new book needs a capacity", what()),
			"open it with Options.Capacity to make it, or open the path of a book another made")
	}
	if err != nil {
		return nil, errors.Wrapf(mark(err), "%s", what())
	}
	f := os.NewFile(uintptr(fd), path)
	b := &Book{path: path, wait: opts.GiveBackWait, f: f}
	if b.wait == 0 {
		b.wait = DefaultGiveBackWait
	}
	fail := func(err error) (*Book, error) {
		if b.mem != nil {
			_ = unix.Munmap(b.mem)
		}
		_ = f.Close()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(errors.Wrapf(mark(err), "%s", what()))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(errors.Wrapf(driver.ErrInvalid, "%s: not a regular file", what()))
	}
	if err := b.lockFile(); err != nil {
		return fail(errors.Wrapf(err, "%s", what()))
	}
	defer b.unlockFile()
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(errors.Wrapf(mark(err), "%s", what()))
	}
	fresh := st.Size == 0
	switch {
	case fresh && opts.Capacity == 0:
		return fail(errors.Wrapf(driver.ErrInvalid, "%s: a new book needs a capacity", what()))
	case fresh:
		if err := unix.Ftruncate(fd, FileSize); err != nil {
			return fail(errors.Wrapf(mark(err), "%s", what()))
		}
	case st.Size != FileSize:
		return fail(errors.Wrapf(driver.ErrInvalid, "%s: %d bytes, a book has %d", what(), st.Size, FileSize))
	}
	if b.mem, err = unix.Mmap(fd, 0, FileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(errors.Wrapf(mark(err), "%s", what()))
	}
	var s *state
	err = onMapping(what, func() error {
		if fresh {
			encodeHeader(b.mem, opts.Capacity)
			s := &state{gen: 1, capacity: opts.Capacity}
			encodeState(b.buf[copy0:], s)
			copy(b.mem[copy0:copy0+stateSize], b.buf[copy0:copy0+stateSize])
		}
		var err error
		s, _, err = b.readLocked()
		return err
	})
	if err != nil {
		return fail(errors.Wrapf(err, "%s", what()))
	}
	if opts.Capacity != 0 && opts.Capacity != s.capacity {
		return fail(errors.Wrapf(driver.ErrInvalid, "%s: the book's capacity is %s, not the %s asked",
			what(), units.Bytes(s.capacity), units.Bytes(opts.Capacity)))
	}
	b.capacity = s.capacity
	return b, nil
}

// onMapping runs fn, which reads or writes the shared mapping, and makes
// a fault there an error (ErrInvalid) rather than the SIGBUS that ends
// the process: the book's file truncated under the mapping, by something
// that is not a member (no member changes its size). What fn changed in
// the mapping before the fault stays; the books read from it next are
// refused as they do not decode, until the file is whole again.
func onMapping(what func() string, fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the book's mapping faulted: its file was cut short by something that is not a member", what()),
				"remove the book file once every member has left")
		}
	}()
	return fn()
}

// mark gives a system call's error its sentinel.
func mark(err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EISDIR):
		return sentinel.Mark(err, driver.ErrInvalid)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return sentinel.Mark(err, driver.ErrAccessDenied)
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.ENOSPC):
		return sentinel.Mark(err, driver.ErrOutOfMemory)
	}
	return sentinel.Mark(err, driver.ErrInvalid)
}

// usable answers the error a call on a nil, zero or closed Book gets.
func (b *Book) usable(what func() string) error {
	if b == nil || b.path == "" {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the book is nil or was not made by Open", what()), "open it with budget.Open")
	}
	if b.f == nil {
		return errors.Wrapf(driver.ErrClosed, "%s: the book is closed", what())
	}
	return nil
}

// Path returns the book's file.
func (b *Book) Path() string {
	if b == nil {
		return ""
	}
	return b.path
}

// Capacity returns the budget's capacity in bytes.
func (b *Book) Capacity() uint64 {
	if b == nil {
		return 0
	}
	return b.capacity
}

// ofd takes or lets go an open-file-description lock of one byte.
func ofd(f *os.File, cmd int, typ int16, off int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
	for {
		err := unix.FcntlFlock(f.Fd(), cmd, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// lockWait bounds how long a call waits for the book's lock, which a
// member holds only while it reads and writes the books: a process
// stopped while it held it, or something that is not a member, leaves
// the caller with ErrBusy rather than blocked for good. A variable only
// for the tests.
var lockWait = 5 * time.Second

func (b *Book) lockFile() error {
	deadline := time.Now().Add(lockWait)
	pause := 20 * time.Microsecond
	for {
		err := ofd(b.f, unix.F_OFD_SETLK, unix.F_WRLCK, 0)
		if err == nil {
			return nil
		}
		if err != unix.EAGAIN && err != unix.EACCES {
			return mark(err)
		}
		if time.Now().After(deadline) {
			return errors.WithHint(errors.Wrapf(driver.ErrBusy, "budget: the book's lock has been held for %s by another open file", lockWait),
				"a member stopped while it held the lock (a debugger, SIGSTOP), or something that is not a member, holds byte 0 of the book file")
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond) // a held lock is let go within microseconds
	}
}

func (b *Book) unlockFile() { _ = ofd(b.f, unix.F_OFD_SETLK, unix.F_UNLCK, 0) }

// alive says whether slot's liveness lock is held (by any descriptor but
// b's own, which holds none).
func (b *Book) alive(slot int) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: liveBase + int64(slot), Len: 1}
	if err := unix.FcntlFlock(b.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return true // unknown: keep the hold, never over-commit
	}
	return lk.Type != unix.F_UNLCK
}

// readLocked decodes the books from a private copy of the mapping, so a
// writer elsewhere cannot change what was checked. It returns the copy
// to write next.
func (b *Book) readLocked() (*state, int, error) {
	copy(b.buf[:], b.mem[:len(b.buf)])
	s, which, err := decode(b.buf[:])
	if err == nil && b.capacity != 0 && s.capacity != b.capacity {
		// No member changes a book's capacity: the one Open read stands.
		err = errors.Wrapf(driver.ErrInvalid, "budget: corrupt book: capacity %s, it was opened with %s",
			units.Bytes(s.capacity), units.Bytes(b.capacity))
	}
	if err != nil {
		return nil, 0, errors.WithHint(err, "the book file was written by something that is not a member; remove it once every member has left")
	}
	return s, 1 - which, nil
}

// writeLocked writes s, one generation on, into the copy next.
func (b *Book) writeLocked(s *state, next int) {
	s.gen++
	off := copy0 + next*stateSize
	encodeState(b.buf[off:], s)
	copy(b.mem[off:off+stateSize], b.buf[off:off+stateSize])
}

// sweepLocked clears the records of members whose liveness lock is
// free, returning whether it cleared any.
func (b *Book) sweepLocked(s *state) bool {
	swept := false
	for i := range s.recs {
		if s.recs[i].used && !b.alive(i) {
			s.recs[i] = record{}
			swept = true
		}
	}
	return swept
}

// update runs fn on the books under both locks and writes them when fn
// asks to (and returns no error).
func (b *Book) update(what func() string, sweep bool, fn func(s *state) (write bool, err error)) error {
	if b == nil || b.path == "" {
		return b.usable(what)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.usable(what); err != nil {
		return err
	}
	if err := b.lockFile(); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	defer b.unlockFile()
	var err error
	if ferr := onMapping(what, func() error {
		err = b.updateLocked(what, sweep, fn)
		return nil
	}); ferr != nil {
		return ferr
	}
	return err
}

// updateLocked is update's work under both locks, on the mapping.
func (b *Book) updateLocked(what func() string, sweep bool, fn func(s *state) (write bool, err error)) error {
	s, next, err := b.readLocked()
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	swept := sweep && b.sweepLocked(s)
	write, err := fn(s)
	if err != nil {
		write = false
	}
	if write || swept {
		if !write {
			// fn failed: write the sweep alone, from a fresh read.
			if s, next, err2 := b.readLocked(); err2 == nil {
				b.sweepLocked(s)
				b.writeLocked(s, next)
			}
			return err
		}
		b.writeLocked(s, next)
	}
	return err
}

func info(i int, r *record) Info {
	return Info{Name: r.name, PID: int(r.pid), Slot: i, Floor: r.floor, Ceiling: r.ceiling,
		Committed: r.hold, Idle: r.idle, Asked: r.asked, GivenBack: r.given}
}

// Members returns every live member's line, in slot order, after
// clearing the records of members that died.
func (b *Book) Members() ([]Info, error) {
	var out []Info
	err := b.update(func() string { return "budget: list the members" }, true, func(s *state) (bool, error) {
		for i := range s.recs {
			if s.recs[i].used {
				out = append(out, info(i, &s.recs[i]))
			}
		}
		return false, nil
	})
	return out, err
}

// SetLimits changes the floor and ceiling of the member named name. A
// ceiling below what it holds (ErrBusy), a floor the others leave no room
// for (ErrOutOfMemory), or a bad pair (ErrInvalid) is refused with
// nothing changed.
func (b *Book) SetLimits(name string, floor, ceiling uint64) error {
	what := func() string {
		return fmt.Sprintf("budget: set %q's floor to %s and ceiling to %s", name, units.Bytes(floor), units.Bytes(ceiling))
	}
	return b.update(what, true, func(s *state) (bool, error) {
		i := s.find(name)
		if i < 0 {
			return false, errors.Wrapf(driver.ErrInvalid, "%s: no such member (%s)", what(), s.holders())
		}
		if err := s.checkLimits(what, i, floor, ceiling); err != nil {
			return false, err
		}
		s.recs[i].floor, s.recs[i].ceiling = floor, ceiling
		return true, nil
	})
}

// Close unmaps the book and closes its file. It refuses (ErrBusy) while
// members joined through it are live; a second Close answers ErrClosed.
func (b *Book) Close() error {
	what := func() string { return "budget: close the book" }
	if b == nil || b.path == "" {
		return b.usable(what)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.usable(what); err != nil {
		return err
	}
	if b.members > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: %d members joined through it are live", what(), b.members), "close them first")
	}
	err := unix.Munmap(b.mem)
	b.mem = nil
	if cerr := b.f.Close(); err == nil {
		err = cerr
	}
	b.f = nil
	if err != nil {
		return errors.Wrapf(mark(err), "%s", what())
	}
	return nil
}

// Member is one process's share of the budget.
type Member struct {
	b     *Book
	slot  int
	token uint64
	name  string
	give  GiveBack

	live    *os.File // holds the liveness lock; nil once closed
	seen    uint32   // the request count at Join
	left    atomic.Bool
	closing atomic.Bool
	done    chan struct{}
	mu      sync.Mutex // orders Close calls; a leaf
}

// Join adds a member named name with a floor and a ceiling. give is called
// (on a goroutine of the member's, one call at a time) when another
// member asks for memory back: it frees what it can of want, calling
// Release and SetIdle, and returns. It may be nil for a member that never
// gives back. A name in use, a bad floor or ceiling (ErrInvalid), a floor
// the others leave no room for (ErrOutOfMemory) or a full book (ErrBusy)
// is refused with nothing changed.
func (b *Book) Join(name string, floor, ceiling uint64, give GiveBack) (*Member, error) {
	what := func() string {
		return fmt.Sprintf("budget: join %q with floor %s and ceiling %s", name, units.Bytes(floor), units.Bytes(ceiling))
	}
	if err := checkName(name); err != nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %v", what(), err)
	}
	m := &Member{b: b, name: name, give: give, done: make(chan struct{})}
	counted := false // b.members counts m
	err := b.update(what, true, func(s *state) (bool, error) {
		if s.find(name) >= 0 {
			return false, errors.Wrapf(driver.ErrInvalid, "%s: a live member has the name", what())
		}
		if err := s.checkLimits(what, -1, floor, ceiling); err != nil {
			return false, err
		}
		free := 0
		for i := range s.recs {
			if !s.recs[i].used {
				free++
			}
		}
		if free == 0 {
			return false, errors.Wrapf(driver.ErrBusy, "%s: the book has %d members, its most", what(), MaxMembers)
		}
		live, err := b.reopen()
		if err != nil {
			return false, errors.Wrapf(err, "%s", what())
		}
		// A free record whose liveness lock something holds (no member:
		// a member's record is in the books) is passed over.
		slot, held := -1, 0
		for i := range s.recs {
			if s.recs[i].used {
				continue
			}
			if err := ofd(live, unix.F_OFD_SETLK, unix.F_WRLCK, liveBase+int64(i)); err == nil {
				slot = i
				break
			}
			held++
		}
		if slot < 0 {
			_ = live.Close()
			return false, errors.Wrapf(driver.ErrBusy, "%s: the liveness locks of all %d free slots are held by something that is not a member", what(), held)
		}
		m.live, m.slot = live, slot
		for m.token == 0 {
			m.token = rand.Uint64()
		}
		s.recs[slot] = record{used: true, pid: uint32(os.Getpid()), token: m.token, floor: floor, ceiling: ceiling, name: name}
		mb := b.mailbox(slot)
		atomic.StoreUint64(mb.bytes, 0)
		atomic.StoreUint64(mb.from, 0)
		// Requests count from here: one posted before serve runs is not lost.
		m.seen = atomic.LoadUint32(mb.req)
		atomic.StoreUint32(mb.ack, m.seen)
		b.members++
		counted = true
		return true, nil
	})
	if err != nil {
		if m.live != nil {
			// The mapping faulted after the slot's liveness lock was
			// taken (the file cut short under it): the member never
			// was, and its lock goes.
			_ = m.live.Close()
		}
		if counted {
			b.mu.Lock()
			b.members--
			b.mu.Unlock()
		}
		return nil, err
	}
	go m.serve()
	return m, nil
}

// reopen opens the book's file again, for a member's liveness lock (a
// lock of an open file of its own, so that it goes when the member's
// process dies): the file at the book's path, refused (ErrInvalid) when
// that is no longer the file the book mapped, since a lock taken on
// another file would leave the member's own book seeing it dead.
func (b *Book) reopen() (*os.File, error) {
	f, err := os.OpenFile(b.path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, mark(err)
	}
	var mine, there unix.Stat_t
	if err := unix.Fstat(int(b.f.Fd()), &mine); err != nil {
		_ = f.Close()
		return nil, mark(err)
	}
	if err := unix.Fstat(int(f.Fd()), &there); err != nil {
		_ = f.Close()
		return nil, mark(err)
	}
	if mine.Dev != there.Dev || mine.Ino != there.Ino {
		_ = f.Close()
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "budget: %s is no longer the book's file (it was removed or replaced)", b.path),
			"join through a Book opened on the file now at the path")
	}
	return f, nil
}

// mailbox is a slot's words in the mapping.
type mailbox struct {
	req, ack    *uint32
	bytes, from *uint64
}

func (b *Book) mailbox(slot int) mailbox {
	o := mailOff + slot*mailSize
	return mailbox{
		req:   (*uint32)(unsafe.Pointer(&b.mem[o])),
		ack:   (*uint32)(unsafe.Pointer(&b.mem[o+4])),
		bytes: (*uint64)(unsafe.Pointer(&b.mem[o+8])),
		from:  (*uint64)(unsafe.Pointer(&b.mem[o+16])),
	}
}

// futexWait waits until *addr is not val, a wake, or d (0: forever).
func futexWait(addr *uint32, val uint32, d time.Duration) {
	var ts *unix.Timespec
	if d > 0 {
		t := unix.NsecToTimespec(d.Nanoseconds())
		ts = &t
	}
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 0 /* FUTEX_WAIT, shared */, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

func futexWake(addr *uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE, shared */, 1<<30, 0, 0, 0)
}

// serveWake bounds serve's wait for a request, after which it looks at
// whether the member is closing.
const serveWake = time.Second

// serve answers the member's give-back requests until it closes.
func (m *Member) serve() {
	defer close(m.done)
	what := func() string { return fmt.Sprintf("budget: %s answers a give-back request", m.name) }
	mb := m.b.mailbox(m.slot)
	seen := m.seen
	for {
		// closing is set before the request word moves, so a goroutine
		// that read seen after Close's move returns here.
		if m.closing.Load() {
			return
		}
		// Woken by a request or by stop; the wait is bounded all the
		// same, since a file cut short under the mapping fails stop's
		// wake (EFAULT) and would leave this wait, and Close, for good.
		futexWait(mb.req, seen, serveWake)
		if m.closing.Load() {
			return
		}
		var cur uint32
		var want uint64
		if onMapping(what, func() error {
			cur = atomic.LoadUint32(mb.req)
			want = min(atomic.LoadUint64(mb.bytes), m.b.capacity) // bounded: any member may write it
			return nil
		}) != nil {
			return // the file was cut short: no request can be read any more
		}
		if cur == seen {
			continue
		}
		seen = cur
		if want > 0 && m.give != nil {
			before, err := m.Info()
			m.give(want)
			if after, err2 := m.Info(); err == nil && err2 == nil && after.Committed < before.Committed {
				given := before.Committed - after.Committed
				_ = m.b.update(func() string { return "budget: count a give-back" }, false, func(s *state) (bool, error) {
					if r := &s.recs[m.slot]; r.used && r.token == m.token {
						r.given += given
						return true, nil
					}
					return false, nil
				})
			}
		}
		if onMapping(what, func() error { atomic.StoreUint32(mb.ack, cur); return nil }) != nil {
			return
		}
		futexWake(mb.ack)
	}
}

// own returns the member's record, or an error when it is gone.
func (m *Member) own(what func() string, s *state) (*record, error) {
	r := &s.recs[m.slot]
	if !r.used || r.token != m.token {
		return nil, errors.Wrapf(driver.ErrClosed, "%s: the member's record is gone from the book", what())
	}
	return r, nil
}

func (m *Member) usable(what func() string) error {
	if m == nil || m.b == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the member is nil or was not made by Join", what()), "join with Book.Join")
	}
	if m.left.Load() {
		return errors.Wrapf(driver.ErrClosed, "%s: the member has left", what())
	}
	return nil
}

// Name returns the member's name.
func (m *Member) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// bookCapacity is the capacity of the member's book (0 for a nil or zero
// member).
func (m *Member) bookCapacity() uint64 {
	if m == nil || m.b == nil {
		return 0
	}
	return m.b.capacity
}

// Info returns the member's line of the books.
func (m *Member) Info() (Info, error) {
	what := func() string { return fmt.Sprintf("budget: %s's line", m.Name()) }
	if err := m.usable(what); err != nil {
		return Info{}, err
	}
	var out Info
	err := m.b.update(what, false, func(s *state) (bool, error) {
		r, err := m.own(what, s)
		if err == nil {
			out = info(m.slot, r)
		}
		return false, err
	})
	return out, err
}

// Acquire adds n bytes to the member's hold. When the budget has not that
// much free, it asks the members with idle memory above their floors to
// give back what is short (most idle first), waits for them up to
// Options.GiveBackWait, and reads the books again. It fails with
// ErrOutOfMemory, naming every member and what it holds, when n would
// pass the member's ceiling, when the others' idle memory cannot cover
// the shortfall, or when those asked did not give back in time; the hold
// is then as it was.
func (m *Member) Acquire(n uint64) error {
	what := func() string { return fmt.Sprintf("budget: %s acquires %s", m.Name(), units.Bytes(n)) }
	if err := m.usable(what); err != nil {
		return err
	}
	if n == 0 || n > MaxCapacity {
		return errors.Wrapf(driver.ErrInvalid, "%s: the size is zero or over %s", what(), units.Bytes(MaxCapacity))
	}
	deadline := time.Now().Add(m.b.wait)
	var late []string // members asked that did not answer in time
	for round := 0; ; round++ {
		var asks []ask
		var seqs []uint32
		again := false
		err := m.b.update(what, round > 0, func(s *state) (bool, error) {
			r, err := m.own(what, s)
			if err != nil {
				return false, err
			}
			if r.hold+n > r.ceiling {
				return false, errors.Wrapf(driver.ErrOutOfMemory, "%s: it holds %s, its ceiling is %s (%s)",
					what(), units.Bytes(r.hold), units.Bytes(r.ceiling), s.holders())
			}
			short, plan, coverable := s.plan(m.slot, n)
			if short == 0 {
				r.hold += n
				return true, nil
			}
			if round == 0 {
				again = true // read again, clearing the dead first
				return false, nil
			}
			if !coverable || round >= maxRounds || time.Now().After(deadline) {
				why := "the others' idle memory above their floors does not cover it"
				if len(late) > 0 {
					why = "asked to give back, " + strings.Join(late, ", ") + " did not within " + m.b.wait.String()
				} else if coverable {
					why = "what the others gave back was taken again"
				}
				return false, errors.Wrapf(driver.ErrOutOfMemory, "%s: %s short of %s: %s (%s)",
					what(), units.Bytes(short), units.Bytes(s.capacity), why, s.holders())
			}
			for _, a := range plan {
				mb := m.b.mailbox(a.slot)
				atomic.StoreUint64(mb.bytes, a.bytes)
				atomic.StoreUint64(mb.from, uint64(m.slot))
				seqs = append(seqs, atomic.AddUint32(mb.req, 1))
				futexWake(mb.req)
				s.recs[a.slot].asked++
			}
			asks = plan
			return true, nil
		})
		if err != nil || (asks == nil && !again) {
			return err
		}
		late = late[:0]
		for i, a := range asks {
			if !m.awaitAck(a.slot, seqs[i], deadline) {
				late = append(late, m.b.nameOf(a.slot))
			}
		}
	}
}

// maxRounds bounds the asks of one Acquire.
const maxRounds = 4

// awaitAck waits for slot's acknowledgement of request seq, until the
// deadline or the member's death.
func (m *Member) awaitAck(slot int, seq uint32, deadline time.Time) bool {
	mb := m.b.mailbox(slot)
	what := func() string { return fmt.Sprintf("budget: %s waits for slot %d's give-back", m.name, slot) }
	load := func() (ack uint32, ok bool) {
		err := onMapping(what, func() error { ack = atomic.LoadUint32(mb.ack); return nil })
		return ack, err == nil
	}
	for {
		ack, ok := load()
		if !ok {
			return true // the file was cut short: the next read refuses the books
		}
		if int32(ack-seq) >= 0 {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		futexWait(mb.ack, ack, min(left, 10*time.Millisecond))
		if now, ok := load(); !ok || now == ack && !m.b.aliveSlot(slot) {
			return true // dead: the next read sweeps its hold
		}
	}
}

func (b *Book) aliveSlot(slot int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f != nil && b.alive(slot)
}

// nameOf names a slot's member for a message.
func (b *Book) nameOf(slot int) string {
	name := fmt.Sprintf("slot %d", slot)
	_ = b.update(func() string { return "budget: name a member" }, false, func(s *state) (bool, error) {
		if s.recs[slot].used {
			name = s.recs[slot].name
		}
		return false, nil
	})
	return name
}

// Release takes n bytes off the member's hold (and its idle, where idle
// would pass the hold). More than it holds is refused (ErrInvalid).
func (m *Member) Release(n uint64) error {
	what := func() string { return fmt.Sprintf("budget: %s releases %s", m.Name(), units.Bytes(n)) }
	if err := m.usable(what); err != nil {
		return err
	}
	return m.b.update(what, false, func(s *state) (bool, error) {
		r, err := m.own(what, s)
		if err != nil {
			return false, err
		}
		if n == 0 || n > r.hold {
			return false, errors.Wrapf(driver.ErrInvalid, "%s: it holds %s", what(), units.Bytes(r.hold))
		}
		r.hold -= n
		r.idle = min(r.idle, r.hold)
		return true, nil
	})
}

// SetIdle says how much of its hold the member could give back if asked.
// More than it holds is refused (ErrInvalid).
func (m *Member) SetIdle(n uint64) error {
	what := func() string { return fmt.Sprintf("budget: %s says %s idle", m.Name(), units.Bytes(n)) }
	if err := m.usable(what); err != nil {
		return err
	}
	return m.b.update(what, false, func(s *state) (bool, error) {
		r, err := m.own(what, s)
		if err != nil {
			return false, err
		}
		if n > r.hold {
			return false, errors.Wrapf(driver.ErrInvalid, "%s: it holds %s", what(), units.Bytes(r.hold))
		}
		r.idle = n
		return true, nil
	})
}

// Close leaves the budget: the member's hold returns to it, and its
// goroutine ends. A second Close answers ErrClosed.
func (m *Member) Close() error {
	what := func() string { return fmt.Sprintf("budget: %s leaves", m.Name()) }
	if m == nil || m.b == nil {
		return m.usable(what)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.usable(what); err != nil {
		return err
	}
	m.stop()
	err := m.b.update(what, false, func(s *state) (bool, error) {
		if r := &s.recs[m.slot]; r.used && r.token == m.token {
			*r = record{}
			return true, nil
		}
		return false, nil
	})
	if cerr := m.drop(); err == nil && cerr != nil {
		err = errors.Wrapf(mark(cerr), "%s", what())
	}
	return err
}

// stop ends the member's goroutine.
func (m *Member) stop() {
	m.closing.Store(true)
	mb := m.b.mailbox(m.slot)
	// Cut short, the mapping faults here, and serve, which faulted too or
	// will at its next read, has ended or ends: closing is set.
	_ = onMapping(func() string { return "budget: stop a member" }, func() error { atomic.AddUint32(mb.req, 1); return nil })
	futexWake(mb.req)
	<-m.done
}

// drop lets the liveness lock go and the Book forget the member.
func (m *Member) drop() error {
	m.left.Store(true)
	err := m.live.Close()
	m.live = nil
	m.b.mu.Lock()
	m.b.members--
	m.b.mu.Unlock()
	return err
}

// kill drops the member as a dying process would: its liveness lock goes,
// its record stays until someone sweeps it (tests).
func (m *Member) kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.left.Load() {
		return
	}
	m.stop()
	_ = m.drop()
}

// sortInfos orders lines by name (for output that must not depend on
// slots).
func sortInfos(in []Info) { sort.Slice(in, func(a, b int) bool { return in[a].Name < in[b].Name }) }
