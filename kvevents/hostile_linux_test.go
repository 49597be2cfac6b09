package kvevents

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/leakcheck"
)

// TestHostileReplayRequests: malformed requests (another frame count, a
// delimiter with bytes, a number of 7 or 9 bytes), a negative number and
// one past the newest get the end marker alone and change nothing;
// garbage in place of ZMTP, a frame announcing 1 GiB and a message of
// many frames close their connection without the process allocating
// them; a peer that connects and says nothing does not stop the next
// one. Through all of it the publisher still replays every batch.
func TestHostileReplayRequests(t *testing.T) {
	p := newPublisher(t, Options{})
	for i := range 20 {
		p.Publish(makeBatch(i, 0))
	}
	all := make([]int64, 20)
	for i := range all {
		all[i] = int64(i)
	}
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	require.NoError(t, d.Dial("tcp://"+p.ReplayAddr().String()))
	require.Equal(t, all, replayFrom(t, d, nil, seq8(0)))
	before := p.Stats()

	for _, frames := range [][][]byte{
		{seq8(0)},                 // no delimiter
		{nil, seq8(0), seq8(0)},   // four frames with the identity
		{[]byte("x"), seq8(0)},    // a delimiter with bytes
		{nil, seq8(0)[:7]},        // 7 bytes
		{nil, append(seq8(0), 0)}, // 9 bytes
		{nil, seq8(-1)},           // negative
		{nil, seq8(-1 << 63)},     // the most negative
	} {
		require.Empty(t, replayFrom(t, d, frames...), "frames %x", frames)
	}
	require.Empty(t, replayFrom(t, d, nil, seq8(1<<62)), "past the newest")
	require.Equal(t, all[15:], replayFrom(t, d, nil, seq8(15)))
	after := p.Stats()
	require.Equal(t, before.ReplayRefused+7, after.ReplayRefused)
	require.Equal(t, before.Batches, after.Batches)

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := ms.HeapAlloc
	addr := p.ReplayAddr().String()
	// Each connection is closed by the publisher: reading it ends.
	closedByPeer := func(send ...[]byte) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		for _, s := range send {
			if _, err := c.Write(s); err != nil {
				return // closed already
			}
		}
		_, _ = io.Copy(io.Discard, c) // ends at EOF or a reset: the publisher closed it
	}
	huge := append([]byte{0x02}, seq8(1<<30)...)
	closedByPeer([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 64))))
	closedByPeer(greeting(), readyAs("DEALER"), huge)
	closedByPeer(greeting(), readyAs("DEALER"), append([]byte{0x02}, seq8(-1)...)) // a negative length
	many := []byte{}
	for range 100 {
		many = append(many, 0x01, 0) // empty frames, each with MORE
	}
	closedByPeer(greeting(), readyAs("DEALER"), many)
	closedByPeer(greeting(), append([]byte{0x00, 1, 0}, readyAs("DEALER")...)) // a message before READY
	silent, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer silent.Close()
	d2 := zmq4.NewDealer(context.Background())
	defer d2.Close()
	require.NoError(t, d2.Dial("tcp://"+addr))
	require.Equal(t, all, replayFrom(t, d2, nil, seq8(0)), "a silent peer stops no one")
	runtime.GC()
	runtime.ReadMemStats(&ms)
	require.Less(t, int64(ms.HeapAlloc)-int64(heap), int64(64<<20), "the heap grew by %d bytes", int64(ms.HeapAlloc)-int64(heap))
	final := p.Stats()
	require.Equal(t, after.Batches, final.Batches)
	require.GreaterOrEqual(t, final.Refused, 5, "each hostile connection refused")
	require.NoError(t, p.Close())
}

// TestHostileHandshakes: a first command that is no READY of whole
// properties — some of which zmq4's own metadata parser slices past and
// panics on, which on a serving goroutine would end the process — closes
// its connection on either socket, counted as refused; a subscriber and
// a replay client are served afterwards.
func TestHostileHandshakes(t *testing.T) {
	p := newPublisher(t, Options{})
	for _, addr := range []string{p.Addr().String(), p.ReplayAddr().String()} {
		for _, b := range badReadies {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			_, _ = c.Write(cat(greeting(), command(b.body)))
			_, _ = io.Copy(io.Discard, c) // ends when the publisher closes it
			require.NoError(t, c.Close(), b.name)
		}
	}
	for p.Stats().Refused < 2*len(badReadies) {
		time.Sleep(time.Millisecond) // counted as each connection's goroutine ends
	}
	require.Equal(t, 2*len(badReadies), p.Stats().Refused)
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
	for p.Stats().Subscribers == 0 {
		time.Sleep(time.Millisecond)
	}
	servesOne(t, p, sub)
	require.NoError(t, p.Close())
}

// servesOne publishes batch 0 and checks that sub receives it and that
// a replay client is sent it.
func servesOne(t *testing.T, p *Publisher, sub zmq4.Socket) {
	t.Helper()
	p.Publish(makeBatch(0, 0))
	m, err := sub.Recv()
	require.NoError(t, err)
	require.NoError(t, checkPayload(m.Frames[2], 0, 0, nil, Array))
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	require.NoError(t, d.Dial("tcp://"+p.ReplayAddr().String()))
	require.Equal(t, []int64{0}, replayFrom(t, d, nil, seq8(0)))
}

// TestNoLeaks: a publisher that served a subscriber and a replay and
// closed, with a subscriber that never reads (a raw connection that
// subscribed) still connected and batches still queued for it, leaves no
// file descriptor, mapping or goroutine behind.
func TestNoLeaks(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	work := func() {
		p := newPublisher(t, Options{})
		sub := zmq4.NewSub(context.Background())
		require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
		require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
		stalled, err := net.Dial("tcp", p.Addr().String())
		require.NoError(t, err)
		_, err = stalled.Write(append(append(greeting(), readyAs("SUB")...), 0x00, 1, 1)) // subscribe to ""
		require.NoError(t, err)
		for p.Stats().Subscribers < 2 {
			time.Sleep(time.Millisecond)
		}
		servesOne(t, p, sub)
		for i := range 50 {
			p.Publish(makeBatch(i, 64<<10)) // more than the stalled one's buffers take
		}
		for range 50 {
			// zmq4's SUB leaks the reader goroutine of a connection that
			// received messages no Recv took: take them all.
			_, err := sub.Recv()
			require.NoError(t, err)
		}
		require.NoError(t, sub.Close())
		require.NoError(t, p.Close())
		require.NoError(t, stalled.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %s, after %s", before, after)
	for runtime.NumGoroutine() > goroutines {
		time.Sleep(5 * time.Millisecond) // a leak is left to go test's -timeout
	}
}

// TestHostileCommandFrames: a command frame with the MORE flag (ZMTP
// commands are single frames), after the handshake or as the READY
// itself, followed by more such frames, closes its connection on either
// socket (zmq4 would append them to one message without end); a
// subscriber and a replay client are served afterwards.
func TestHostileCommandFrames(t *testing.T) {
	p := newPublisher(t, Options{})
	more := []byte{}
	for range 100 {
		more = append(more, 0x05, 0) // an empty command frame, with MORE
	}
	readyMore := readyAs("DEALER")
	readyMore[0] |= 0x01
	for _, addr := range []string{p.Addr().String(), p.ReplayAddr().String()} {
		for _, send := range [][]byte{
			cat(greeting(), readyAs("DEALER"), more),
			cat(greeting(), readyAs("SUB"), more),
			cat(greeting(), readyMore, more),
		} {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			_, _ = c.Write(send)
			// A publisher that holds the connection open waiting for the
			// message's next frame is what this test catches: the deadline
			// only tells that from a close, generously.
			require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
			_, err = io.Copy(io.Discard, c)
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection was not closed: the publisher waits for more frames")
			require.NoError(t, c.Close())
		}
	}
	for p.Stats().Refused < 6 {
		time.Sleep(time.Millisecond) // counted as each connection's goroutine ends
	}
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
	for p.Stats().Subscribers == 0 {
		time.Sleep(time.Millisecond)
	}
	servesOne(t, p, sub)
	require.NoError(t, p.Close())
}

// TestHostileSubscriptions: subscribers that each subscribe to hundreds
// of long topics that are no prefix of the publisher's (they match
// nothing) do not make the publisher keep them: the heap does not grow
// by what they sent. They are served as subscribers, and so is a
// subscriber of the topic.
func TestHostileSubscriptions(t *testing.T) {
	p := newPublisher(t, Options{Topic: "kv"})
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := ms.HeapAlloc
	const conns, subs, size = 8, 250, 60 << 10
	long := make([]byte, 0, 9+1+size)
	for i := range conns {
		c, err := net.Dial("tcp", p.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write(cat(greeting(), readyAs("SUB")))
		require.NoError(t, err)
		for j := range subs {
			long = append(long[:0], 0x02)
			long = binary.BigEndian.AppendUint64(long, 1+size)
			long = append(long, 1, byte(i), byte(j), byte(j>>8))
			long = append(long, make([]byte, size-3)...)
			_, err = c.Write(long)
			require.NoError(t, err)
		}
		_, err = c.Write([]byte{0x00, 1, 1}) // and "": every topic
		require.NoError(t, err)
	}
	for p.Stats().Subscribers < conns { // each subscription applied in order, "" last
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grew := int64(ms.HeapAlloc) - int64(heap)
	require.Less(t, grew, int64(32<<20), "the heap grew by %d bytes: the publisher keeps subscriptions that match nothing", grew)
	require.Zero(t, p.Stats().Refused)
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "k"))
	for p.Stats().Subscribers < conns+1 {
		time.Sleep(time.Millisecond)
	}
	servesOne(t, p, sub)
	require.NoError(t, p.Close())
}

// TestStalledReplayClients: replay clients that each ask for every
// batch kept and then read nothing, one after another while the replay
// buffer turns over, hold no more than the batch each is being sent:
// the heap does not grow by the buffers they asked for, the batches
// evicted meanwhile are not kept for them. A replay client is served
// throughout, and the publisher closes.
func TestStalledReplayClients(t *testing.T) {
	const bufferBytes, clients = 32 << 20, 8
	p := newPublisher(t, Options{BufferBytes: bufferBytes})
	next := 0
	fill := func() { // a buffer's worth of new batches, the old ones evicted
		for b := 0; b < bufferBytes; {
			batch := makeBatch(next, 32<<10)
			next++
			payload, err := EncodeBatch(batch, nil, Array)
			require.NoError(t, err)
			b += len(payload)
			p.Publish(batch)
		}
	}
	fill()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := ms.HeapAlloc
	request := cat([]byte{0x01, 0, 0x00, 8}, seq8(0))
	for i := range clients {
		c, err := net.DialTCP("tcp", nil, p.ReplayAddr().(*net.TCPAddr))
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetReadBuffer(4096)) // what the kernel takes in for it stays small
		_, err = c.Write(cat(greeting(), readyAs("DEALER"), request))
		require.NoError(t, err)
		for p.Stats().Replays < i+1 {
			time.Sleep(time.Millisecond)
		}
		fill()
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grew := int64(ms.HeapAlloc) - int64(heap)
	require.Less(t, grew, int64(bufferBytes), "the heap grew by %d bytes: stalled replay clients keep the batches evicted since they asked", grew)
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	require.NoError(t, d.Dial("tcp://"+p.ReplayAddr().String()))
	require.Equal(t, []int64{int64(next - 1)}, replayFrom(t, d, nil, seq8(int64(next-1))))
	require.NoError(t, p.Close())
}

// TestStalledSubscriber: a subscriber that reads nothing while many
// times the replay buffer's bytes are published has at most about
// BufferBytes queued for it (the rest is dropped, counted, and left to
// the replay socket), not HWM messages of any size: the heap does not
// grow by what was published. A subscriber that reads is sent every
// batch published after it subscribed.
func TestStalledSubscriber(t *testing.T) {
	const bufferBytes = 8 << 20
	p := newPublisher(t, Options{BufferBytes: bufferBytes})
	c, err := net.DialTCP("tcp", nil, p.Addr().(*net.TCPAddr))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadBuffer(4096)) // what the kernel takes in for it stays small
	_, err = c.Write(cat(greeting(), readyAs("SUB"), []byte{0x00, 1, 1}))
	require.NoError(t, err)
	for p.Stats().Subscribers < 1 {
		time.Sleep(time.Millisecond)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := ms.HeapAlloc
	for i := 0; p.Stats().Bytes < 8*bufferBytes; i++ {
		p.Publish(makeBatch(i, 32<<10))
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grew := int64(ms.HeapAlloc) - int64(heap)
	require.Less(t, grew, int64(4*bufferBytes), "the heap grew by %d bytes: the stalled subscriber's queue keeps what was published", grew)
	require.Positive(t, p.Stats().Dropped)

	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
	for p.Stats().Subscribers < 2 {
		time.Sleep(time.Millisecond)
	}
	first := p.Stats().Batches
	for i := range 20 {
		p.Publish(makeBatch(first+i, 0))
	}
	for i := range 20 {
		m, err := sub.Recv()
		require.NoError(t, err)
		require.Equal(t, uint64(first+i), binary.BigEndian.Uint64(m.Frames[1]))
	}
	require.NoError(t, p.Close())
}

// TestPingsWhilePublishing: a subscriber that sends PING commands (as
// libzmq's does with ZMQ_HEARTBEAT_IVL) while batches are published to
// it gets every message whole, three frames with no command between
// them or inside one, and a PONG for its pings, each between messages.
func TestPingsWhilePublishing(t *testing.T) {
	const n = 20000
	p := newPublisher(t, Options{})
	c, err := net.Dial("tcp", p.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(cat(greeting(), readyAs("SUB"), []byte{0x00, 1, 1}))
	require.NoError(t, err)
	for p.Stats().Subscribers < 1 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		ping := command("\x04PING\x00\x00")
		for range n {
			if _, err := c.Write(ping); err != nil {
				return
			}
		}
	}()
	go func() {
		for i := range n {
			p.Publish(makeBatch(i, 0))
		}
	}()
	r := bufio.NewReader(c)
	_, err = io.ReadFull(r, make([]byte, greetingLen))
	require.NoError(t, err)
	frames, msgs, pongs := 0, 0, 0
	for msgs < n {
		flags, err := r.ReadByte()
		require.NoError(t, err)
		var size uint64
		if flags&0x02 != 0 {
			var b [8]byte
			_, err = io.ReadFull(r, b[:])
			size = binary.BigEndian.Uint64(b[:])
		} else {
			var b byte
			b, err = r.ReadByte()
			size = uint64(b)
		}
		require.NoError(t, err)
		require.True(t, flags&^0x07 == 0 && size < 1<<20, "a frame header %#x of %d bytes after %d messages: the stream is garbled", flags, size, msgs)
		body := make([]byte, size)
		_, err = io.ReadFull(r, body)
		require.NoError(t, err)
		if flags&0x04 != 0 {
			require.Zero(t, frames, "a command %q inside message %d", body, msgs)
			if string(body[:min(len(body), 6)]) == "\x05READY" {
				continue
			}
			require.Equal(t, "\x04PONG", string(body))
			pongs++
			continue
		}
		frames++
		if flags&0x01 == 0 {
			require.Equal(t, 3, frames, "message %d", msgs)
			frames = 0
			msgs++
		}
	}
	require.Positive(t, pongs)
	require.NoError(t, p.Close())
}
