package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/ipc"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// IPCSmall is the chunk whose share time larger chunks' share times are
// compared with.
const IPCSmall = 2 * units.MiB

// ipcCopyPiece is the size of each write of the copy baseline.
const ipcCopyPiece = units.MiB

// IPCTimes are the times of N rounds of handing size bytes from one end of
// a Unix socket to the other, in one loop. Share is the chunk passed as a
// descriptor: Export + SendChunk + RecvChunk (import) + Map + SetAccess +
// HostBytes, until the receiver holds a slice over the sender's memory,
// with a receiver whose driver does not fill page tables (NoPopulate).
// Touch is that receiver's first read of one byte a page afterwards, not
// counted in Share: the page tables it fills on demand. SharePopulate is
// Share with a receiver on the host driver's default, which fills the page
// tables at SetAccess (MADV_POPULATE_WRITE). Copy is the bytes written
// through a SOCK_STREAM socket pair in 1 MiB writes and read by another
// goroutine into a buffer of the receiver's. ShareSmall is Share for an
// IPCSmall chunk in the same loop (zero when size is IPCSmall). Bare and
// BareSmall are the system calls Share makes on the host driver, made
// directly on a memfd and socket pair of the benchmark's own (see
// bareSharer.share), at size and at IPCSmall, from the same cold start.
type IPCTimes struct {
	N                                             int
	Share, Touch, SharePopulate, Copy, ShareSmall time.Duration
	Bare, BareSmall                               time.Duration
}

// IPCShare times sharing a chunk of size bytes with a receiver in the same
// process (the sender's Listen, the receiver's Dial, the sender's
// allow-list naming os.Getpid()) against copying the same number of bytes
// over a plain socket, rotating which goes first. Sender and receivers
// have host drivers of their own, as separate processes would. Each share
// creates, maps and writes the sender's chunk (not timed), and ends with
// the receiver checking what it reads, both mappings unmapped and both
// chunks released (not timed), and every driver's usage back to zero. The
// copy baseline reads from a buffer into another, both touched
// beforehand: its most favourable case, no page faults. Host driver,
// default capacity: ErrTooLarge when it cannot hold size plus IPCSmall.
func IPCShare(more func() bool, size uint64) (t IPCTimes, err error) {
	if size < IPCSmall || size%IPCSmall != 0 {
		return t, errors.Newf("bench: IPC share of %s: a multiple of %s is needed", units.Bytes(size), units.Bytes(IPCSmall))
	}
	s, err := newIPCSharer(size)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, s.close()) }()
	cp, err := newStreamCopier(size)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, cp.close()) }()
	bs, err := newBareSharer(size)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, bs.close()) }()
	churn := func() { touchPages(s.churn) }

	ops := []func() error{
		func() error {
			share, touch, err := s.share(size, s.lazy)
			t.Share += share
			t.Touch += touch
			return err
		},
		func() error {
			share, _, err := s.share(size, s.populating)
			t.SharePopulate += share
			return err
		},
		func() error {
			d, err := cp.copy()
			t.Copy += d
			return err
		},
		func() error {
			d, err := bs.share(size, churn)
			t.Bare += d
			return err
		},
	}
	if size > IPCSmall {
		ops = append(ops, func() error {
			share, _, err := s.share(IPCSmall, s.lazy)
			t.ShareSmall += share
			return err
		}, func() error {
			d, err := bs.share(IPCSmall, churn)
			t.BareSmall += d
			return err
		})
	}
	for more() {
		for i := range ops {
			if err := ops[(i+t.N)%len(ops)](); err != nil {
				return t, err
			}
		}
		t.N++
	}
	if t.N > 0 && !bytes.Equal(cp.src, cp.dst) {
		return t, errors.AssertionFailedf("bench: the copy baseline's receiver does not hold the sender's bytes")
	}
	return t, nil
}

// ipcSide is one process's host driver, reservation and mapping table.
type ipcSide struct {
	drv *host.Driver
	mem *physical.Memory
	res *vaspace.Reservation
	tab *mapping.Table
}

func (p *ipcSide) close() (err error) {
	if p.tab != nil {
		err = errors.CombineErrors(err, p.tab.Close())
	}
	if p.res != nil {
		err = errors.CombineErrors(err, p.res.Free())
	}
	if p.mem != nil {
		err = errors.CombineErrors(err, p.mem.Close())
	}
	if p.drv != nil {
		err = errors.CombineErrors(err, p.drv.Close())
	}
	return err
}

// mapRW maps c at the reservation's base, read-write for device 0, and
// returns its bytes.
func (p *ipcSide) mapRW(c *physical.Chunk) ([]byte, error) {
	base := p.res.Base()
	if err := p.tab.Map(base, c); err != nil {
		return nil, err
	}
	if err := p.tab.SetAccess(base, c.Size(), 0, driver.AccessReadWrite); err != nil {
		return nil, errors.CombineErrors(err, p.tab.Unmap(base))
	}
	b, err := p.drv.HostBytes(base, c.Size())
	if err != nil {
		return nil, errors.CombineErrors(err, p.tab.Unmap(base))
	}
	return b, nil
}

// ipcSharer is a sender, connected by an ipc socket to the receivers'
// side, and two receivers: one whose driver leaves page tables to be
// filled on first touch, one that fills them when access is granted. Each
// has a host driver of its own, as separate processes would.
type ipcSharer struct {
	dir                      string
	churn                    []byte // see share: written a byte a page before each timed share
	l                        *ipc.Listener
	sconn, rconn             *ipc.Conn
	sender, lazy, populating *ipcSide
	pid                      int
}

func newIPCSharer(size uint64) (s *ipcSharer, err error) {
	need := size + IPCSmall
	s = &ipcSharer{pid: os.Getpid(), sender: &ipcSide{}, lazy: &ipcSide{}, populating: &ipcSide{}}
	defer func() {
		if err != nil {
			err = errors.CombineErrors(err, s.close())
		}
	}()
	for _, p := range []*ipcSide{s.sender, s.lazy, s.populating} {
		if p.drv, err = host.New(host.Options{Devices: 1, NoPopulate: p == s.lazy}); err != nil {
			return s, err
		}
		if c := p.drv.Devices()[0].Capacity; c < need {
			return s, errors.Wrapf(ErrTooLarge, "bench: sharing %s needs %s, the host driver's default device has %s (half of MemAvailable)",
				units.Bytes(size), units.Bytes(need), units.Bytes(c))
		}
		p.mem = physical.New(p.drv)
		if p.res, err = vaspace.New(p.drv).Reserve(size, 0); err != nil {
			return s, err
		}
		if p.tab, err = mapping.New(p.res, p.mem); err != nil {
			return s, err
		}
	}
	s.churn = make([]byte, size)
	touchPages(s.churn)
	if s.dir, err = os.MkdirTemp("", "vmarena-bench-ipc-"); err != nil {
		return s, err
	}
	if s.l, err = ipc.Listen(filepath.Join(s.dir, "sender.sock"), 0o600); err != nil {
		return s, err
	}
	if s.rconn, err = ipc.Dial(s.l.Path()); err != nil {
		return s, err
	}
	if s.sconn, err = s.l.Accept(); err != nil {
		return s, err
	}
	return s, nil
}

func (s *ipcSharer) close() (err error) {
	for _, c := range []*ipc.Conn{s.sconn, s.rconn} {
		if c != nil {
			err = errors.CombineErrors(err, c.Close())
		}
	}
	if s.l != nil {
		err = errors.CombineErrors(err, s.l.Close())
	}
	if s.dir != "" {
		err = errors.CombineErrors(err, os.RemoveAll(s.dir))
	}
	for _, p := range []*ipcSide{s.sender, s.lazy, s.populating} {
		err = errors.CombineErrors(err, p.close())
	}
	return err
}

// share creates a shareable chunk of sz on the sender, maps it and writes
// a byte to each page (not timed: the producer's own work, which also
// materializes the pages), writes a byte to each page of s.churn (not
// timed: it leaves the caches and the TLB as cold before a 2 MiB share as
// the producer's 1 GiB of writes leave them before a 1 GiB one, so that
// the ratio of the two measures the share and not what ran before it —
// without it every step of the share, even sendmsg of one descriptor, ran
// 1.5 to 4 times slower after the larger write),
// then times its export, send, import into r,
// map, grant and HostBytes. Afterwards r reads the byte of each page back,
// checking the sum — touch is that read, for the lazy receiver. Both
// mappings are unmapped and both chunks released before it returns.
func (s *ipcSharer) share(sz uint64, r *ipcSide) (share, touch time.Duration, err error) {
	c, err := s.sender.mem.Create(0, sz, driver.ChunkOptions{Shareable: true})
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		err = errors.CombineErrors(err, c.Release())
		err = errors.CombineErrors(err, s.emptied())
	}()
	sb, err := s.sender.mapRW(c)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.CombineErrors(err, s.sender.tab.Unmap(s.sender.res.Base())) }()
	page := os.Getpagesize()
	var want byte
	for i := 0; i < len(sb); i += page {
		sb[i] = byte(i/page) + 1
		want += sb[i]
	}
	touchPages(s.churn)

	base := r.res.Base()
	t0 := time.Now()
	if _, err := c.Export(s.pid); err != nil {
		return 0, 0, err
	}
	if err := s.sconn.SendChunk(c); err != nil {
		return 0, 0, err
	}
	rc, err := s.rconn.RecvChunk(r.mem, 0)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.CombineErrors(err, rc.Release()) }()
	if err := r.tab.Map(base, rc); err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.CombineErrors(err, r.tab.Unmap(base)) }()
	if err := r.tab.SetAccess(base, sz, 0, driver.AccessReadWrite); err != nil {
		return 0, 0, err
	}
	b, err := r.drv.HostBytes(base, sz)
	if err != nil {
		return 0, 0, err
	}
	share = time.Since(t0)

	t1 := time.Now()
	var got byte
	for i := 0; i < len(b); i += page {
		got += b[i]
	}
	if r == s.lazy {
		touch = time.Since(t1)
	}
	if got != want {
		return 0, 0, errors.AssertionFailedf("bench: the receiver reads page sum %d, the sender wrote %d", got, want)
	}
	return share, touch, nil
}

// emptied checks that no side holds memory any more.
func (s *ipcSharer) emptied() error {
	for _, p := range []*ipcSide{s.sender, s.lazy, s.populating} {
		u, err := p.mem.Usage(0)
		if err != nil {
			return err
		}
		if u.Used != 0 {
			return errors.AssertionFailedf("bench: %s still used after a share round", units.Bytes(u.Used))
		}
	}
	return nil
}

// touchPages writes a byte to each page of b.
func touchPages(b []byte) {
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i]++
	}
}
