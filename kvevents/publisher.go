package kvevents

import (
	"encoding/binary"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmarena/vmarena/internal/backoff"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
)

// Defaults, vLLM's ZmqEventPublisher's.
const (
	// DefaultBufferSteps is how many batches the replay socket keeps.
	DefaultBufferSteps = 10_000
	// DefaultHWM is the PUB socket's high-water mark, in messages.
	DefaultHWM = 100_000
	// DefaultBufferBytes bounds the bytes of the batches kept for
	// replay (vLLM bounds their number only; a resync batch lists the
	// whole index).
	DefaultBufferBytes = 256 << 20
)

// EndSeq is the sequence number of the replay socket's last reply to a
// request: -1, eight bytes big-endian, with an empty payload (vLLM's
// END_SEQ).
const EndSeq = -1

// Options configure a Publisher.
type Options struct {
	// Endpoint is the PUB socket's, tcp://HOST:PORT or ipc://PATH; the
	// publisher listens there (HOST * is every interface, PORT 0 a free
	// port: Endpoint and Addr say which; PATH a Unix socket's, @NAME
	// Linux's abstract namespace, as ZMQ's ipc transport).
	Endpoint string
	// ReplayEndpoint, when set, is the ROUTER socket's (the same forms),
	// where a subscriber asks for the batches from a sequence number on.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" by default, as vLLM).
	Topic string
	// Rank is the batches' data_parallel_rank; nil writes nil. vLLM's
	// publisher writes its rank, 0 unless data-parallel. A rank above 0
	// also offsets both endpoints as vLLM's does (OffsetEndpoint), so
	// every rank of a data-parallel engine is given the same endpoints.
	Rank *int
	// Layout is the events' encoding (Array by default).
	Layout Layout
	// BufferSteps and BufferBytes bound the batches kept for replay
	// (0: DefaultBufferSteps, DefaultBufferBytes); past either the
	// oldest go.
	BufferSteps, BufferBytes int
	// VLLMHashSeed, when set, names every block by the hash vLLM gives
	// its tokens (VLLMHasher) with PYTHONHASHSEED set to it, instead of
	// by the cache's own prefix hash, so that a router that hashes
	// prompts itself finds this cache's blocks.
	VLLMHashSeed *string
	// HWM is the PUB socket's high-water mark in messages, a subscriber
	// (0: DefaultHWM): past it, or past BufferBytes of payload queued
	// for that subscriber, messages to it are dropped until it catches
	// up (it sees a gap in the sequence numbers and asks the replay
	// socket).
	HWM int
}

// Stats count what a Publisher did.
type Stats struct {
	// Batches and Events were published; Bytes is their payloads'.
	Batches, Events, Bytes int
	// Dropped counts messages not sent to a subscriber at its
	// high-water mark (one a subscriber).
	Dropped int
	// Subscribers are the connected subscribers that take the topic now
	// (their subscription is in); ReplayClients the replay clients
	// connected now. Refused counts connections closed for what they
	// sent (see the package doc) or past maxPeers.
	Subscribers, ReplayClients, Refused int
	// EncodeErrors counts batches Publish could not encode (not sent,
	// no sequence number taken).
	EncodeErrors int
	// Evicted counts batches that left the replay buffer, the oldest
	// first, for room.
	Evicted int
	// Replays counts replay requests served; Replayed the batches they
	// resent; ReplayRefused the requests refused (malformed, or a
	// negative sequence number), each answered by the end marker alone.
	Replays, Replayed, ReplayRefused int
	// Hash counts the vLLM hasher's work (zero without VLLMHashSeed).
	Hash HashStats
}

// maxPeers bounds the connections a socket holds at once; maxTopics the
// subscriptions one subscriber keeps (those that are a prefix of the
// topic: len(Topic)+1 at most, so the bound is reached only with a topic
// of 256 bytes or more).
const (
	maxPeers  = 256
	maxTopics = 256
)

type kept struct {
	seq     int64
	payload []byte
}

// peer is one connection: a subscriber (its writer goroutine sends what
// Publish queues) or a replay client (its reader goroutine answers).
type peer struct {
	c   *zmq4.Conn
	raw *guardConn
	sub bool

	mu      sync.Mutex
	topics  []string
	match   bool   // a subscription is a prefix of the topic
	pending []kept // queued for the writer, at most HWM
	// queued is the payload bytes of pending and of the batch the
	// writer took and has not sent yet: at most BufferBytes, past which
	// Publish drops as it does at HWM (one batch larger than that is
	// queued alone).
	queued int
	wake   chan struct{}
	done   chan struct{}
}

// Publisher publishes a cache's event batches as vLLM's
// ZmqEventPublisher does. Publish is the kvcache.Config.Events callback.
// All methods are safe for concurrent use.
type Publisher struct {
	opts  Options
	pubLn net.Listener
	repLn net.Listener
	topic []byte
	// hasher, with VLLMHashSeed, renames blocks; hmu serializes
	// Publish around it, so batches are numbered in the order it saw
	// them (it comes before mu).
	hasher *VLLMHasher
	hmu    sync.Mutex
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	quit   chan struct{} // closed by Close: an accept loop's pause ends
	peers  map[*peer]struct{}
	next   int64  // the next batch's sequence number
	ring   []kept // the batches kept for replay, oldest at head
	head   int
	n      int // batches in ring
	bytes  int // their payloads
	stats  Stats
}

// New listens on opts.Endpoint (and opts.ReplayEndpoint), each offset
// by opts.Rank (OffsetEndpoint), and returns a publisher; a bad endpoint
// or option is an error marked driver.ErrInvalid, an ipc:// path a live
// socket listens on one marked driver.ErrBusy, one that cannot be
// listened on otherwise an error too.
func New(opts Options) (*Publisher, error) {
	rank := 0
	if opts.Rank != nil {
		if rank = *opts.Rank; rank < 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: data-parallel rank %d: want 0 or more", rank)
		}
	}
	pub, err := parseEndpoint("endpoint", opts.Endpoint, rank)
	if err != nil {
		return nil, err
	}
	var rep endpoint
	if opts.ReplayEndpoint != "" {
		if rep, err = parseEndpoint("replay endpoint", opts.ReplayEndpoint, rank); err != nil {
			return nil, err
		}
		if rep.network == pub.network && rep.address == pub.address && (pub.network == "unix" || !strings.HasSuffix(pub.address, ":0")) {
			return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: endpoint and replay endpoint are both %s", pub.url())
		}
	}
	switch {
	case opts.Layout != Array && opts.Layout != Map:
		return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: layout %d, want Array or Map", int(opts.Layout))
	case opts.BufferSteps < 0 || opts.BufferBytes < 0 || opts.HWM < 0:
		return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: buffer of %d batches and %d bytes, HWM %d: want none negative", opts.BufferSteps, opts.BufferBytes, opts.HWM)
	}
	if opts.BufferSteps == 0 {
		opts.BufferSteps = DefaultBufferSteps
	}
	if opts.BufferBytes == 0 {
		opts.BufferBytes = DefaultBufferBytes
	}
	if opts.HWM == 0 {
		opts.HWM = DefaultHWM
	}
	p := &Publisher{opts: opts, topic: []byte(opts.Topic), peers: map[*peer]struct{}{}, quit: make(chan struct{})}
	if opts.VLLMHashSeed != nil {
		p.hasher = NewVLLMHasher(*opts.VLLMHashSeed)
	}
	if p.pubLn, err = pub.listen(); err != nil {
		return nil, errors.Wrapf(err, "kvevents: listen on %s", pub.url())
	}
	if opts.ReplayEndpoint != "" {
		if p.repLn, err = rep.listen(); err != nil {
			_ = p.pubLn.Close()
			return nil, errors.Wrapf(err, "kvevents: listen for replay requests on %s", rep.url())
		}
		p.wg.Add(1)
		go p.accept(p.repLn, false)
	}
	p.wg.Add(1)
	go p.accept(p.pubLn, true)
	return p, nil
}

// CheckEndpoint reports whether ep is an endpoint New listens on,
// tcp://HOST:PORT or ipc://PATH: an error marked driver.ErrInvalid says
// why not.
func CheckEndpoint(ep string) error {
	_, err := parseEndpoint("endpoint", ep, 0)
	return err
}

// made says whether p was made by New: the methods of a nil or zero
// Publisher do nothing, and those that return an error say so.
func (p *Publisher) made(op string) error {
	if p == nil || p.peers == nil {
		return errors.Wrapf(driver.ErrInvalid, "kvevents: %s: the publisher was not made by New", op)
	}
	return nil
}

// Addr is the address the PUB socket listens on (its port, where the
// endpoint asked for 0); nil for a publisher not made by New.
func (p *Publisher) Addr() net.Addr {
	if p.made("addr") != nil {
		return nil
	}
	return p.pubLn.Addr()
}

// ReplayAddr is the replay socket's, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.made("replay addr") != nil || p.repLn == nil {
		return nil
	}
	return p.repLn.Addr()
}

// Endpoint is the endpoint the PUB socket listens on as a subscriber
// dials it (tcp://HOST:PORT with the port taken where 0 was asked for,
// or ipc://PATH); "" for a publisher not made by New.
func (p *Publisher) Endpoint() string {
	if p.made("endpoint") != nil {
		return ""
	}
	return urlOf(p.pubLn.Addr())
}

// ReplayEndpoint is the replay socket's, as Endpoint; "" without one.
func (p *Publisher) ReplayEndpoint() string {
	if p.made("replay endpoint") != nil || p.repLn == nil {
		return ""
	}
	return urlOf(p.repLn.Addr())
}

// accept takes connections on ln until Close, each served by a
// goroutine of its own (a handshake that stalls stalls only itself).
func (p *Publisher) accept(ln net.Listener, sub bool) {
	defer p.wg.Done()
	var pause backoff.Pause
	for {
		c, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			// Out of file descriptors, or a connection aborted in the
			// backlog: the accept fails again at once until that ends, so
			// pause rather than spin.
			if !pause.Wait(p.quit) {
				return
			}
			continue
		}
		pause.Reset()
		p.mu.Lock()
		if p.closed || len(p.peers) >= 2*maxPeers || p.countLocked(sub) >= maxPeers {
			if !p.closed {
				p.stats.Refused++
			}
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		pe := &peer{raw: newGuardConn(c), sub: sub, wake: make(chan struct{}, 1), done: make(chan struct{})}
		p.peers[pe] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pe)
	}
}

func (p *Publisher) countLocked(sub bool) int {
	n := 0
	for pe := range p.peers {
		if pe.sub == sub {
			n++
		}
	}
	return n
}

// serve runs pe's handshake, then reads it until it or Close ends it: a
// subscriber's subscriptions (its writer goroutine sends), a replay
// client's requests (answered here).
func (p *Publisher) serve(pe *peer) {
	defer p.wg.Done()
	bad := false // pe sent what no subscriber or replay client sends
	defer func() {
		if bad || pe.raw.refused.Load() {
			p.refused()
		}
		_ = pe.raw.Close()
		pe.raw.endWrites()
		p.drop(pe)
	}()
	// zmq4 parses what the peer sends on this goroutine (the handshake's
	// metadata, each message's frames). The guard refuses the input its
	// parser is known to slice past (guard.go); should another input
	// make it panic, that ends this peer's connection, not the process.
	defer func() {
		if r := recover(); r != nil {
			bad = true
		}
	}()
	kind, want := zmq4.Router, []string{"DEALER", "REQ", "ROUTER"}
	if pe.sub {
		kind, want = zmq4.Pub, []string{"SUB", "XSUB"}
	}
	c, err := zmq4.Open(pe.raw, null.Security(), kind, nil, true, nil)
	if err != nil {
		bad = true
		return
	}
	if !slices.Contains(want, c.Peer.Meta["Socket-Type"]) {
		bad = true
		return
	}
	pe.mu.Lock()
	pe.c = c
	pe.mu.Unlock()
	if pe.sub {
		p.wg.Add(1)
		go p.write(pe)
	}
	for {
		msg, err := c.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue // PING is answered by zmq4; no other command matters
		}
		if pe.sub {
			if !p.subscribe(pe, msg.Frames) {
				bad = true
				return
			}
			continue
		}
		if !p.replay(pe, msg.Frames) {
			return
		}
	}
}

func (p *Publisher) refused() {
	p.mu.Lock()
	p.stats.Refused++
	p.mu.Unlock()
}

// drop forgets pe and closes it; its writer goroutine ends.
func (p *Publisher) drop(pe *peer) {
	p.mu.Lock()
	delete(p.peers, pe)
	p.mu.Unlock()
	_ = pe.raw.Close()
	pe.mu.Lock()
	select {
	case <-pe.done:
	default:
		close(pe.done)
	}
	pe.pending = nil
	pe.mu.Unlock()
}

// subscribe applies a subscription message (one frame: 1 or 0, then
// the topic) and reports whether it was one; other messages a SUB never
// sends, and are refused. Only a subscription that is a prefix of the
// topic is kept (one that is not matches nothing, and its subscribe and
// unsubscribe change nothing): a subscriber keeps at most len(Topic)+1
// of them, whatever it sends.
func (p *Publisher) subscribe(pe *peer, frames [][]byte) bool {
	if len(frames) != 1 || len(frames[0]) == 0 || frames[0][0] > 1 {
		return false
	}
	t := string(frames[0][1:])
	if !strings.HasPrefix(p.opts.Topic, t) {
		return true
	}
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if frames[0][0] == 1 {
		if !slices.Contains(pe.topics, t) {
			if len(pe.topics) >= maxTopics {
				return false
			}
			pe.topics = append(pe.topics, t)
		}
	} else if i := slices.Index(pe.topics, t); i >= 0 {
		pe.topics = slices.Delete(pe.topics, i, i+1)
	}
	pe.match = slices.ContainsFunc(pe.topics, func(s string) bool { return strings.HasPrefix(p.opts.Topic, s) })
	return true
}

// write sends what Publish queued for pe, until pe ends.
func (p *Publisher) write(pe *peer) {
	defer p.wg.Done()
	for {
		select {
		case <-pe.done:
			return
		case <-pe.wake:
		}
		pe.mu.Lock()
		batch := pe.pending
		pe.pending = nil
		pe.mu.Unlock()
		for i, k := range batch {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], uint64(k.seq))
			if pe.raw.writeMsg(p.topic, seqb[:], k.payload) != nil {
				_ = pe.raw.Close() // its reader ends, and drops it
				return
			}
			batch[i] = kept{} // sent: the writer holds it no longer
			pe.mu.Lock()
			pe.queued -= len(k.payload)
			pe.mu.Unlock()
		}
	}
}

// Publish sends b as the next message: topic, its sequence number (8
// bytes, big-endian, from 0), its payload (EncodeBatch), to each
// subscriber whose subscription is a prefix of the topic, and keeps it
// for replay. A batch that cannot be encoded is counted
// (Stats.EncodeErrors) and not sent; after Close, Publish does nothing.
// It never waits for a subscriber.
func (p *Publisher) Publish(b kvcache.EventBatch) {
	if p.made("publish") != nil {
		return
	}
	if p.hasher != nil {
		p.hmu.Lock()
		defer p.hmu.Unlock()
		b, _ = p.hasher.Translate(b) // made by New: no error
	}
	payload, err := EncodeBatch(b, p.opts.Rank, p.opts.Layout)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if err != nil {
		p.stats.EncodeErrors++
		return
	}
	k := kept{seq: p.next, payload: payload}
	p.next++
	for pe := range p.peers {
		if !pe.sub {
			continue
		}
		pe.mu.Lock()
		switch {
		case !pe.match || pe.c == nil:
		case len(pe.pending) >= p.opts.HWM || pe.queued > 0 && pe.queued+len(payload) > p.opts.BufferBytes:
			p.stats.Dropped++
		default:
			pe.pending = append(pe.pending, k)
			pe.queued += len(payload)
			select {
			case pe.wake <- struct{}{}:
			default:
			}
		}
		pe.mu.Unlock()
	}
	p.keepLocked(k)
	p.stats.Batches++
	p.stats.Events += len(b.Events)
	p.stats.Bytes += len(payload)
}

// subscribersLocked is how many subscribers take the topic now.
func (p *Publisher) subscribersLocked() int {
	n := 0
	for pe := range p.peers {
		pe.mu.Lock()
		if pe.sub && pe.match && pe.c != nil {
			n++
		}
		pe.mu.Unlock()
	}
	return n
}

// keepLocked appends k to the ring, evicting the oldest past the bounds.
func (p *Publisher) keepLocked(k kept) {
	for p.n > 0 && (p.n >= p.opts.BufferSteps || p.bytes+len(k.payload) > p.opts.BufferBytes) {
		p.bytes -= len(p.ring[p.head].payload)
		p.ring[p.head] = kept{}
		p.head = (p.head + 1) % len(p.ring)
		p.n--
		p.stats.Evicted++
	}
	if len(k.payload) > p.opts.BufferBytes {
		p.stats.Evicted++ // sent, but larger than the whole buffer
		return
	}
	if p.n == len(p.ring) { // grow: unwrap into a larger slice
		grown := make([]kept, min(max(2*p.n, 16), p.opts.BufferSteps))
		for i := range p.n {
			grown[i] = p.ring[(p.head+i)%p.n]
		}
		p.ring, p.head = grown, 0
	}
	p.ring[(p.head+p.n)%len(p.ring)] = k
	p.n++
	p.bytes += len(k.payload)
}

// Stats is what the publisher did so far.
func (p *Publisher) Stats() Stats {
	if p.made("stats") != nil {
		return Stats{}
	}
	var hs HashStats
	if p.hasher != nil {
		p.hmu.Lock()
		hs = p.hasher.Stats()
		p.hmu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Hash = hs
	s.Subscribers = p.subscribersLocked()
	s.ReplayClients = p.countLocked(false)
	return s
}

// ParseReplayRequest is the sequence number a replay request asks from:
// its frames as the client sent them through a DEALER (a REQ socket adds
// the first itself) — an empty delimiter, the start sequence number as 8
// bytes big-endian. A number below 0 and any other shape are refused
// (driver.ErrInvalid).
func ParseReplayRequest(frames [][]byte) (int64, error) {
	if len(frames) != 2 {
		return 0, errors.Wrapf(driver.ErrInvalid, "kvevents: a replay request of %d frames, want 2 (empty, sequence number)", len(frames))
	}
	if len(frames[0]) != 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "kvevents: a replay request whose first frame has %d bytes, want the empty delimiter", len(frames[0]))
	}
	if len(frames[1]) != 8 {
		return 0, errors.Wrapf(driver.ErrInvalid, "kvevents: a replay request's sequence number of %d bytes, want 8 (big-endian)", len(frames[1]))
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	if seq < 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "kvevents: a replay request from sequence number %d, want 0 or more", seq)
	}
	return seq, nil
}

// replay answers one request of pe's: every batch kept from the number
// asked on (from the oldest kept, if that one is gone: the client sees
// the first number is not the one it asked for) up to the newest when
// it asked, then the end marker; a refused request gets the end marker
// alone. Each batch is looked up as it is sent, so a client that reads
// slowly holds only the one it is being sent, not every batch it asked
// for (a batch evicted meanwhile is skipped, as one gone before it
// asked). It reports whether pe can still be written to.
func (p *Publisher) replay(pe *peer, frames [][]byte) bool {
	start, err := ParseReplayRequest(frames)
	p.mu.Lock()
	end := p.next
	if err != nil {
		p.stats.ReplayRefused++
		start = end
	} else {
		p.stats.Replays++
	}
	p.mu.Unlock()
	for seq := start; seq < end; {
		p.mu.Lock()
		k, ok := p.keptLocked(seq)
		ok = ok && k.seq < end
		if ok {
			p.stats.Replayed++
		}
		p.mu.Unlock()
		if !ok {
			break
		}
		var seqb [8]byte
		binary.BigEndian.PutUint64(seqb[:], uint64(k.seq))
		if pe.c.SendMsg(zmq4.NewMsgFrom(nil, seqb[:], k.payload)) != nil {
			return false
		}
		seq = k.seq + 1
	}
	var endb [8]byte
	endSeq := int64(EndSeq)
	binary.BigEndian.PutUint64(endb[:], uint64(endSeq))
	return pe.c.SendMsg(zmq4.NewMsgFrom(nil, endb[:], nil)) == nil
}

// keptLocked is the kept batch of sequence number seq, or the oldest
// kept after it when that one is gone; false when none is kept from seq
// on. An index into the ring (sequence numbers are consecutive), no
// search.
func (p *Publisher) keptLocked(seq int64) (kept, bool) {
	if p.n == 0 {
		return kept{}, false
	}
	skip := max(seq-p.ring[p.head].seq, 0)
	if skip >= int64(p.n) {
		return kept{}, false
	}
	return p.ring[(p.head+int(skip))%len(p.ring)], true
}

// Close stops publishing, closes both sockets and every connection, and
// waits for its goroutines; closing twice is an error marked
// driver.ErrClosed.
func (p *Publisher) Close() error {
	if err := p.made("close"); err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return driver.Closed("kvevents: close: closed already")
	}
	p.closed = true
	close(p.quit)
	peers := make([]*peer, 0, len(p.peers))
	for pe := range p.peers {
		peers = append(peers, pe)
	}
	p.mu.Unlock()
	err := p.pubLn.Close()
	if p.repLn != nil {
		err = errors.CombineErrors(err, p.repLn.Close())
	}
	for _, pe := range peers {
		_ = pe.raw.Close() // its goroutines end
	}
	p.wg.Wait()
	p.mu.Lock()
	p.ring, p.n, p.bytes = nil, 0, 0
	p.mu.Unlock()
	if err != nil {
		return errors.Wrapf(err, "kvevents: close")
	}
	return nil
}
