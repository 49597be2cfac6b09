package ipc

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/vaspace"
)

// Sharing pools (CUDA's cudaMemPoolExportToShareableHandle,
// cudaMemPoolImportFromShareableHandle, cudaMemPoolExportPointer,
// cudaMemPoolImportPointer). The exporter sends a pool once, then single
// allocations as pointers: the chunks an allocation lies on travel first
// (each once per connection, as long as it stays where it was sent), then
// its offset and size. The importer maps the chunks at the same offsets of
// a reservation of its own; its ImportedPool cannot allocate. As the seed
// requires, importers free first: the exporting pool refuses FreeAsync of
// a pointer until every importer has sent its release.
//
// An importer that exits without freeing (it crashed, it was killed) can
// send no release. The connection counts, per pool pointer, the imports
// its peer holds (Holds), and watches the peer process through a pidfd
// taken when the connection was made: once that process has exited, its
// mappings are gone with it and its imports are released — by RecvRelease
// when it sees the connection end, or by ReleaseIfGone at any time, Close
// included. While the process lives its imports stay held, connected or
// not: it may still map the memory. A peer releases only what it was sent
// on its own connection. Those imports are the connection's
// (pool.ExportPointerFor with its pool.ImportHolder): a pool.ReleaseImport
// of one by hand is refused, so that the pool, the connection's Holds and
// the pidfd it keeps while its peer holds anything never disagree.
//
// A pool gives memory back from anywhere and may later commit a new chunk
// where an old one was, so a chunk is known by its offset and its identity
// (the exporter's handle): the exporter sends a chunk again when the one
// at an offset is not the one it sent there, and the importer then
// replaces the chunks it maps over that range — unless an imported pointer
// it has not freed lies on them, which is refused (ErrBusy).

// More message kinds.
const (
	KindPool      Kind = 5 // payload: pool id, max size
	KindPoolChunk Kind = 6 // payload: pool id, offset, size, chunk identity, and a token or one descriptor
)

var poolIDs atomic.Uint64

// ExportedPool is a pool offered to other processes.
type ExportedPool struct {
	p     *pool.Pool
	id    uint64
	mu    lockrank.Mutex[lockrank.IPCExportedPool]
	allow []int
}

// ExportPool offers p, which must have been created Shareable, to the
// processes allowPIDs names.
func ExportPool(p *pool.Pool, allowPIDs ...int) (*ExportedPool, error) {
	if p == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "ipc: export pool: the pool is nil")
	}
	if !p.Props().Shareable {
		return nil, errors.WithHint(errors.Wrap(driver.ErrInvalid, "ipc: export pool: it was created without pool.Props.Shareable"),
			"create pools meant for other processes shareable")
	}
	if err := driver.CheckPIDs(func() string { return "ipc: export pool" }, allowPIDs); err != nil {
		return nil, err
	}
	id := uint64(os.Getpid())<<32 | poolIDs.Add(1)
	return &ExportedPool{p: p, id: id, allow: slices.Clone(allowPIDs)}, nil
}

// made returns ErrInvalid for an ExportedPool that ExportPool did not
// make (nil, or a zero ExportedPool).
func (ep *ExportedPool) made(op string) error {
	if ep == nil || ep.p == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: %s: the exported pool is nil or was not made by ExportPool", op),
			"export pools with ipc.ExportPool")
	}
	return nil
}

// SetAllowedPIDs replaces the processes allowed to import the pool.
func (ep *ExportedPool) SetAllowedPIDs(pids ...int) error {
	if err := ep.made("set allowed PIDs"); err != nil {
		return err
	}
	if err := driver.CheckPIDs(func() string { return "ipc: set allowed PIDs of an exported pool" }, pids); err != nil {
		return err
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.allow = slices.Clone(pids)
	return nil
}

func (ep *ExportedPool) allowed(pid int) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return slices.Contains(ep.allow, pid)
}

// refuse tells the peer it is not allowed and returns ErrAccessDenied.
func (c *Conn) refuse(what string) error {
	reason := fmt.Sprintf("process %d is not on the allow-list of %s", c.PeerPID(), what)
	err := errors.Wrapf(driver.ErrAccessDenied, "ipc: %s", reason)
	return errors.CombineErrors(err, c.send(KindRefused, 0, []byte(reason)))
}

func u64s(vs ...uint64) []byte {
	b := make([]byte, 8*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func readU64s(m *message, n int) ([]uint64, error) {
	if len(m.body) != 8*n || len(m.fds) != 0 && m.kind != KindPoolChunk {
		return nil, sentinel.Mark(errors.Newf("ipc: a %s message of %d bytes and %d descriptors", m.kind, len(m.body), len(m.fds)), ErrProtocol)
	}
	vs := make([]uint64, n)
	for i := range vs {
		vs[i] = binary.LittleEndian.Uint64(m.body[8*i:])
	}
	return vs, nil
}

// SendPool sends the pool to the peer, if allowed.
func (c *Conn) SendPool(ep *ExportedPool) error {
	if err := c.open("send pool"); err != nil {
		return err
	}
	if err := ep.made("send pool"); err != nil {
		return err
	}
	if !ep.allowed(c.PeerPID()) {
		return c.refuse(fmt.Sprintf("pool %#x", ep.id))
	}
	if err := c.send(KindPool, 0, u64s(ep.id, ep.p.Max())); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pools == nil {
		c.pools = map[uint64]bool{}
	}
	c.pools[ep.id] = true
	return nil
}

// SendPointer sends one live allocation of the pool: the chunks it lies on
// that this connection has not sent yet, then the pointer. The pool then
// refuses to free it until the peer releases it (RecvRelease). A pool
// not sent on this connection first (SendPool) is refused (ErrInvalid),
// with nothing counted: its peer could not take the pointer, nor ever
// release it.
func (c *Conn) SendPointer(ep *ExportedPool, ptr driver.Addr) error {
	if err := c.open("send pointer"); err != nil {
		return err
	}
	if err := ep.made("send pointer"); err != nil {
		return err
	}
	if !ep.allowed(c.PeerPID()) {
		return c.refuse(fmt.Sprintf("pool %#x", ep.id))
	}
	c.mu.Lock()
	sentPool := c.pools[ep.id]
	c.mu.Unlock()
	if !sentPool {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ipc: send pointer %v of pool %#x: the pool was not sent on this connection", ptr, ep.id),
			"send the pool first (SendPool), then its pointers")
	}
	// ExportPointer counts an import: the pool cannot free ptr, nor unmap
	// the chunks under it, until the peer releases it (or this fails).
	xp, err := ep.p.ExportPointerFor(c.holder, ptr, c.PeerPID())
	if err != nil {
		return errors.Wrap(err, "ipc: send pointer")
	}
	return errors.Wrap(c.sendPointer(ep, xp), "ipc: send pointer")
}

// sentChunk is what a connection sent of a pool at one offset.
type sentChunk struct {
	size uint64
	id   driver.Handle
}

// sendPointer sends the chunks under xp this connection has not sent as
// they are now, then the pointer. On failure the import ExportPointerFor
// counted for it is released, unless a release came for it meanwhile.
func (c *Conn) sendPointer(ep *ExportedPool, xp pool.ExportedPointer) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	ptr := ep.p.Base() + driver.Addr(xp.Offset)
	if c.sent == nil {
		c.sent = map[uint64]map[uint64]sentChunk{}
	}
	sent := c.sent[ep.id]
	if sent == nil {
		sent = map[uint64]sentChunk{}
		c.sent[ep.id] = sent
	}
	for _, ch := range xp.Chunks {
		if sent[ch.Offset] == (sentChunk{size: ch.Size, id: ch.ID}) {
			continue
		}
		var err error
		switch ch.Shareable.Type {
		case driver.HandlePOSIXFD:
			err = c.send(KindPoolChunk, driver.HandlePOSIXFD, u64s(ep.id, ch.Offset, ch.Size, uint64(ch.ID)), ch.Shareable.FD)
		case driver.HandleToken:
			err = c.send(KindPoolChunk, driver.HandleToken, u64s(ep.id, ch.Offset, ch.Size, uint64(ch.ID), ch.Shareable.Token))
		default:
			err = errors.Wrapf(driver.ErrUnsupported, "ipc: handle type %d does not travel over a socket", ch.Shareable.Type)
		}
		if err != nil {
			return errors.CombineErrors(err, ep.p.ReleaseImportFor(c.holder, ptr))
		}
		// The importer replaced whatever it mapped over this range.
		for off, sc := range sent {
			if off < ch.Offset+ch.Size && ch.Offset < off+sc.size {
				delete(sent, off)
			}
		}
		sent[ch.Offset] = sentChunk{size: ch.Size, id: ch.ID}
	}
	// Counted before the pointer goes out, so that a release racing in on
	// another goroutine finds it; c.mu is not held across the send, so
	// that Close and the releases go on while a peer that reads nothing
	// stalls it.
	c.mu.Lock()
	if c.holds == nil {
		c.holds = map[*ExportedPool]map[driver.Addr]int{}
	}
	if c.holds[ep] == nil {
		c.holds[ep] = map[driver.Addr]int{}
	}
	c.holds[ep][ptr]++
	c.mu.Unlock()
	err := c.send(KindPointer, 0, u64s(ep.id, xp.Offset, xp.Size))
	if err == nil {
		return nil
	}
	c.mu.Lock()
	if c.holds[ep][ptr] > 0 { // not released meanwhile (RecvRelease, ReleaseIfGone)
		c.dropHoldLocked(ep, ptr)
		err = errors.CombineErrors(err, ep.p.ReleaseImportFor(c.holder, ptr))
	}
	c.mu.Unlock()
	c.dropPeerIfDone() // a Close meanwhile left the peer watched for this hold
	return err
}

// RecvRelease waits for the peer to release one pointer of the pool and
// records it; it returns the pointer, which the pool may now free. A peer
// may release only what it was sent on this connection and holds
// (ErrNotAllocated otherwise).
//
// When the connection ends (ErrClosed) while the peer still holds
// imports, RecvRelease waits up to PeerExitWait for the peer process to
// exit — a process that dies closes its sockets a moment before it is
// gone — and if it has, releases every import it held, as ReleaseIfGone
// does, and says so; if it lives, nothing is released (it may still map
// the memory) and the error says to call ReleaseIfGone once it exits.
func (c *Conn) RecvRelease(ep *ExportedPool) (driver.Addr, error) {
	if err := c.open("receive release"); err != nil {
		return 0, err
	}
	if err := ep.made("receive release"); err != nil {
		return 0, err
	}
	m, err := c.recv()
	if errors.Is(err, driver.ErrClosed) {
		return 0, c.peerClosed(err)
	}
	if err != nil {
		return 0, err
	}
	defer closeAll(m.fds)
	return c.applyRelease(m, func(id uint64) (*ExportedPool, error) {
		if id != ep.id {
			return nil, errors.Wrapf(driver.ErrInvalid, "ipc: receive release: pool %#x is unknown here (this one is %#x)", id, ep.id)
		}
		return ep, nil
	})
}

// applyRelease checks the release message m and releases the import it
// names, in the exported pool that pool returns for its id.
func (c *Conn) applyRelease(m *message, pool func(id uint64) (*ExportedPool, error)) (driver.Addr, error) {
	if m.kind != KindRelease {
		return 0, sentinel.Mark(errors.Newf("ipc: receive release: a %s message came", m.kind), ErrProtocol)
	}
	vs, err := readU64s(m, 2)
	if err != nil {
		return 0, err
	}
	ep, err := pool(vs[0])
	if err != nil {
		return 0, err
	}
	ptr := ep.p.Base() + driver.Addr(vs[1])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holds[ep][ptr] == 0 {
		return 0, errors.Wrapf(driver.ErrNotAllocated,
			"ipc: receive release of %s (offset %#x of pool %#x): process %d holds no import of it on this connection (released twice, or never sent it)",
			ptr, vs[1], ep.id, c.PeerPID())
	}
	if err := ep.p.ReleaseImportFor(c.holder, ptr); err != nil {
		return 0, errors.Wrap(err, "ipc: receive release")
	}
	c.dropHoldLocked(ep, ptr)
	return ptr, nil
}

// applyQueuedReleases reads the messages the peer sent that no
// RecvRelease read — the releases of a peer that freed its pointers and
// closed before the exporter asked — and applies each release, as
// RecvRelease would. It reads no more messages than the peer holds
// imports when it starts, plus maxQueuedOther (it closes the descriptors
// of any other kind), so a peer cannot keep it reading; it never waits. It returns the errors of
// releases it refused.
func (c *Conn) applyQueuedReleases() error {
	var errs error
	for budget := c.Holds() + maxQueuedOther; budget > 0 && c.Holds() > 0; budget-- {
		m, ok, err := c.recvQueued()
		if errors.Is(err, ErrProtocol) {
			continue // its descriptors are closed; a release may follow
		}
		if err != nil {
			return errors.CombineErrors(errs, err)
		}
		if !ok {
			break
		}
		closeAll(m.fds)
		if m.kind == KindRelease {
			_, err = c.applyRelease(m, c.heldPool)
			errs = errors.CombineErrors(errs, err)
		}
	}
	return errs
}

// maxQueuedOther is how many messages beyond one per import the peer
// holds Close reads before it stops looking for releases: other kinds,
// malformed ones and refused releases.
const maxQueuedOther = 16

// heldPool is the exported pool of id among those the peer holds imports
// of.
func (c *Conn) heldPool(id uint64) (*ExportedPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ep := range c.holds {
		if ep.id == id {
			return ep, nil
		}
	}
	return nil, errors.Wrapf(driver.ErrInvalid, "ipc: receive release: pool %#x: the peer holds no import of it on this connection", id)
}

// PeerExitWait is how long RecvRelease waits, once the connection has
// ended, for the peer process to exit before deciding it lives.
const PeerExitWait = time.Second

// exitWait is PeerExitWait, or what a test sets for the connection.
func (c *Conn) exitWait() time.Duration {
	if c.testExitWait != nil {
		return *c.testExitWait
	}
	return PeerExitWait
}

// peerClosed is RecvRelease's answer when the connection ended: cause,
// after releasing the peer's imports if it has exited.
func (c *Conn) peerClosed(cause error) error {
	n := c.Holds()
	if n == 0 {
		return cause
	}
	gone, err := c.peer.exited(c.exitWait())
	if err != nil {
		return errors.Wrapf(errors.CombineErrors(cause, err),
			"ipc: receive release: whether process %d exited is unknown, so its %d import(s) stay held", c.PeerPID(), n)
	}
	if !gone {
		return errors.WithHint(
			errors.Wrapf(cause, "ipc: receive release: process %d ended the connection but lives, and may still map what it imported: its %d import(s) stay held",
				c.PeerPID(), n),
			"call Conn.ReleaseIfGone once the process has exited")
	}
	released, err := c.ReleaseIfGone()
	if err != nil {
		return errors.CombineErrors(cause, err)
	}
	return errors.Wrapf(cause, "ipc: receive release: process %d exited; released the %d import(s) it held", c.PeerPID(), released)
}

// Holds is how many imports of pool pointers the peer holds on this
// connection: pointers sent with SendPointer (each send counts) and not
// released since. A nil Conn holds none.
func (c *Conn) Holds() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ptrs := range c.holds {
		for _, k := range ptrs {
			n += k
		}
	}
	return n
}

// PeerExited reports whether the peer process has exited: the process
// the kernel named when the connection was made (SO_PEERCRED), watched
// through a pidfd taken then, so a later process given the same PID is
// not mistaken for it. It does not wait, and it answers after Close too.
func (c *Conn) PeerExited() (bool, error) {
	if err := c.made("whether the peer exited"); err != nil {
		return false, err
	}
	return c.peer.exited(0)
}

// ReleaseIfGone releases every import the peer holds on this connection
// if its process has exited, and returns how many: its mappings went with
// it, so the pools may free those pointers (FreeAsync) and be destroyed.
// While the process lives it releases nothing and returns ErrBusy: it may
// still map the memory, and the pools go on refusing to free it:
// importers free first, as cudaMemPoolImportPointer requires. It works
// after Close too. Holding nothing, it returns 0 and no error.
//
// The process watched is the one that made the connection. If it handed
// the memory on before exiting — to a child it forked, or by exporting
// the chunks again — the library cannot see those holders; such a peer
// must free its pointers before it exits.
func (c *Conn) ReleaseIfGone() (int, error) {
	if err := c.made("release the imports of an exited peer"); err != nil {
		return 0, err
	}
	if c.Holds() == 0 {
		return 0, nil
	}
	gone, err := c.peer.exited(0)
	if err != nil {
		return 0, errors.NewAssertionErrorWithWrappedErrf(err, "ipc: release the imports of process %d: whether it exited is unknown", c.PeerPID())
	}
	c.mu.Lock()
	n := 0
	for _, ptrs := range c.holds {
		for _, k := range ptrs {
			n += k
		}
	}
	if !gone {
		c.mu.Unlock()
		return 0, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "ipc: release the imports of process %d: it lives, and may still map them: its %d import(s) stay held", c.PeerPID(), n),
			"have it free its pointers (ImportedPool.Free), or call ReleaseIfGone again once it has exited")
	}
	var errs error
	for ep, ptrs := range c.holds {
		for ptr, k := range ptrs {
			for range k {
				errs = errors.CombineErrors(errs, ep.p.ReleaseImportFor(c.holder, ptr))
			}
		}
	}
	c.holds = nil
	c.mu.Unlock()
	c.dropPeerIfDone()
	if errs != nil {
		return n, errors.NewAssertionErrorWithWrappedErrf(errs, "ipc: release the imports of exited process %d: the pools did not count them", c.PeerPID())
	}
	return n, nil
}

// dropHoldLocked forgets one import of ptr; c.mu is held.
func (c *Conn) dropHoldLocked(ep *ExportedPool, ptr driver.Addr) {
	if c.holds[ep][ptr]--; c.holds[ep][ptr] == 0 {
		delete(c.holds[ep], ptr)
		if len(c.holds[ep]) == 0 {
			delete(c.holds, ep)
		}
	}
}

// ImportedPool is another process's pool as this process sees it: the
// chunks of the pointers it received, mapped at the exporter's offsets.
// It cannot allocate.
//
// Invariants: chunks are sorted by offset and disjoint, each mapped whole
// at res.Base()+off, read-write for dev; every imported pointer lies on
// mapped chunks.
type ImportedPool struct {
	id   uint64
	dev  driver.DeviceID
	mem  *physical.Memory
	res  *vaspace.Reservation
	own  *vaspace.Owner // keeps res: nobody else can free it (vaspace.Space.ReserveFor)
	tab  *mapping.Table
	conn *Conn

	// recv is held by a RecvPointer from its first message to its last,
	// across the waits for the peer; it guards no field, and is taken
	// before mu, which each message takes once it has arrived.
	recv lockrank.Mutex[lockrank.IPCReceive]
	// mu guards the fields below and the page table's mappings.
	mu     lockrank.Mutex[lockrank.IPCImportedPool]
	chunks ranges.List[uint64, importedChunk] // by offset
	ptrs   map[driver.Addr]importedPtr        // imported pointers
	closed bool
}

// importedPtr is a pointer this process imported: its size, and how many
// times it came (the exporter counts each send as an import, and each
// Free releases one).
type importedPtr struct {
	size uint64
	n    int
}

// importedChunk is a chunk of the exporter's pool mapped here.
type importedChunk struct {
	id uint64 // the exporter's identity of the chunk
	c  *physical.Chunk
}

// RecvPool receives a pool from the peer and reserves room for it; its
// memory is mapped as pointers arrive (RecvPointer), read-write for dev.
// An address space or memory that is nil, has no driver or is on another
// driver than the other, or a device they lack, is refused before any
// message is read.
func (c *Conn) RecvPool(space *vaspace.Space, mem *physical.Memory, dev driver.DeviceID) (*ImportedPool, error) {
	if err := c.open("receive pool"); err != nil {
		return nil, err
	}
	d := space.Driver()
	if d == nil {
		return nil, errors.WithHint(errors.Wrap(driver.ErrInvalid, "ipc: receive pool: the address space is nil or has no driver"),
			"make the space with vaspace.New(d) of an open driver")
	}
	if err := driver.CheckComparable(func() string { return "ipc: receive pool" }, d); err != nil {
		return nil, err
	}
	if err := importer("receive pool", mem, dev); err != nil {
		return nil, err
	}
	if mem.Driver() != d {
		return nil, errors.Wrap(driver.ErrInvalid, "ipc: receive pool: the address space and the physical memory are on different drivers")
	}
	m, err := c.recv()
	if err != nil {
		return nil, err
	}
	defer closeAll(m.fds)
	switch m.kind {
	case KindRefused:
		return nil, errors.Wrapf(driver.ErrAccessDenied, "ipc: the sender refused: %s", m.body)
	case KindPool:
	default:
		return nil, sentinel.Mark(errors.Newf("ipc: receive pool: a %s message came", m.kind), ErrProtocol)
	}
	vs, err := readU64s(m, 2)
	if err != nil {
		return nil, err
	}
	own := vaspace.NewOwner("an imported pool")
	res, err := space.ReserveFor(own, vs[1], 0)
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: receive pool of %s", units.Bytes(vs[1]))
	}
	tab, err := mapping.NewFor(own, res, mem)
	if err != nil {
		return nil, errors.CombineErrors(err, res.FreeFor(own))
	}
	return &ImportedPool{id: vs[0], dev: dev, mem: mem, res: res, own: own, tab: tab, conn: c, ptrs: map[driver.Addr]importedPtr{}}, nil
}

// RecvPointer receives one pointer of the pool (and the chunks it needs)
// and returns its address in this process.
//
// ip must have come on this connection (RecvPool): its releases go back
// on it, to the exporter that counts them.
func (c *Conn) RecvPointer(ip *ImportedPool) (driver.Addr, error) {
	if err := c.open("receive pointer"); err != nil {
		return 0, err
	}
	if err := ip.made(func() string { return "ipc: receive pointer" }); err != nil {
		return 0, err
	}
	if ip.conn != c {
		return 0, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "ipc: receive pointer on %s: the imported pool came on another connection", c.path),
			"receive a pool's pointers on the connection RecvPool received it on")
	}
	// The wait for the peer's messages holds only recv, which keeps one
	// receiver's messages together: ip.mu is taken for each message
	// once it is in, so a stalled exporter stops no other call on ip.
	ip.recv.Lock()
	defer ip.recv.Unlock()
	if ip.isClosed() {
		return 0, driver.Closed("ipc: receive pointer into a closed imported pool")
	}
	for {
		if recvWaiting != nil {
			recvWaiting()
		}
		m, err := c.recv()
		if err != nil {
			return 0, err
		}
		ptr, done, err := ip.takeOne(m)
		closeAll(m.fds)
		if err != nil || done {
			return ptr, err
		}
	}
}

// recvWaiting, when set (tests), is called by RecvPointer just before it
// waits for the peer's next message.
var recvWaiting func()

// takeOne handles one message of a pointer transfer under ip.mu; an
// imported pool closed while the message was awaited takes nothing.
func (ip *ImportedPool) takeOne(m *message) (driver.Addr, bool, error) {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	defer ip.checkAfter("recvPointer")
	if ip.closed {
		return 0, true, driver.Closed("ipc: receive pointer into an imported pool closed while it waited")
	}
	return ip.take(m)
}

// take handles one message of a pointer transfer.
func (ip *ImportedPool) take(m *message) (driver.Addr, bool, error) {
	switch m.kind {
	case KindRefused:
		return 0, true, errors.Wrapf(driver.ErrAccessDenied, "ipc: the sender refused: %s", m.body)
	case KindPoolChunk:
		var vs []uint64
		var err error
		var sh driver.Shareable
		switch {
		case m.htype == driver.HandlePOSIXFD && len(m.fds) == 1:
			vs, err = readU64s(m, 4)
			sh = driver.Shareable{Type: driver.HandlePOSIXFD, FD: m.fds[0]}
		case m.htype == driver.HandleToken && len(m.fds) == 0:
			vs, err = readU64s(m, 5)
			if err == nil {
				sh = driver.Shareable{Type: driver.HandleToken, Token: vs[4]}
			}
		default:
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: pool chunk with %d descriptors of handle type %d", len(m.fds), m.htype)
		}
		if err != nil {
			return 0, true, err
		}
		if vs[0] != ip.id {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: a chunk of pool %#x, unknown here (this one is %#x)", vs[0], ip.id)
		}
		if err := ip.putChunk(vs[1], vs[2], vs[3], sh); err != nil {
			return 0, true, err
		}
		return 0, false, nil
	case KindPointer:
		vs, err := readU64s(m, 3)
		if err != nil {
			return 0, true, err
		}
		if vs[0] != ip.id {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: a pointer of pool %#x, unknown here (this one is %#x)", vs[0], ip.id)
		}
		off, size := vs[1], vs[2]
		if size == 0 || off+size < off || off+size > ip.res.Size() {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: a pointer of %d bytes at offset %#x: outside the pool's %s",
				size, off, units.Bytes(ip.res.Size()))
		}
		if at := ip.unmappedIn(off, off+size); at < off+size {
			return 0, true, errors.Wrapf(driver.ErrNotMapped, "ipc: pointer at offset %#x of %s: nothing is mapped at offset %#x (its chunks never came)",
				off, units.Bytes(size), at)
		}
		ptr := ip.res.Base() + driver.Addr(off)
		if p, ok := ip.ptrs[ptr]; ok && p.size != size {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: pointer at offset %#x of %s: imported already with %s",
				off, units.Bytes(size), units.Bytes(p.size))
		}
		p := ip.ptrs[ptr]
		ip.ptrs[ptr] = importedPtr{size: size, n: p.n + 1}
		return ptr, true, nil
	}
	return 0, true, sentinel.Mark(errors.Newf("ipc: receive pointer: a %s message came", m.kind), ErrProtocol)
}

// unmappedIn returns the first offset of [lo, hi) where no chunk is
// mapped, or hi when chunks cover it all.
func (ip *ImportedPool) unmappedIn(lo, hi uint64) uint64 {
	for at := lo; at < hi; {
		i, ok := ip.chunks.Find(at)
		if !ok {
			return at
		}
		at = ip.chunks.At(i).End
	}
	return hi
}

// putChunk maps the exporter's chunk id, size bytes at offset off, from
// the shareable handle sh (a descriptor the caller closes, or a token),
// replacing the chunks mapped
// over that range: the exporter gave them back and committed this one. A
// chunk already mapped there as it is changes nothing. When an imported
// pointer not yet freed lies on a chunk to replace, it is refused with
// ErrBusy; on any error nothing changes.
func (ip *ImportedPool) putChunk(off, size, id uint64, sh driver.Shareable) error {
	what := func() string {
		return fmt.Sprintf("ipc: pool chunk %d of %s at offset %#x", id, units.Bytes(size), off)
	}
	if size == 0 || off+size < off || off+size > ip.res.Size() {
		return errors.Wrapf(driver.ErrInvalid, "%s: outside the pool's %s", what(), units.Bytes(ip.res.Size()))
	}
	lo, hi := ip.chunks.Overlapping(off, off+size)
	if hi == lo+1 {
		if it := ip.chunks.At(lo); it.Start == off && it.Size() == size && it.Val.id == id {
			return nil // mapped already: nothing to do
		}
	}
	for ptr, p := range ip.ptrs {
		poff := uint64(ptr - ip.res.Base())
		for i := lo; i < hi; i++ {
			if it := ip.chunks.At(i); it.Start < poff+p.size && poff < it.End {
				return errors.WithHint(
					errors.Wrapf(driver.ErrBusy, "%s: it would replace chunk %d at offset %#x, under the imported pointer %s not yet freed",
						what(), it.Val.id, it.Start, ptr),
					"the exporter gives a chunk back only after every importer freed the pointers on it: free them first")
			}
		}
	}
	sh.Size = size
	ch, err := ip.mem.Import(sh, ip.dev)
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	// Unmap the chunks replaced, keeping their handles until the new one is
	// in, so that a failure can put them back.
	var unmapped []int
	undo := func(cause error) error {
		for _, i := range unmapped {
			it := ip.chunks.At(i)
			cause = errors.CombineErrors(cause, ip.mapRW(it.Start, it.Val.c))
		}
		return errors.CombineErrors(errors.Wrapf(cause, "%s", what()), ch.Release())
	}
	for i := lo; i < hi; i++ {
		if err := ip.tab.Unmap(ip.res.Base() + driver.Addr(ip.chunks.At(i).Start)); err != nil {
			return undo(err)
		}
		unmapped = append(unmapped, i)
	}
	if err := ip.mapRW(off, ch); err != nil {
		return undo(err)
	}
	var errs error
	for i := lo; i < hi; i++ {
		errs = errors.CombineErrors(errs, ip.chunks.At(i).Val.c.Release())
	}
	ip.chunks.Delete(lo, hi)
	if _, ok := ip.chunks.Insert(off, off+size, importedChunk{id: id, c: ch}); !ok {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("%s: the chunk overlaps one not replaced", what()))
	}
	return errors.Wrapf(errs, "%s: releasing the chunks replaced", what())
}

// mapRW maps c at offset off of the pool's reservation, read-write for the
// pool's device; on failure nothing stays mapped.
func (ip *ImportedPool) mapRW(off uint64, c *physical.Chunk) error {
	at := ip.res.Base() + driver.Addr(off)
	if err := ip.tab.Map(at, c); err != nil {
		return err
	}
	if err := ip.tab.SetAccess(at, c.Size(), ip.dev, driver.AccessReadWrite); err != nil {
		return errors.CombineErrors(err, ip.tab.Unmap(at))
	}
	return nil
}

// Chunks lists, in offset order, the offset, size and exporter's identity
// of each chunk the pool maps now.
func (ip *ImportedPool) Chunks() []ImportedChunk {
	if ip == nil || ip.tab == nil {
		return nil
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	out := make([]ImportedChunk, 0, ip.chunks.Len())
	for _, it := range ip.chunks.All() {
		out = append(out, ImportedChunk{Offset: it.Start, Size: it.Size(), ID: it.Val.id})
	}
	return out
}

// ImportedChunk describes a chunk an imported pool maps.
type ImportedChunk struct {
	Offset, Size uint64
	// ID is the exporter's identity of the chunk (its driver handle there).
	ID uint64
}

// Check verifies the imported pool's invariants and its page table's (a
// closed pool has none left to break).
func (ip *ImportedPool) Check() error {
	if err := ip.made(func() string { return "ipc: check" }); err != nil {
		return err
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	return ip.checkLocked()
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (ip *ImportedPool) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("ipc: imported pool "+op, ip.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (ip *ImportedPool) checkLocked() error {
	if ip.closed {
		return nil
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	n := 0
	for m := range ip.tab.Mappings() {
		n++
		off := uint64(m.Range.Base - ip.res.Base())
		i, ok := ip.chunks.Find(off)
		if !ok || ip.chunks.At(i).Start != off || ip.chunks.At(i).Val.c != m.Chunk {
			fail("ipc: imported pool: a mapping at offset %#x that no imported chunk accounts for", off)
		}
	}
	if n != ip.chunks.Len() {
		fail("ipc: imported pool: %d chunks recorded, %d mapped", ip.chunks.Len(), n)
	}
	if err := ip.chunks.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrap(err, "ipc: imported pool"))
	}
	for ptr, p := range ip.ptrs {
		off := uint64(ptr - ip.res.Base())
		switch {
		case p.n <= 0 || p.size == 0 || off+p.size < off || off+p.size > ip.res.Size():
			fail("ipc: imported pool: the pointer %s (%d bytes, imported %d times) does not fit the pool's %d bytes", ptr, p.size, p.n, ip.res.Size())
		case ip.unmappedIn(off, off+p.size) < off+p.size:
			fail("ipc: imported pool: the pointer %s (%d bytes) reaches offset %#x, where nothing is mapped", ptr, p.size, ip.unmappedIn(off, off+p.size))
		}
	}
	return errors.CombineErrors(errs, ip.tab.Check())
}

// MallocAsync always fails: an imported pool cannot allocate (as in CUDA),
// ErrUnsupported.
func (ip *ImportedPool) MallocAsync(uint64) (driver.Addr, error) {
	what := func() string { return "ipc: malloc async" }
	if err := ip.made(what); err != nil {
		return 0, err
	}
	if ip.isClosed() {
		return 0, driver.Closed(what() + ": the imported pool is closed")
	}
	return 0, errors.Wrap(driver.ErrUnsupported, "ipc: an imported pool cannot allocate")
}

// isClosed reports whether Close has closed the pool.
func (ip *ImportedPool) isClosed() bool {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	return ip.closed
}

// Read copies len(b) bytes at addr into b on behalf of dev, which must
// have read access (RecvPool granted its device read-write). The bytes
// must lie inside one pointer imported into the pool and not yet freed:
// the exporter's other allocations share its chunks, and are not this
// process's to touch. Outside the pool's range is ErrNotReserved, inside
// it but not within such a pointer ErrAccessDenied, after Close ErrClosed.
func (ip *ImportedPool) Read(dev driver.DeviceID, addr driver.Addr, b []byte) error {
	return ip.touch("read", dev, addr, b, (*mapping.Table).Read)
}

// Write copies b to addr on behalf of dev, which must have read-write
// access, under the same rules as Read. A refused write changes no byte.
func (ip *ImportedPool) Write(dev driver.DeviceID, addr driver.Addr, b []byte) error {
	return ip.touch("write", dev, addr, b, (*mapping.Table).Write)
}

// touch checks that [addr, addr+len(b)) lies inside one imported pointer
// and moves the bytes through the page table, whose rules (the device's
// access) apply on top.
func (ip *ImportedPool) touch(op string, dev driver.DeviceID, addr driver.Addr, b []byte,
	move func(*mapping.Table, driver.DeviceID, driver.Addr, []byte) error) error {
	what := func() string {
		return fmt.Sprintf("ipc: %s %s at %s of an imported pool for device %d", op, units.Bytes(uint64(len(b))), addr, dev)
	}
	if err := ip.made(what); err != nil {
		return err
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if ip.closed {
		return driver.Closed(what() + ": the pool is closed")
	}
	r, n := ip.res.Range(), uint64(len(b))
	if !r.Contains(addr) || n > uint64(r.End()-addr) {
		return errors.Wrapf(driver.ErrNotReserved, "%s: outside the pool's range %s", what(), r)
	}
	inside := false
	for ptr, p := range ip.ptrs {
		if addr >= ptr && uint64(addr-ptr) < p.size && n <= p.size-uint64(addr-ptr) {
			inside = true
			break
		}
	}
	if !inside {
		return errors.WithHint(
			errors.Wrapf(driver.ErrAccessDenied, "%s: not inside one pointer imported into the pool and not yet freed", what()),
			"touch only what RecvPointer returned, within its size, until Free")
	}
	return errors.Wrapf(move(ip.tab, dev, addr, b), "ipc: %s of an imported pool", op)
}

// made returns ErrInvalid for an ImportedPool that RecvPool did not make
// (nil, or a zero ImportedPool).
func (ip *ImportedPool) made(what func() string) error {
	if ip == nil || ip.tab == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the imported pool is nil or was not made by Conn.RecvPool", what()),
			"receive pools with Conn.RecvPool")
	}
	return nil
}

// Free releases an imported pointer and tells the exporter, which may then
// free it itself once every import of it is released. A pointer that came
// n times is freed n times.
func (ip *ImportedPool) Free(ptr driver.Addr) error {
	what := func() string { return fmt.Sprintf("ipc: free %s", ptr) }
	if err := ip.made(what); err != nil {
		return err
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	defer ip.checkAfter("free")
	if ip.closed {
		return driver.Closed(what() + ": the imported pool is closed")
	}
	p, ok := ip.ptrs[ptr]
	if !ok {
		return errors.Wrapf(driver.ErrNotAllocated, "ipc: free %s: not a pointer imported into this pool (freed twice?)", ptr)
	}
	if err := ip.conn.send(KindRelease, 0, u64s(ip.id, uint64(ptr-ip.res.Base()))); err != nil {
		return errors.Wrap(err, "ipc: free imported pointer")
	}
	if p.n--; p.n == 0 {
		delete(ip.ptrs, ptr)
	} else {
		ip.ptrs[ptr] = p
	}
	return nil
}

// Close unmaps and releases every chunk the pool imported and frees its
// reservation. It refuses while pointers are not freed.
func (ip *ImportedPool) Close() error {
	if err := ip.made(func() string { return "ipc: close imported pool" }); err != nil {
		return err
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if ip.closed {
		return driver.Closed("ipc: close of a closed imported pool")
	}
	if len(ip.ptrs) > 0 {
		return errors.Wrapf(driver.ErrBusy, "ipc: close of an imported pool with %d pointer(s) not freed", len(ip.ptrs))
	}
	errs := ip.tab.Close()
	for _, it := range ip.chunks.All() {
		errs = errors.CombineErrors(errs, it.Val.c.Release())
	}
	errs = errors.CombineErrors(errs, ip.res.FreeFor(ip.own))
	ip.closed = true
	return errors.Wrap(errs, "ipc: close imported pool")
}
