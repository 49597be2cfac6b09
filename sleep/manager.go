package sleep

import (
	"fmt"
	"sort"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// Options configure a Manager.
type Options struct {
	// Device is the device whose memory every tag's allocations use.
	Device driver.DeviceID
	// TagMax is the most memory one tag may hold committed: its
	// allocator's Max (default: the device's capacity). The tag reserves
	// address space for it up front, as arena.Allocator does (about nine
	// times TagMax: its two heaps' and its stitch range), when its first
	// allocation is made.
	TagMax uint64
	// BackupDir is where File mode writes its backups ("" = os.TempDir()).
	// A File sleep fails, the tag left awake with its bytes, when the
	// directory is not there (ErrInvalid), may not be written
	// (ErrAccessDenied) or is full (ErrOutOfMemory).
	BackupDir string
	// ChunkSize is the unit each tag commits and gives back memory in
	// (default: the device's recommended granularity).
	ChunkSize uint64
	// HostCache is how many bytes of pinned host memory the Manager may
	// keep after a Host-mode wake, for the next sleep's backups of the
	// same sizes (see HostCached). 0, the default, gives every backup
	// back at wake: a woken tag holds no host memory. Pinning and
	// unpinning are what a sleep and wake cost most on a GPU (an H100
	// pinned and unpinned 1 GiB in far more time than it copied it both
	// ways), so a process that sleeps and wakes the same tags often may
	// trade this much host memory for that time.
	HostCache uint64
}

// A Manager hands out allocations under tags and puts tags to sleep and
// wakes them at the same addresses. See the package doc.
//
// Invariants (Check): each tag's live set is its allocator's; an asleep
// tag in Host or File mode has a backup of exactly its live allocations,
// an awake one none; every live address is in the owner index under its
// tag. A tag a Sleep or Wake is busy with is checked once it settles.
type Manager struct {
	d     driver.Driver
	o     Options
	cache *hostCache // Host mode's buffers; its own lock

	// mu guards everything below; it is taken before a tag allocator's
	// locks (and so before its tagDriver's). A Sleep or Wake holds it
	// only to claim its tags and to record each one's new state: the
	// copies, unmaps and commits run without it, so calls on other tags
	// go on meanwhile (see tag.busy).
	mu lockrank.Mutex[lockrank.SleepManager]
	// settled is signalled (with mu) whenever tags stop being busy.
	settled *sync.Cond
	tags    map[string]*tag
	owner   map[driver.Addr]*tag
	streams map[driver.Stream]struct{}
	closed  bool

	// tagOptions, when set (by tests only), edits each tag allocator's
	// options before it is made: a test that needs a stitch gives the
	// allocator no more address space than its Max.
	tagOptions func(*arena.AllocatorOptions)
	// hook, when set (by tests only), is called without mu at the start
	// of each tag's sleep ("sleep") or wake ("wake"), while the tag is
	// busy.
	hook func(op, tag string)
}

// A tag is one tag's allocator, the driver under it that can sleep, its
// live allocations (address → size asked), the leases of the live
// allocations that Tensor handed out tensors over and, asleep, its backup.
//
// busy marks a tag a Sleep or Wake has claimed (or a Free while it
// revokes a lease): until it settles, that call alone touches the tag's
// allocator, driver and backup, without Manager.mu, and no other call
// changes live; a call on the tag that would (Alloc, Free, Tensor, Sleep,
// Wake, Close) waits for Manager.settled.
// asleep, mode, bk and cycles are written under Manager.mu only, so
// Stats reads them at any time: a busy tag shows its state before the
// call until the call records the new one.
//
// leases lists only allocations with a lease, so that Sleep revokes
// without walking every allocation: each key is live in the tag, no lease
// in it is revoked, and an asleep tag has none (Sleep unlists them before
// it revokes them; Free unlists and revokes p's).
type tag struct {
	name   string
	drv    *tagDriver
	al     *arena.Allocator
	live   map[driver.Addr]uint64
	leases map[driver.Addr]*tensor.Lease
	busy   bool
	asleep bool
	mode   Mode
	bk     *backup // nil while awake
	cycles int
}

// New returns a Manager over d's device o.Device. Nothing is reserved
// until a tag's first allocation.
func New(d driver.Driver, o Options) (*Manager, error) {
	if err := driver.CheckComparable(func() string { return "sleep: new" }, d); err != nil {
		return nil, err
	}
	devs := d.Devices()
	if err := driver.CheckDevice(func() string { return "sleep: new" }, o.Device, len(devs)); err != nil {
		return nil, err
	}
	dev := devs[o.Device]
	if o.ChunkSize == 0 {
		o.ChunkSize = dev.RecommendedGranularity
	}
	if err := driver.CheckSize(func() string { return "sleep: new: chunk size" }, o.ChunkSize, dev.MinGranularity); err != nil {
		return nil, err
	}
	if o.TagMax == 0 {
		o.TagMax = dev.Capacity
	}
	if err := driver.CheckSize(func() string { return "sleep: new: TagMax" }, o.TagMax, o.ChunkSize); err != nil {
		return nil, err
	}
	m := &Manager{d: d, o: o, cache: newHostCache(d, o.HostCache), tags: map[string]*tag{}, owner: map[driver.Addr]*tag{}, streams: map[driver.Stream]struct{}{}}
	m.settled = sync.NewCond(&m.mu)
	return m, nil
}

func (m *Manager) unmade() bool { return m == nil || m.d == nil }

func unmade(method string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "sleep: %s on a nil or zero Manager", method),
		"make one with sleep.New")
}

func (m *Manager) begin(method string) error {
	if m.unmade() {
		return unmade(method)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return driver.Closed("sleep: " + method + " on a closed Manager")
	}
	return nil
}

// waitLocked waits, mu held, for a Sleep or Wake to settle its tags. It
// returns ErrClosed when the Manager was closed meanwhile.
func (m *Manager) waitLocked(method string) error {
	m.settled.Wait()
	if m.closed {
		return driver.Closed("sleep: " + method + " on a closed Manager")
	}
	return nil
}

// tagLocked returns tag name, making it first if it does not exist yet
// (its allocator reserves its address space then).
func (m *Manager) tagLocked(name string) (*tag, error) {
	if t := m.tags[name]; t != nil {
		return t, nil
	}
	td := newTagDriver(m.d, name)
	ao := arena.AllocatorOptions{Device: m.o.Device, Max: m.o.TagMax, ChunkSize: m.o.ChunkSize}
	if m.tagOptions != nil {
		m.tagOptions(&ao)
	}
	ad := td.forAllocator()
	al, err := arena.NewAllocator(vaspace.New(ad), physical.New(ad), ao)
	if err != nil {
		return nil, errors.Wrapf(err, "sleep: tag %q", name)
	}
	t := &tag{name: name, drv: td, al: al, live: map[driver.Addr]uint64{}}
	m.tags[name] = t
	return t, nil
}

// dropTagLocked closes t, a tag that holds nothing and no lease, and
// forgets it; a tag whose allocator will not close is kept, and the
// error says why.
func (m *Manager) dropTagLocked(t *tag) error {
	if err := t.al.Close(); err != nil {
		return errors.Wrapf(err, "sleep: drop tag %q made for the refused alloc", t.name)
	}
	delete(m.tags, t.name)
	return errors.Wrapf(t.drv.Close(), "sleep: drop tag %q made for the refused alloc", t.name)
}

// Alloc returns size fresh bytes under tag ("" is the default tag). A
// tag exists from its first allocation that succeeds: one whose first
// allocation is refused is not made. A tag that sleeps refuses (ErrBusy naming it): wake it first. In a tag a
// Sleep or Wake is busy with, Alloc waits for it to return first. A size
// larger than Options.TagMax is refused (ErrOutOfMemory) with nothing
// done.
func (m *Manager) Alloc(tag string, size uint64) (driver.Addr, error) {
	if err := m.begin("Alloc"); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	if size == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "sleep: alloc in tag %q: size is zero", tag)
	}
	if size > m.o.TagMax {
		// No tag ever holds it: refused before a tag is made for it or
		// the other tags' free memory is given back for it.
		return 0, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "sleep: alloc %s in tag %q: larger than TagMax (%s), the most a tag holds",
			units.Bytes(size), tag, units.Bytes(m.o.TagMax)), "make the Manager with a larger Options.TagMax")
	}
	for t := m.tags[tag]; t != nil && t.busy; t = m.tags[tag] {
		if err := m.waitLocked("Alloc"); err != nil {
			return 0, err
		}
	}
	if t := m.tags[tag]; t != nil && t.asleep {
		return 0, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "sleep: alloc %s in tag %q: the tag is asleep", units.Bytes(size), tag),
			"wake the tag before allocating in it")
	}
	fresh := m.tags[tag] == nil
	t, err := m.tagLocked(tag)
	if err != nil {
		return 0, err
	}
	p, err := t.al.Alloc(size, 0)
	if errors.Is(err, driver.ErrOutOfMemory) && m.trimOthersLocked(t) > 0 {
		// Other tags held free memory the device now lacks: it went back;
		// the allocation is tried once more.
		p, err = t.al.Alloc(size, 0)
	}
	if err != nil {
		err = errors.Wrapf(err, "sleep: alloc in tag %q", tag)
		if fresh {
			// The tag is this call's, and holds nothing: a refused first
			// allocation leaves no tag behind, as if never asked.
			err = errors.CombineErrors(err, m.dropTagLocked(t))
		}
		return 0, err
	}
	t.live[p] = size
	m.owner[p] = t
	m.checkAfter("alloc")
	return p, nil
}

// Free ends the allocation at p, first revoking the lease of the tensors
// Tensor made over it (waiting for their accesses in flight, without the
// Manager's lock). In a sleeping tag it also gives back that allocation's
// backup at once (its host buffer, or its blocks of the backup file,
// where the file system can punch holes); its memory went back at sleep,
// and nothing is given back twice: a free only edits the tag's books
// while it sleeps. A Free in a tag that a Sleep or Wake is
// busy with waits for it to return; in other tags it goes on meanwhile.
func (m *Manager) Free(p driver.Addr) error {
	if err := m.begin("Free"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	t := m.owner[p]
	for t != nil && t.busy { // a sleep or wake of its tag: the free follows it
		if err := m.waitLocked("Free"); err != nil {
			return err
		}
		t = m.owner[p]
	}
	if t == nil {
		return errors.Wrapf(driver.ErrNotAllocated, "sleep: free %s: not a live allocation of this Manager (freed twice?)", p)
	}
	if l := t.leases[p]; l != nil {
		// The revoke waits for accesses in flight, which may be long (a
		// transfer): without mu, the tag claimed so that no call on it
		// comes between, as a Sleep claims it.
		delete(t.leases, p)
		t.busy = true
		m.unlocked(l.Revoke)
		t.busy = false
		m.settled.Broadcast()
	}
	if err := t.al.Free(p); err != nil {
		return errors.Wrapf(err, "sleep: free in tag %q", t.name)
	}
	delete(t.live, p)
	delete(m.owner, p)
	var err error
	if t.bk != nil {
		err = t.bk.drop(p)
	}
	m.checkAfter("free")
	return err
}

// Size is the size asked for by the live allocation at p.
func (m *Manager) Size(p driver.Addr) (uint64, error) {
	if err := m.begin("Size"); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	t := m.owner[p]
	if t == nil {
		return 0, errors.Wrapf(driver.ErrNotAllocated, "sleep: size of %s: not a live allocation of this Manager", p)
	}
	return t.live[p], nil
}

// Tag names the tag of the live allocation at p.
func (m *Manager) Tag(p driver.Addr) (string, error) {
	if err := m.begin("Tag"); err != nil {
		return "", err
	}
	defer m.mu.Unlock()
	t := m.owner[p]
	if t == nil {
		return "", errors.Wrapf(driver.ErrNotAllocated, "sleep: tag of %s: not a live allocation of this Manager", p)
	}
	return t.name, nil
}

// AddStream names a stream whose work may use the Manager's memory:
// Sleep synchronizes it before it copies or unmaps anything, so no
// kernel or copy still queued touches memory that is going away. The
// driver must implement driver.Streams.
func (m *Manager) AddStream(s driver.Stream) error {
	if err := m.begin("AddStream"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if _, ok := m.d.(driver.Streams); !ok || !m.d.Supports(driver.FeatureStreams) {
		return errors.Wrapf(driver.ErrUnsupported, "sleep: add stream: the %s driver has no streams", m.d.Name())
	}
	if s == 0 {
		return errors.Wrap(driver.ErrInvalid, "sleep: add stream: stream 0 is never valid")
	}
	m.streams[s] = struct{}{}
	return nil
}

// RemoveStream forgets a stream AddStream named (before it is destroyed).
func (m *Manager) RemoveStream(s driver.Stream) error {
	if err := m.begin("RemoveStream"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if _, ok := m.streams[s]; !ok {
		return errors.Wrapf(driver.ErrInvalid, "sleep: remove stream %d: not added", s)
	}
	delete(m.streams, s)
	return nil
}

// selectLocked returns the tags named (all, sorted, for none). A name
// with no tag is ErrInvalid.
func (m *Manager) selectLocked(op string, names []string) ([]*tag, error) {
	if len(names) == 0 {
		ts := make([]*tag, 0, len(m.tags))
		for _, t := range m.tags {
			ts = append(ts, t)
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
		return ts, nil
	}
	ts := make([]*tag, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		t := m.tags[n]
		if t == nil {
			return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "sleep: %s: no tag %q (a tag exists from its first allocation)", op, n),
				"allocate under the tag first, or leave the tags out to mean all")
		}
		if !seen[n] {
			seen[n] = true
			ts = append(ts, t)
		}
	}
	return ts, nil
}

// Sleep puts the tags named (every tag, for none) to sleep in mode: it
// synchronizes the device (where the driver is a DeviceSyncer) and the
// streams AddStream named, revokes the leases of the tag's tensors
// (Tensor; waiting for their accesses in flight), keeps each live
// allocation's bytes as mode says, then gives back all the tag's memory,
// keeping its address space and books. A tag already asleep is left as
// it is (Sleep is idempotent). The tags are put to sleep one by one: on an error the
// tags before it sleep, it and those after stay awake, unchanged.
//
// Calls on other tags go on while it copies and gives memory back; a
// call on one of its tags (Alloc, Free, another Sleep or Wake) waits
// until it returns, and so does Sleep for a tag another Sleep or Wake is
// busy with.
func (m *Manager) Sleep(mode Mode, tags ...string) error {
	if err := m.begin("Sleep"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if !mode.valid() {
		return errors.Wrapf(driver.ErrInvalid, "sleep: sleep: unknown mode %d (Discard, Host or File)", int(mode))
	}
	ts, err := m.claimLocked("sleep", tags)
	if err != nil {
		return err
	}
	defer m.settleLocked("sleep", ts)
	if err := m.syncLocked(); err != nil {
		return err
	}
	for _, t := range ts {
		if t.asleep {
			continue
		}
		var bk *backup
		var asleep bool
		ls := t.takeLeasesLocked() // revoked even if the sleep fails: the tensors are asked for again
		m.unlocked(func() {
			revokeAll(ls)
			bk, asleep, err = m.sleepTag(t, mode)
		})
		if asleep {
			t.asleep, t.mode, t.bk = true, mode, bk
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// claimLocked selects the tags named (selectLocked), waits until none of
// them is busy and marks them busy.
func (m *Manager) claimLocked(op string, names []string) ([]*tag, error) {
	for {
		ts, err := m.selectLocked(op, names)
		if err != nil {
			return nil, err
		}
		free := true
		for _, t := range ts {
			free = free && !t.busy
		}
		if free {
			for _, t := range ts {
				t.busy = true
			}
			return ts, nil
		}
		if err := m.waitLocked(op); err != nil {
			return nil, err
		}
	}
}

// settleLocked ends the claim of claimLocked, checks the invariants
// (under the invariants build tag: after op, whether it succeeded or not)
// and wakes the calls waiting.
func (m *Manager) settleLocked(op string, ts []*tag) {
	for _, t := range ts {
		t.busy = false
	}
	m.checkAfter(op)
	m.settled.Broadcast()
}

// unlocked runs f with mu released.
func (m *Manager) unlocked(f func()) {
	m.mu.Unlock()
	defer m.mu.Lock()
	f()
}

// DeviceSyncer is implemented by drivers that can wait for all the work
// queued on a device, on every stream — also streams this library did not
// make, such as PyTorch's (cuCtxSynchronize, aclrtSynchronizeDevice).
// Sleep calls it, when the driver has it, before it copies or unmaps
// anything, as well as synchronizing the streams AddStream named. Every
// driver of this module implements it (host and sim: their own streams;
// cuda and acl: the whole device). One answering ErrUnsupported (a vendor
// library lacking the call) is passed over: Sleep then waits for the
// streams AddStream named only.
type DeviceSyncer interface {
	SyncDevice(dev driver.DeviceID) error
}

// syncLocked waits for the device (DeviceSyncer) and for the work queued
// on every stream AddStream named.
func (m *Manager) syncLocked() error {
	if ds, ok := m.d.(DeviceSyncer); ok {
		// ErrUnsupported: a vendor library without the call (the driver
		// has waited for its own streams); the streams AddStream named
		// are still waited for below.
		if err := ds.SyncDevice(m.o.Device); err != nil && !errors.Is(err, driver.ErrUnsupported) {
			return errors.Wrapf(err, "sleep: synchronize device %d before sleep", m.o.Device)
		}
	}
	if len(m.streams) == 0 {
		return nil
	}
	s := m.d.(driver.Streams)
	var errs error
	for st := range m.streams {
		if err := s.SyncStream(st); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "sleep: synchronize stream %d before sleep", st))
		}
	}
	return errs
}

// sleepTag puts the awake tag t to sleep in mode, without mu: t is busy.
// It returns the backup to record and whether the tag sleeps now (also
// when err is a release the real driver refused, retried later).
func (m *Manager) sleepTag(t *tag, mode Mode) (*backup, bool, error) {
	if m.hook != nil {
		m.hook("sleep", t.name)
	}
	// The backup first (of the live allocations only): a sleep it
	// refuses (a BackupDir that cannot be written, no host access) leaves
	// the tag as it was, its free chunks still committed for its next
	// allocations.
	bk, err := takeBackup(m.cache, mode, m.o.BackupDir, t.name, t.live)
	if err != nil {
		return nil, false, err
	}
	// Free chunks go back for good: they need no backup, and wake need
	// not commit them again.
	if err := t.al.Trim(); err != nil {
		return nil, false, errors.CombineErrors(errors.Wrapf(err, "sleep: tag %q: give back free memory", t.name), bk.free())
	}
	if err := t.drv.sleep(); err != nil && !t.drv.isAsleep() {
		return nil, false, errors.CombineErrors(err, bk.free())
	} else if err != nil {
		return bk, true, err // asleep, with a release to retry
	}
	return bk, true, nil
}

// Wake wakes the tags named (every tag, for none): it commits their
// memory again, maps it at the same addresses with the same access and
// restores their contents (Host, File; Discard leaves what new memory
// holds), then gives back the backups. A tag already awake is left as it
// is (Wake is idempotent). A tag whose wake fails part-way — out of
// memory, a refused map, a restore that fails — is put back to sleep
// with its backup whole and nothing leaked; the tags before it are awake.
// As with Sleep, calls on other tags go on meanwhile and calls on its
// tags wait for it.
func (m *Manager) Wake(tags ...string) error {
	if err := m.begin("Wake"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	ts, err := m.claimLocked("wake", tags)
	if err != nil {
		return err
	}
	defer m.settleLocked("wake", ts)
	for _, t := range ts {
		if !t.asleep {
			continue
		}
		var w woken
		m.unlocked(func() { w, err = m.wakeTag(t) })
		if w == wokeSleepsOn && errors.Is(err, driver.ErrOutOfMemory) && m.trimOthersLocked(t) > 0 {
			// The wake undid itself; the free memory other tags held went
			// back, and it is tried once more.
			m.unlocked(func() { w, err = m.wakeTag(t) })
		}
		if w == wokeSleepsOn {
			return err
		}
		bk := t.bk
		t.asleep, t.bk = false, nil
		if w == wokeWhole {
			t.cycles++
		}
		var ferr error
		m.unlocked(func() { ferr = bk.free() })
		if ferr != nil && w == wokeWhole {
			ferr = errors.Wrapf(ferr, "sleep: wake tag %q: the tag is awake with its contents, but its backup was not all given back", t.name)
		}
		if err = errors.CombineErrors(err, ferr); err != nil { // contents lost, a release refused again (the tag is whole), or a backup left behind
			return err
		}
	}
	return nil
}

// Trim gives back the free memory of the tags named (every tag, for
// none): every wholly free chunk of an awake tag goes back to the device
// (arena.Allocator.Trim), so that its AwakeBytes cover only its live
// allocations and the chunks they partly use. A sleeping tag holds no
// memory and is left as it is; a tag a Sleep or Wake is busy with is
// trimmed after it returns. Alloc and Wake trim the other tags on their
// own when the device runs out of memory, and try once more.
func (m *Manager) Trim(tags ...string) error {
	if err := m.begin("Trim"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	ts, err := m.claimLocked("trim", tags)
	if err != nil {
		return err
	}
	defer m.settleLocked("trim", ts)
	var errs error
	for _, t := range ts {
		if t.asleep {
			continue
		}
		if err := t.al.Trim(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "sleep: trim tag %q", t.name))
		}
	}
	return errs
}

// trimOthersLocked gives back the free memory of every awake tag but
// skip that no Sleep or Wake is busy with, and returns how many bytes
// went back. It runs only when the device is out of memory, so its walk
// over the tags is off every hot path. A trim that fails counts for what
// it gave back before failing; its error is the caller's out-of-memory.
func (m *Manager) trimOthersLocked(skip *tag) uint64 {
	var freed uint64
	for _, t := range m.tags {
		if t == skip || t.busy || t.asleep {
			continue
		}
		before, _ := t.drv.figures()
		_ = t.al.Trim()
		after, _ := t.drv.figures()
		freed += before - after
	}
	return freed
}

// woken is how a tag's wake ended.
type woken int

const (
	wokeWhole    woken = iota // awake with its contents
	wokeSleepsOn              // still asleep, its backup whole
	wokeLost                  // awake, its contents lost: it could not be put back to sleep
)

// wakeTag wakes the sleeping tag t, without mu (t is busy), and restores
// its contents; the caller records the outcome and frees the backup
// unless the tag sleeps on. An error with wokeWhole is a release owed
// from before sleep that the real driver refused again: it is retried
// later, and the tag's memory is whole.
func (m *Manager) wakeTag(t *tag) (woken, error) {
	if m.hook != nil {
		m.hook("wake", t.name)
	}
	werr := t.drv.wake()
	if werr != nil && t.drv.isAsleep() {
		return wokeSleepsOn, errors.Wrapf(werr, "sleep: wake tag %q (it sleeps on)", t.name)
	}
	if err := t.bk.restore(); err != nil {
		err = errors.Wrapf(err, "sleep: wake tag %q: restore its contents", t.name)
		if serr := t.drv.sleep(); serr != nil && !t.drv.isAsleep() {
			// It could not be put back to sleep: awake, contents lost.
			return wokeLost, errors.CombineErrors(err, serr)
		}
		return wokeSleepsOn, errors.Wrap(err, "sleep: it sleeps on, its backup whole")
	}
	return wokeWhole, werr
}

// TagStats are one tag's figures.
type TagStats struct {
	Tag    string
	Live   int  // live allocations
	Asleep bool // whether the tag sleeps now
	Mode   Mode // of the last Sleep
	// AwakeBytes is the memory committed under the tag now; AsleepBytes
	// the memory Sleep gave back that Wake commits again; BackupBytes the
	// bytes of live allocations held in host memory or a file.
	AwakeBytes, AsleepBytes, BackupBytes uint64
	Cycles                               int // completed sleep+wake cycles
}

// Stats returns every tag's figures, sorted by tag.
func (m *Manager) Stats() []TagStats {
	if m.begin("Stats") != nil {
		return nil
	}
	defer m.mu.Unlock()
	ts, _ := m.selectLocked("stats", nil)
	out := make([]TagStats, 0, len(ts))
	for _, t := range ts {
		aw, as := t.drv.figures()
		s := TagStats{Tag: t.name, Live: len(t.live), Asleep: t.asleep, Mode: t.mode, AwakeBytes: aw, AsleepBytes: as, Cycles: t.cycles}
		if t.bk != nil {
			s.BackupBytes = t.bk.bytes
		}
		out = append(out, s)
	}
	return out
}

func (m *Manager) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("sleep: "+op, m.checkLocked())
	}
}

// Check verifies the invariants of the type's doc, each tag's allocator
// and the records under it against the driver, and returns every
// violation.
func (m *Manager) Check() error {
	if err := m.begin("Check"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	return m.checkLocked()
}

func (m *Manager) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if held := m.cache.held(); held > m.o.HostCache {
		fail("sleep: %d bytes of host buffers kept, past the HostCache of %d", held, m.o.HostCache)
	}
	owned := 0
	for name, t := range m.tags {
		owned += len(t.live)
		if t.busy {
			// A Sleep or Wake is changing it without mu: its books are
			// checked when it settles.
			continue
		}
		if st := t.al.Stats(); st.Live != len(t.live) {
			fail("sleep: tag %q has %d live allocations, its allocator %d", name, len(t.live), st.Live)
		}
		for p, l := range t.leases {
			if _, ok := t.live[p]; !ok {
				fail("sleep: tag %q holds a lease over %s, which is not live", name, p)
			}
			if l.Revoked() {
				fail("sleep: tag %q lists a revoked lease over %s", name, p)
			}
		}
		if t.asleep && len(t.leases) > 0 {
			fail("sleep: tag %q is asleep with %d leases listed", name, len(t.leases))
		}
		for p, n := range t.live {
			if m.owner[p] != t {
				fail("sleep: the allocation %s of tag %q is not indexed under it", p, name)
			}
			if got, err := t.al.Size(p); err != nil || got != n {
				fail("sleep: the allocation %s of tag %q is %d bytes, its allocator says %d (%v)", p, name, n, got, err)
			}
		}
		if t.asleep != t.drv.isAsleep() {
			fail("sleep: tag %q asleep is %v, its driver's %v", name, t.asleep, t.drv.isAsleep())
		}
		switch {
		case !t.asleep && t.bk != nil:
			fail("sleep: tag %q is awake and holds a backup", name)
		case t.asleep && t.bk == nil:
			fail("sleep: tag %q is asleep with no backup record", name)
		case t.asleep && t.mode != Discard:
			var sum uint64
			for p, pc := range t.bk.at {
				sum += pc.size
				if t.live[p] != pc.size {
					fail("sleep: tag %q backs up %s (%d bytes), which is not live at that size", name, p, pc.size)
				}
			}
			if len(t.bk.at) != len(t.live) || sum != t.bk.bytes {
				fail("sleep: tag %q backs up %d allocations (%d bytes, counted %d) of %d live", name, len(t.bk.at), sum, t.bk.bytes, len(t.live))
			}
		case t.asleep && len(t.bk.at) > 0:
			fail("sleep: tag %q sleeps in discard mode with a backup", name)
		}
		if !t.asleep {
			errs = errors.CombineErrors(errs, t.al.Check())
		}
		errs = errors.CombineErrors(errs, t.drv.check())
	}
	if owned != len(m.owner) {
		fail("sleep: %d allocations indexed, the tags hold %d", len(m.owner), owned)
	}
	return errs
}

// Close gives back every tag's memory, backups and address space, after
// any Sleep or Wake in progress returns. It refuses (ErrBusy) while
// allocations are live: their memory may still be in use. Free them
// first (each Free revokes the lease of its tensors; Close revokes any
// lease still listed, though none can be).
func (m *Manager) Close() error {
	if err := m.begin("Close"); err != nil {
		return err
	}
	defer m.mu.Unlock()
	for m.anyBusyLocked() {
		if err := m.waitLocked("Close"); err != nil {
			return err
		}
	}
	if n := len(m.owner); n > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "sleep: close: %d allocation(s) still live", n),
			"free every allocation before closing the Manager")
	}
	var errs error
	for name, t := range m.tags {
		// Free revoked every lease and nothing is live, so none is
		// listed; were one, no access may go on past Close.
		revokeAll(t.takeLeasesLocked())
		if t.bk != nil {
			errs = errors.CombineErrors(errs, t.bk.free())
			t.bk = nil
		}
		if err := t.al.Close(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "sleep: close tag %q", name))
			continue
		}
		errs = errors.CombineErrors(errs, t.drv.Close())
		delete(m.tags, name)
	}
	if errs != nil {
		return errs
	}
	if err := m.cache.close(); err != nil {
		return err
	}
	m.closed = true
	return nil
}

// HostCached is how many bytes of pinned host memory the Manager keeps
// for later backups (Options.HostCache); 0 without a HostCache.
func (m *Manager) HostCached() uint64 {
	if m.unmade() || m.cache == nil {
		return 0
	}
	return m.cache.held()
}

func (m *Manager) anyBusyLocked() bool {
	for _, t := range m.tags {
		if t.busy {
			return true
		}
	}
	return false
}

func (t *tag) String() string { return fmt.Sprintf("tag %q", t.name) }
