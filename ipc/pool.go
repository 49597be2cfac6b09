package ipc

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Sharing pools (seed 002: cudaMemPoolExportToShareableHandle,
// cudaMemPoolImportFromShareableHandle, cudaMemPoolExportPointer,
// cudaMemPoolImportPointer). The exporter sends a pool once, then single
// allocations as pointers: the arena chunks an allocation lies on travel
// first (each once per connection), then its offset and size. The importer
// maps the chunks at the same offsets of a reservation of its own; its
// ImportedPool cannot allocate. As the seed requires, importers free
// first: the exporting pool refuses FreeAsync of a pointer until every
// importer has sent its release.

// More message kinds.
const (
	KindPool      Kind = 5 // payload: pool id, max size
	KindPoolChunk Kind = 6 // payload: pool id, offset, size; one descriptor
)

var poolIDs atomic.Uint64

// ExportedPool is a pool offered to other processes.
type ExportedPool struct {
	p     *arena.Pool
	id    uint64
	mu    sync.Mutex
	allow []int
}

// ExportPool offers p, which must have been created Shareable, to the
// processes allowPIDs names.
func ExportPool(p *arena.Pool, allowPIDs ...int) (*ExportedPool, error) {
	if !p.Props().Shareable {
		return nil, errors.WithHint(errors.Wrap(driver.ErrInvalid, "ipc: export pool: it was created without PoolProps.Shareable"),
			"create pools meant for other processes shareable")
	}
	id := uint64(os.Getpid())<<32 | poolIDs.Add(1)
	return &ExportedPool{p: p, id: id, allow: slices.Clone(allowPIDs)}, nil
}

// SetAllowedPIDs replaces the processes allowed to import the pool.
func (ep *ExportedPool) SetAllowedPIDs(pids ...int) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.allow = slices.Clone(pids)
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
		return nil, errors.Mark(errors.Newf("ipc: a %s message of %d bytes and %d descriptors", m.kind, len(m.body), len(m.fds)), ErrProtocol)
	}
	vs := make([]uint64, n)
	for i := range vs {
		vs[i] = binary.LittleEndian.Uint64(m.body[8*i:])
	}
	return vs, nil
}

// SendPool sends the pool to the peer, if allowed.
func (c *Conn) SendPool(ep *ExportedPool) error {
	if !ep.allowed(c.PeerPID()) {
		return c.refuse(fmt.Sprintf("pool %#x", ep.id))
	}
	return c.send(KindPool, 0, u64s(ep.id, ep.p.Allocator().Arena().Max()))
}

// SendPointer sends one live allocation of the pool: the chunks it lies on
// that this connection has not sent yet, then the pointer. The pool then
// refuses to free it until the peer releases it (RecvRelease).
func (c *Conn) SendPointer(ep *ExportedPool, ptr driver.Addr) error {
	if !ep.allowed(c.PeerPID()) {
		return c.refuse(fmt.Sprintf("pool %#x", ep.id))
	}
	off, size, err := ep.p.Offset(ptr)
	if err != nil {
		return errors.Wrap(err, "ipc: send pointer")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent == nil {
		c.sent = map[uint64]map[uint64]bool{}
	}
	if c.sent[ep.id] == nil {
		c.sent[ep.id] = map[uint64]bool{}
	}
	for _, ch := range ep.p.Allocator().Arena().Chunks() {
		end := ch.Offset + ch.Chunk.Size()
		if end <= off || ch.Offset >= off+size || c.sent[ep.id][ch.Offset] {
			continue
		}
		sh, ok := ch.Chunk.Exported()
		if !ok {
			if sh, err = ch.Chunk.Export(); err != nil {
				return errors.Wrap(err, "ipc: send pointer")
			}
		}
		if err := c.send(KindPoolChunk, driver.HandlePOSIXFD, u64s(ep.id, ch.Offset, ch.Chunk.Size()), sh.FD); err != nil {
			return errors.Wrap(err, "ipc: send pointer")
		}
		c.sent[ep.id][ch.Offset] = true
	}
	if err := ep.p.MarkImported(ptr); err != nil {
		return errors.Wrap(err, "ipc: send pointer")
	}
	if err := c.send(KindPointer, 0, u64s(ep.id, off, size)); err != nil {
		return errors.CombineErrors(errors.Wrap(err, "ipc: send pointer"), ep.p.ReleaseImport(ptr))
	}
	return nil
}

// RecvRelease waits for the peer to release one pointer of the pool and
// records it; it returns the pointer, which the pool may now free.
func (c *Conn) RecvRelease(ep *ExportedPool) (driver.Addr, error) {
	m, err := c.recv()
	if err != nil {
		return 0, err
	}
	defer closeAll(m.fds)
	if m.kind != KindRelease {
		return 0, errors.Mark(errors.Newf("ipc: receive release: a %s message came", m.kind), ErrProtocol)
	}
	vs, err := readU64s(m, 2)
	if err != nil {
		return 0, err
	}
	if vs[0] != ep.id {
		return 0, errors.Wrapf(driver.ErrInvalid, "ipc: receive release: pool %#x is unknown here (this one is %#x)", vs[0], ep.id)
	}
	ptr := ep.p.Allocator().Arena().Base() + driver.Addr(vs[1])
	if err := ep.p.ReleaseImport(ptr); err != nil {
		return 0, errors.Wrap(err, "ipc: receive release")
	}
	return ptr, nil
}

// ImportedPool is another process's pool as this process sees it: the
// chunks of the pointers it received, mapped at the exporter's offsets.
// It cannot allocate.
type ImportedPool struct {
	id   uint64
	dev  driver.DeviceID
	mem  *physical.Memory
	res  *vaspace.Reservation
	tab  *mapping.Table
	conn *Conn

	mu     sync.Mutex
	chunks []*physical.Chunk
	ptrs   map[driver.Addr]uint64 // imported pointer -> size
	closed bool
}

// RecvPool receives a pool from the peer and reserves room for it; its
// memory is mapped as pointers arrive (RecvPointer), read-write for dev.
func (c *Conn) RecvPool(space *vaspace.Space, mem *physical.Memory, dev driver.DeviceID) (*ImportedPool, error) {
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
		return nil, errors.Mark(errors.Newf("ipc: receive pool: a %s message came", m.kind), ErrProtocol)
	}
	vs, err := readU64s(m, 2)
	if err != nil {
		return nil, err
	}
	res, err := space.Reserve(vs[1], 0)
	if err != nil {
		return nil, errors.Wrapf(err, "ipc: receive pool of %s", units.Bytes(vs[1]))
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		return nil, errors.CombineErrors(err, res.Free())
	}
	return &ImportedPool{id: vs[0], dev: dev, mem: mem, res: res, tab: tab, conn: c, ptrs: map[driver.Addr]uint64{}}, nil
}

// RecvPointer receives one pointer of the pool (and the chunks it needs)
// and returns its address in this process.
func (c *Conn) RecvPointer(ip *ImportedPool) (driver.Addr, error) {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if ip.closed {
		return 0, driver.Closed("ipc: receive pointer into a closed imported pool")
	}
	for {
		m, err := c.recv()
		if err != nil {
			return 0, err
		}
		ptr, done, err := ip.take(m)
		closeAll(m.fds)
		if err != nil || done {
			return ptr, err
		}
	}
}

// take handles one message of a pointer transfer.
func (ip *ImportedPool) take(m *message) (driver.Addr, bool, error) {
	switch m.kind {
	case KindRefused:
		return 0, true, errors.Wrapf(driver.ErrAccessDenied, "ipc: the sender refused: %s", m.body)
	case KindPoolChunk:
		vs, err := readU64s(m, 3)
		if err != nil {
			return 0, true, err
		}
		if len(m.fds) != 1 || m.htype != driver.HandlePOSIXFD {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: pool chunk with %d descriptors of handle type %d", len(m.fds), m.htype)
		}
		if vs[0] != ip.id {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: a chunk of pool %#x, unknown here (this one is %#x)", vs[0], ip.id)
		}
		ch, err := ip.mem.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: m.fds[0], Size: vs[2]}, ip.dev)
		if err != nil {
			return 0, true, errors.Wrap(err, "ipc: pool chunk")
		}
		at := ip.res.Base() + driver.Addr(vs[1])
		if err := ip.tab.Map(at, ch); err != nil {
			return 0, true, errors.CombineErrors(errors.Wrap(err, "ipc: pool chunk"), ch.Release())
		}
		if err := ip.tab.SetAccess(at, vs[2], ip.dev, driver.AccessReadWrite); err != nil {
			return 0, true, errors.CombineErrors(err, errors.CombineErrors(ip.tab.Unmap(at), ch.Release()))
		}
		ip.chunks = append(ip.chunks, ch)
		return 0, false, nil
	case KindPointer:
		vs, err := readU64s(m, 3)
		if err != nil {
			return 0, true, err
		}
		if vs[0] != ip.id {
			return 0, true, errors.Wrapf(driver.ErrInvalid, "ipc: a pointer of pool %#x, unknown here (this one is %#x)", vs[0], ip.id)
		}
		ptr := ip.res.Base() + driver.Addr(vs[1])
		if _, err := ip.tab.Lookup(ptr); err != nil || vs[1]+vs[2] > ip.res.Size() {
			return 0, true, errors.Wrapf(driver.ErrNotMapped, "ipc: pointer at offset %#x of %s: its chunks never came", vs[1], units.Bytes(vs[2]))
		}
		ip.ptrs[ptr] = vs[2]
		return ptr, true, nil
	}
	return 0, true, errors.Mark(errors.Newf("ipc: receive pointer: a %s message came", m.kind), ErrProtocol)
}

// MallocAsync always fails: an imported pool cannot allocate (seed 002).
func (ip *ImportedPool) MallocAsync(uint64) (driver.Addr, error) {
	return 0, errors.Wrap(driver.ErrUnsupported, "ipc: an imported pool cannot allocate")
}

// Table is the page table the pool's memory is mapped in, to read and
// write it.
func (ip *ImportedPool) Table() *mapping.Table { return ip.tab }

// Free releases an imported pointer and tells the exporter, which may then
// free it itself.
func (ip *ImportedPool) Free(ptr driver.Addr) error {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if _, ok := ip.ptrs[ptr]; !ok {
		return errors.Wrapf(driver.ErrNotAllocated, "ipc: free %s: not a pointer imported into this pool (freed twice?)", ptr)
	}
	if err := ip.conn.send(KindRelease, 0, u64s(ip.id, uint64(ptr-ip.res.Base()))); err != nil {
		return errors.Wrap(err, "ipc: free imported pointer")
	}
	delete(ip.ptrs, ptr)
	return nil
}

// Close unmaps and releases every chunk the pool imported and frees its
// reservation. It refuses while pointers are not freed.
func (ip *ImportedPool) Close() error {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if ip.closed {
		return driver.Closed("ipc: close of a closed imported pool")
	}
	if len(ip.ptrs) > 0 {
		return errors.Wrapf(driver.ErrBusy, "ipc: close of an imported pool with %d pointer(s) not freed", len(ip.ptrs))
	}
	errs := ip.tab.Close()
	for _, ch := range ip.chunks {
		errs = errors.CombineErrors(errs, ch.Release())
	}
	errs = errors.CombineErrors(errs, ip.res.Free())
	ip.closed = true
	return errors.Wrap(errs, "ipc: close imported pool")
}
