package transfer

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// Config says how an engine moves bytes and where it listens.
type Config struct {
	Kind   string // "tcp" (default, pure Go) or "ucx" (needs a build with -tags ucx: else ErrUnsupported)
	Listen string // control (and, for tcp, data) listen address; default "127.0.0.1:0"
	// LeaseTimeout is the longest a target holds its memory for one
	// remote transfer (and an initiator its own, for one op): default
	// 10s.
	LeaseTimeout time.Duration
	// DialRetries bounds Connect's tries after the first (UCX 1.13
	// resets about one connect in ten); default 5.
	DialRetries int
	// Staging, with a Driver, lets the tcp kind register device tensors
	// (see Staging); the ucx kind refuses it (ErrUnsupported).
	Staging Staging
}

// Stats counts what an engine did, as initiator (issued) and as target
// (served) together.
type Stats struct {
	// Puts and Gets are the ops completed: issued ones that the target
	// acknowledged, and served ones whose bytes all moved (a served get
	// when its bytes are handed to the connection: the initiator may
	// have them before the target's goroutine runs again).
	Puts, Gets uint64
	// BytesOut left this process's registered memory (issued puts,
	// served gets); BytesIn came into it (issued gets, served puts).
	BytesOut, BytesIn uint64
	// Refused counts the calls this engine refused: an issued Put or Get
	// refused before its op was sent (once per call: a bad op, a closed
	// or stale local registration), and a served op refused as a target
	// (once per op). A refusal a target answers is counted there, not
	// by the initiator.
	Refused uint64
	// Retries counts Connect's tries after a first that failed.
	Retries uint64
}

// Engine moves bytes between this process's registered tensors and a
// peer engine's, over the control connections it accepts and makes.
//
// Lock order: Engine.mu is a leaf (nothing else is locked while it is
// held); a Peer's mu is taken before it.
type Engine struct {
	cfg    Config
	ln     net.Listener
	addr   string
	worker *ucx.Worker // the ucx kind's; nil for tcp
	// staging moves device tensors' bytes; nil without Config.Staging.
	staging *staging
	// closing ends when Close starts: a served ucx put's wait for its
	// bytes gives up then, as its read of the connection does.
	closing context.Context
	stop    context.CancelFunc

	// mu guards the fields below it.
	mu     lockrank.Mutex[lockrank.TransferEngine]
	closed bool
	// regs holds the live registrations by id; ids come from lastID,
	// which only grows, so a closed registration's id is never reused.
	regs   map[uint64]*Registration
	lastID uint64
	// peers are the connections this engine made (Connect), conns the
	// ones it serves: each served one has a goroutine, counted in wg
	// with the accept loop's.
	peers map[*Peer]struct{}
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	puts, gets, bytesOut, bytesIn, refused, retries atomic.Uint64
}

// Kinds returns the kinds of engine this build can make: "tcp" always,
// and "ucx" in a build with UCX (-tags ucx, cgo, libucx-dev).
func Kinds() []string {
	if ucx.Available {
		return []string{"tcp", "ucx"}
	}
	return []string{"tcp"}
}

// New makes an engine of cfg.Kind listening at cfg.Listen. It refuses
// (ErrInvalid) an unknown kind or a negative duration or count, and
// (ErrUnsupported) the ucx kind in a build without UCX, or with Staging.
// With Staging.Driver it makes the staging buffer and its streams, which
// Close gives back.
func New(cfg Config) (*Engine, error) {
	what := func() string { return fmt.Sprintf("transfer: new %q engine", cfg.Kind) }
	if cfg.Kind == "" {
		cfg.Kind = "tcp"
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.LeaseTimeout == 0 {
		cfg.LeaseTimeout = 10 * time.Second
	}
	if cfg.DialRetries == 0 {
		cfg.DialRetries = 5
	}
	if cfg.Staging.Driver != nil && cfg.Staging.Size == 0 {
		cfg.Staging.Size = DefaultStagingSize
	}
	switch {
	case cfg.Kind != "tcp" && cfg.Kind != "ucx":
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the kinds are \"tcp\" and \"ucx\"", what())
	case cfg.LeaseTimeout < 0 || cfg.DialRetries < 0:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: LeaseTimeout %s and DialRetries %d may not be negative", what(), cfg.LeaseTimeout, cfg.DialRetries)
	case cfg.Kind == "ucx" && cfg.Staging.Driver != nil:
		return nil, errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: the ucx kind moves host memory only, and stages nothing", what()),
			"use the tcp kind for device tensors (see the package doc, Device memory)")
	}
	e := &Engine{cfg: cfg, regs: map[uint64]*Registration{}, peers: map[*Peer]struct{}{}, conns: map[net.Conn]struct{}{}}
	st, err := newStaging(cfg.Staging)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	e.staging = st
	e.closing, e.stop = context.WithCancel(context.Background())
	if cfg.Kind == "ucx" {
		w, err := ucx.NewWorker(false) // no RMA: peers write only through the windows the target opens (ucx.go)
		if err != nil {
			return nil, errors.Wrapf(err, "%s", what())
		}
		e.worker = w
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if e.worker != nil {
			err = errors.CombineErrors(err, e.worker.Close())
		}
		return nil, errors.CombineErrors(errors.Wrapf(driver.ErrInvalid, "%s: listen at %s: %v", what(), cfg.Listen, err), e.staging.close())
	}
	e.ln, e.addr = ln, ln.Addr().String()
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// unmade is the error of a method called on a nil or zero value.
func unmade(method string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "transfer: %s on a nil or zero value", method),
		"make an engine with transfer.New, registrations with Engine.Register, peers with Engine.Connect")
}

func (e *Engine) unmade() bool { return e == nil || e.ln == nil }

// Addr is what a peer passes to Connect: the listener's address.
func (e *Engine) Addr() string {
	if e.unmade() {
		return ""
	}
	return e.addr
}

// Kind is "tcp" or "ucx".
func (e *Engine) Kind() string {
	if e.unmade() {
		return ""
	}
	return e.cfg.Kind
}

// Stats are the engine's counts so far.
func (e *Engine) Stats() Stats {
	if e.unmade() {
		return Stats{}
	}
	return Stats{Puts: e.puts.Load(), Gets: e.gets.Load(), BytesOut: e.bytesOut.Load(), BytesIn: e.bytesIn.Load(),
		Refused: e.refused.Load(), Retries: e.retries.Load()}
}

// Close closes the peers, the served connections (an op in flight fails),
// the listener and the registrations, waits for every goroutine of the
// engine to end, then closes the UCX worker and gives the staging buffer
// and its streams back. The tensors stay their owners'. Closing twice is ErrClosed.
func (e *Engine) Close() error {
	if e.unmade() {
		return unmade("Engine.Close")
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return driver.Closed("transfer: close an engine: already closed")
	}
	e.closed = true
	e.stop()
	peers, conns := e.peers, e.conns
	e.peers, e.conns = map[*Peer]struct{}{}, map[net.Conn]struct{}{}
	e.mu.Unlock()
	err := e.ln.Close()
	for p := range peers {
		p.shut()
	}
	for c := range conns {
		_ = c.Close() // its goroutine ends on the read error
	}
	e.wg.Wait()
	e.mu.Lock()
	regs := e.regs
	e.regs = map[uint64]*Registration{}
	e.mu.Unlock()
	for _, r := range regs {
		err = errors.CombineErrors(err, r.end())
	}
	if e.worker != nil {
		err = errors.CombineErrors(err, e.worker.Close())
	}
	err = errors.CombineErrors(err, e.staging.close())
	return errors.Wrapf(err, "transfer: close an engine")
}

// Registration is a tensor's memory that peers may put into and get
// from, named to them by its Descriptor. It holds the tensor, never its
// memory: every byte moved goes through the tensor's Access, so the
// tensor's owner stays in charge (see the package doc).
type Registration struct {
	e        *Engine
	t        *tensor.Tensor
	id, gen  uint64
	addr     uint64 // the address of the tensor's first byte, as a number: only ever sent, never dereferenced
	n        uint64
	writable bool
	dev      bool     // a device tensor: its bytes move through the engine's staging
	mem      *ucx.Mem // the ucx kind's; nil for tcp
	key      []byte

	// closed is set by end; using counts the ops through the
	// registration in flight (enter to exit). An op counts itself before
	// it looks at closed and end sets closed before it looks at using,
	// as tensor.Lease does, so once end sees using at zero no op touches
	// the registration and none will. (Not a sync.RWMutex: a waiting
	// end would block a target's read lock while the initiator of the
	// same engine holds one and waits for that target.)
	closed atomic.Bool
	using  atomic.Int64
}

// enter starts an op through r; false, with nothing started, once r is
// closed.
func (r *Registration) enter() bool {
	if r.closed.Load() {
		return false
	}
	r.using.Add(1)
	if r.closed.Load() {
		r.using.Add(-1)
		return false
	}
	return true
}

func (r *Registration) exit() { r.using.Add(-1) }

// Register makes t's memory reachable by peers. t must be contiguous
// (ErrInvalid), live (ErrClosed), not empty (ErrInvalid) and a driver's
// mapping (Mapped: Go memory is refused, ErrInvalid). A device tensor
// (memory the process cannot address: a CUDA or AscendCL device's, the
// sim driver's) needs a tcp engine with Staging (ErrUnsupported
// otherwise): its bytes move through the staging buffer. For the ucx kind, UCX
// must register exactly its bytes, no more (ErrInvalid otherwise: with
// UCX 1.13, address and length multiples of 16), so that the remote key
// names the tensor's bytes alone. Peers may write it
// only if all of it is writable (no read-only prefix:
// Descriptor.Writable). Registering the same tensor twice makes two
// registrations.
func (e *Engine) Register(t *tensor.Tensor) (*Registration, error) {
	what := func() string { return fmt.Sprintf("transfer: register %s", t) }
	if e.unmade() {
		return nil, unmade("Engine.Register")
	}
	if t == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the tensor is nil", what())
	}
	if !t.Mapped() {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: its memory is Go memory, not a driver's mapping", what()),
			"lay the tensor over an arena (tensor.OnArena) or a KV cache's memory")
	}
	if !t.Addressable() {
		return e.registerDevice(t, what)
	}
	r := &Registration{e: e, t: t}
	err := t.Access(false, func(b []byte) error {
		r.addr, r.n = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint64(len(b))
		if len(b) == 0 || e.worker == nil {
			return nil
		}
		m, err := e.worker.Register(uintptr(unsafe.Pointer(unsafe.SliceData(b))), uint64(len(b)))
		if err != nil {
			return err
		}
		r.mem = m
		// The remote key names what UCX registered: exactly the
		// tensor's bytes, or the registration is refused.
		switch a, n, err := m.Span(); {
		case err != nil:
			return errors.CombineErrors(err, r.closeMem())
		case uint64(a) != r.addr || n != r.n:
			return errors.CombineErrors(errors.WithHint(errors.Wrapf(driver.ErrInvalid,
				"UCX registered %d bytes at %#x for the tensor's %d at %#x: its remote key would reach memory outside the tensor", n, a, r.n, r.addr),
				"register a tensor whose address and length UCX registers as they are (with UCX 1.13: both multiples of 16)"), r.closeMem())
		}
		if r.key, err = m.RKey(); err != nil {
			return errors.CombineErrors(err, r.closeMem())
		}
		return nil
	})
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	if r.n == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: it has no bytes", what())
	}
	switch err := t.Access(true, func([]byte) error { return nil }); {
	case err == nil:
		r.writable = true
	case !errors.Is(err, driver.ErrAccessDenied):
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), r.closeMem())
	}
	return e.add(r, what)
}

// registerDevice registers a device tensor (see Register).
func (e *Engine) registerDevice(t *tensor.Tensor, what func() string) (*Registration, error) {
	switch {
	case e.worker != nil:
		return nil, errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: the ucx kind registers host memory only; this tensor's is a device's", what()),
			"use a tcp engine with Config.Staging (see the package doc, Device memory)")
	case e.staging == nil:
		return nil, errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: its memory is a device's, and the engine has no staging buffer", what()),
			"make the engine with Config.Staging naming the device's driver")
	}
	r := &Registration{e: e, t: t, dev: true}
	if err := t.AccessDevice(false, func(addr driver.Addr, n uint64) error { r.addr, r.n = uint64(addr), n; return nil }); err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	if r.n == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: it has no bytes", what())
	}
	switch err := t.AccessDevice(true, func(driver.Addr, uint64) error { return nil }); {
	case err == nil:
		r.writable = true
	case !errors.Is(err, driver.ErrAccessDenied):
		return nil, errors.Wrapf(err, "%s", what())
	}
	return e.add(r, what)
}

// add gives r a generation and an id and keeps it, unless the engine is
// closed.
func (e *Engine) add(r *Registration, what func() string) (*Registration, error) {
	var g [8]byte
	for r.gen == 0 {
		_, _ = rand.Read(g[:]) // never fails (crypto/rand)
		r.gen = binary.BigEndian.Uint64(g[:])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.CombineErrors(driver.Closed(what()+": the engine is closed"), r.closeMem())
	}
	e.lastID++
	r.id = e.lastID
	e.regs[r.id] = r
	return r, nil
}

func (r *Registration) unmade() bool { return r == nil || r.e == nil }

// Len is the number of registered bytes.
func (r *Registration) Len() uint64 {
	if r.unmade() {
		return 0
	}
	return r.n
}

// Descriptor names the registration to peers. A closed registration, or
// a stale one (its tensor released, or its lease revoked: the memory was
// taken back or moved), is ErrClosed: register the new tensor.
func (r *Registration) Descriptor() (Descriptor, error) {
	if r.unmade() {
		return Descriptor{}, unmade("Registration.Descriptor")
	}
	if r.closed.Load() {
		return Descriptor{}, driver.Closed(fmt.Sprintf("transfer: descriptor of registration %d: it is closed", r.id))
	}
	if r.t.Released() {
		return Descriptor{}, errors.WithHint(driver.Closed(fmt.Sprintf("transfer: descriptor of registration %d: it is stale, its tensor's memory was taken back", r.id)),
			"register the tensor its owner hands out now")
	}
	return Descriptor{Engine: r.e.addr, ID: r.id, Gen: r.gen, Addr: r.addr, Len: r.n, Writable: r.writable,
		Key: append([]byte(nil), r.key...)}, nil
}

// Close ends the registration: peers' ops through it are refused
// (ErrClosed) from then on; it waits for the ones in flight. The tensor
// stays its owner's. Closing twice is ErrClosed.
func (r *Registration) Close() error {
	if r.unmade() {
		return unmade("Registration.Close")
	}
	r.e.mu.Lock()
	_, live := r.e.regs[r.id]
	delete(r.e.regs, r.id)
	r.e.mu.Unlock()
	if !live {
		return driver.Closed(fmt.Sprintf("transfer: close registration %d: already closed (or its engine is)", r.id))
	}
	return r.end()
}

// end marks r closed, waits for the ops in flight through it (each
// bounded by LeaseTimeout) and lets its UCX memory go. It runs once per
// registration: Close and Engine.Close take r out of the engine's map
// first, and only the one that did calls it.
func (r *Registration) end() error {
	r.closed.Store(true)
	for spins := 0; r.using.Load() != 0; spins++ {
		if spins < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
	return r.closeMem()
}

func (r *Registration) closeMem() error {
	if r.mem == nil {
		return nil
	}
	m := r.mem
	r.mem = nil
	return m.Close()
}

// access runs fn with bytes [off, off+n) of a host registration's
// tensor, held as tensor.Access holds them, and counted in flight (Close
// waits): move with one piece. The range was checked by the caller.
func (r *Registration) access(write bool, off, n uint64, fn func(b []byte) error) error {
	return r.move(write, off, n, nil, nop, fn, nop)
}

func nop() error { return nil }

// Peer is a control connection to another engine, through which Put and
// Get move bytes between this engine's registrations and that engine's.
// Ops on one peer run one at a time, in call order.
type Peer struct {
	e      *Engine
	conn   net.Conn
	remote string        // the target engine's Addr, as it told it
	ep     *ucx.Endpoint // the ucx kind's; nil for tcp

	// mu serializes ops; broken (under mu) is set once the connection
	// is in an unknown state (an op cut short) and closed, after which
	// every op is ErrClosed.
	mu     lockrank.Mutex[lockrank.TransferPeer]
	broken bool
	shut1  sync.Once
	closed atomic.Bool
}

// Connect makes a peer of the engine listening at addr (its Addr). A
// failed dial or hello is tried again, DialRetries times at most, backing
// off from 10 ms, while ctx allows. Kinds must match (ErrInvalid); an
// engine that cannot be reached is ErrClosed.
func (e *Engine) Connect(ctx context.Context, addr string) (*Peer, error) {
	what := func() string { return fmt.Sprintf("transfer: connect to %s", addr) }
	if e.unmade() {
		return nil, unmade("Engine.Connect")
	}
	if ctx == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the context is nil", what())
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, driver.Closed(what() + ": the engine is closed")
	}
	var last error
	for try := 0; try <= e.cfg.DialRetries; try++ {
		if try > 0 {
			e.retries.Add(1)
			select {
			case <-ctx.Done():
				return nil, sentinel.Mark(errors.Wrapf(ctx.Err(), "%s: after %d tries (last: %v)", what(), try, last), driver.ErrClosed)
			case <-time.After(10 * time.Millisecond << min(try-1, 6)):
			}
		}
		p, again, err := e.dial(ctx, addr)
		if err == nil {
			return p, nil
		}
		if !again {
			return nil, errors.Wrapf(err, "%s", what())
		}
		last = err
	}
	return nil, errors.WithHint(driver.Closed(fmt.Sprintf("%s: %d tries failed, the last: %v", what(), e.cfg.DialRetries+1, last)),
		"is the engine at that address running? Its Addr is what to pass")
}

// dial makes one try at a peer; again says whether the failure may pass
// (the network's) or not (the protocol's, or this engine closed).
func (e *Engine) dial(ctx context.Context, addr string) (p *Peer, again bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, true, err
	}
	fail := func(err error, again bool) (*Peer, bool, error) {
		_ = conn.Close()
		return nil, again, err
	}
	_ = conn.SetDeadline(time.Now().Add(e.cfg.LeaseTimeout))
	blob := helloBlob{kind: e.cfg.Kind}.encode() // no worker address: the target makes no endpoint (serve)
	h := request{kind: kindHello, id: protocolVersion, n: uint64(len(blob))}.encode()
	if _, err := (&net.Buffers{h[:], blob}).WriteTo(conn); err != nil {
		return fail(err, true)
	}
	status, body, err := readResponse(conn)
	if err != nil {
		return fail(err, true)
	}
	if status != statusOK {
		return fail(errors.Wrapf(statusSentinels[status], "the engine at %s refused: %s", addr, body), false)
	}
	theirs, err := decodeHello(body)
	if err != nil {
		return fail(err, false)
	}
	_ = conn.SetDeadline(time.Time{})
	p = &Peer{e: e, conn: conn, remote: theirs.addr}
	if e.worker != nil {
		// The target's worker address, from the engine the caller chose
		// to connect to (see the package doc, Trust).
		if p.ep, err = e.worker.Connect(theirs.worker); err != nil {
			return fail(err, true)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		p.shut()
		return nil, false, driver.Closed("the engine is closed")
	}
	e.peers[p] = struct{}{}
	return p, false, nil
}

func (p *Peer) unmade() bool { return p == nil || p.e == nil }

// Close closes the connection; an op in flight fails. Closing twice, or
// after the engine closed, is ErrClosed; a peer whose connection failed
// (its ops answer ErrClosed) still closes once without an error.
func (p *Peer) Close() error {
	if p.unmade() {
		return unmade("Peer.Close")
	}
	p.e.mu.Lock()
	_, open := p.e.peers[p]
	delete(p.e.peers, p)
	p.e.mu.Unlock()
	p.shut()
	if !open {
		return driver.Closed("transfer: close a peer: already closed (or its engine is)")
	}
	return nil
}

// shut closes the connection and the endpoint, once.
func (p *Peer) shut() {
	p.shut1.Do(func() {
		p.closed.Store(true)
		_ = p.conn.Close()
		if p.ep != nil {
			_ = p.ep.Close()
		}
	})
}

// Put writes each op's Len bytes from LocalOff of Local to RemoteOff of
// the remote registration, in order, and returns when every byte is at
// the remote (the target acknowledged it). ctx bounds the call: ended
// before an op starts, its error is returned (context.Canceled or
// DeadlineExceeded, no sentinel: nothing was refused) and the peer stays
// good; ending during an op, it cuts the op short and closes the peer
// (ErrClosed, with ctx's error in the chain), whose bytes are then
// partly moved. Each op also gives up after LeaseTimeout. Every op is checked before
// any moves: a bad range (ErrInvalid), a closed local registration
// (ErrClosed), a read-only remote (ErrAccessDenied), a descriptor of
// another engine (ErrInvalid). The target refuses what it must (a stale
// or closed registration: ErrClosed), and its error is returned, marked
// with the same sentinel; the ops before it stay done.
func (p *Peer) Put(ctx context.Context, ops ...Op) error { return p.do(ctx, true, ops) }

// Get reads each op's Len bytes from RemoteOff of the remote registration
// into LocalOff of Local, as Put does the other way (a read-only Local is
// ErrAccessDenied).
func (p *Peer) Get(ctx context.Context, ops ...Op) error { return p.do(ctx, false, ops) }

// Op is one contiguous move between a local registration and a remote
// one.
type Op struct {
	Local     *Registration
	LocalOff  uint64
	Remote    Descriptor
	RemoteOff uint64
	Len       uint64
}

func (p *Peer) do(ctx context.Context, put bool, ops []Op) error {
	verb := map[bool]string{true: "put", false: "get"}[put]
	what := func() string { return fmt.Sprintf("transfer: %s of %d ops to %s", verb, len(ops), p.remote) }
	if p.unmade() {
		return unmade("Peer." + map[bool]string{true: "Put", false: "Get"}[put])
	}
	if ctx == nil {
		p.e.refused.Add(1)
		return errors.Wrapf(driver.ErrInvalid, "%s: the context is nil", what())
	}
	for i := range ops {
		if err := p.check(&ops[i], put); err != nil {
			p.e.refused.Add(1)
			return errors.Wrapf(err, "%s: op %d", what(), i)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken || p.closed.Load() {
		return driver.Closed(what() + ": the peer is closed")
	}
	// ctx ending cuts the op in flight short through the connection's
	// deadline; the function has run in full (or not at all) once do
	// returns, so it never moves a later call's deadline.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = p.conn.SetDeadline(time.Unix(1, 0)); close(fired) })
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	for i := range ops {
		op := &ops[i]
		deadline := time.Now().Add(p.e.cfg.LeaseTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		if err := p.conn.SetDeadline(deadline); err != nil {
			p.breakConn()
			return sentinel.Mark(errors.Wrapf(err, "%s: op %d: the peer is closed", what(), i), driver.ErrClosed)
		}
		// Checked after the deadline is set: if ctx ends later, the
		// function above moves the deadline after this one.
		if err := ctx.Err(); err != nil {
			return errors.Wrapf(err, "%s: op %d not started", what(), i) // nothing sent: the connection stays good
		}
		var err error
		if p.ep != nil {
			err = p.ucxOp(ctx, deadline, op, put)
		} else {
			err = p.tcpOp(op, put)
		}
		var ce connError
		if errors.As(err, &ce) {
			p.breakConn()
			cause := errors.CombineErrors(ctxErr(ctx), ce.err)
			return sentinel.Mark(errors.Wrapf(cause, "%s: op %d: the connection failed, the peer is closed", what(), i), driver.ErrClosed)
		}
		if err != nil {
			var rf refusal
			if !errors.As(err, &rf) {
				p.e.refused.Add(1) // refused here (a closed or stale local registration), before anything was sent
			}
			return errors.Wrapf(err, "%s: op %d", what(), i)
		}
		if put {
			p.e.puts.Add(1)
			p.e.bytesOut.Add(op.Len)
		} else {
			p.e.gets.Add(1)
			p.e.bytesIn.Add(op.Len)
		}
	}
	return nil
}

// ctxErr is ctx's error, or DeadlineExceeded once its deadline has
// passed (the connection's deadline, which is ctx's, may fire before
// ctx's own timer).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// breakConn closes a connection left in an unknown state; mu is held.
func (p *Peer) breakConn() {
	p.broken = true
	p.shut()
}

// connError is a failure of the connection itself: the protocol's state
// is unknown after it, and the connection is dropped.
type connError struct{ err error }

func (c connError) Error() string { return "connection: " + c.err.Error() }

// refusal is a target's refusal of an op (counted by the target's
// Stats.Refused, not the initiator's).
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// remoteError is a target's refusal, marked with the sentinel its status
// names.
func (p *Peer) remoteError(status byte, body []byte) error {
	// The body is the target's message, which names the sentinel already.
	return refusal{sentinel.Mark(errors.Newf("the target %s refused: %s", p.remote, body), statusSentinels[status])}
}

// check refuses an op that no target could accept, before anything moves.
func (p *Peer) check(op *Op, put bool) error {
	what := func() string { return "check" }
	switch {
	case op.Local.unmade():
		return errors.Wrapf(driver.ErrInvalid, "the local registration is nil or zero")
	case op.Local.e != p.e:
		return errors.Wrapf(driver.ErrInvalid, "the local registration %d is another engine's", op.Local.id)
	case op.Len == 0:
		return errors.Wrapf(driver.ErrInvalid, "an op of no bytes")
	case op.LocalOff+op.Len < op.LocalOff || op.LocalOff+op.Len > op.Local.n:
		return errors.Wrapf(driver.ErrInvalid, "%d bytes at %d of the local registration of %d", op.Len, op.LocalOff, op.Local.n)
	}
	if err := op.Remote.check(what); err != nil {
		return err
	}
	switch {
	case op.Remote.Engine != p.remote:
		return errors.Wrapf(driver.ErrInvalid, "the descriptor is of the engine at %s, the peer is %s", op.Remote.Engine, p.remote)
	case op.RemoteOff+op.Len < op.RemoteOff || op.RemoteOff+op.Len > op.Remote.Len:
		return errors.Wrapf(driver.ErrInvalid, "%d bytes at %d of the remote registration of %d", op.Len, op.RemoteOff, op.Remote.Len)
	case put && !op.Remote.Writable:
		return errors.Wrapf(driver.ErrAccessDenied, "the remote registration %d is read-only", op.Remote.ID)
	case !put && !op.Local.writable:
		return errors.Wrapf(driver.ErrAccessDenied, "the local registration %d is read-only", op.Local.id)
	}
	return nil
}

// Check verifies the engine's books and reports every inconsistency: each
// live registration is under its own id, no higher than the last id
// given, this engine's, open, with a generation and bytes, a device
// tensor's only on an engine that stages; each peer kept is this
// engine's, and a closed engine keeps none; the staging halves are equal
// and aligned.
func (e *Engine) Check() error {
	if e.unmade() {
		return unmade("Engine.Check")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("transfer: engine %s: "+format, append([]any{e.addr}, args...)...))
	}
	for id, r := range e.regs {
		switch {
		case r.id != id || id == 0 || id > e.lastID:
			fail("registration %d is kept under id %d (last id %d)", r.id, id, e.lastID)
		case r.e != e:
			fail("registration %d is another engine's", id)
		case r.closed.Load():
			fail("registration %d is closed but kept", id)
		case r.gen == 0 || r.n == 0:
			fail("registration %d has generation %#x and %d bytes", id, r.gen, r.n)
		case r.using.Load() < 0:
			fail("registration %d counts %d ops in flight", id, r.using.Load())
		case r.dev && (e.staging == nil || e.worker != nil):
			fail("registration %d is a device tensor's, on an engine that cannot stage it", id)
		}
	}
	for p := range e.peers {
		if p.e != e {
			fail("the peer of %s is another engine's", p.remote)
		}
	}
	if e.closed && len(e.peers) != 0 {
		fail("closed, with %d peers kept", len(e.peers))
	}
	if st := e.staging; st != nil {
		if n := len(st.issued.b); n == 0 || n%stagingAlign != 0 || len(st.served.b) != n {
			fail("staging halves of %d and %d bytes (want equal, non-zero, multiples of %d)", n, len(st.served.b), stagingAlign)
		}
	}
	return errs
}
