package kvevents

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/testexec"
)

// The subscriber runs in a process of its own (the test binary again,
// VMARENA_KVEVENTS_CHILD set), with zmq4's plain tcp transport, as a
// router would: it subscribes, takes batches 0 to N-1, and where a
// sequence number skips some asks the replay socket for them (a DEALER:
// an empty frame, then the number), decodes every payload strictly and
// compares it with the batch the publisher was given (makeBatch, the
// same in both processes). It prints "ok" and its counts, or the error.

func TestMain(m *testing.M) {
	if os.Getenv("VMARENA_KVEVENTS_CHILD") == "subscriber" {
		if err := subscriber(); err != nil {
			fmt.Println("subscriber error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// smallRcvBuf is a tcp transport whose connections take a 4 KiB receive
// buffer, so that a subscriber that stops reading stops the publisher's
// writes soon.
type smallRcvBuf struct{ transport.Transport }

func (s smallRcvBuf) Dial(ctx context.Context, _ transport.Dialer, addr string) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.CombineErrors(err, serr)
	}}
	return d.DialContext(ctx, "tcp", addr)
}

func subscriber() error {
	env := func(k string) string { return os.Getenv("VMARENA_KVEVENTS_" + k) }
	n, _ := strconv.Atoi(env("N"))
	tokens, _ := strconv.Atoi(env("TOKENS"))
	layout, err := ParseLayout(env("LAYOUT"))
	if err != nil {
		return err
	}
	var rank *int
	if r := env("RANK"); r != "" {
		v, _ := strconv.Atoi(r)
		rank = &v
	}
	topic := env("TOPIC")
	pub := env("PUB")
	if env("WAIT") != "" {
		if err := zmq4.RegisterTransport("smallbuf", smallRcvBuf{transport.New("tcp")}); err != nil {
			return err
		}
		pub = "smallbuf://" + strings.TrimPrefix(pub, "tcp://")
	}
	ctx := context.Background()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(pub); err != nil {
		return err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		return err
	}
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(env("REPLAY")); err != nil {
		return err
	}
	fmt.Println("subscribed")
	if env("WAIT") != "" {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return errors.Wrap(err, "wait for the go")
		}
	}
	have := make([]bool, n)
	next, gaps, replayed, live := int64(0), 0, 0, 0
	take := func(seq int64, payload []byte) error {
		if seq < 0 || seq >= int64(n) || have[seq] {
			return nil // past the stream's end (fillers), or had already
		}
		if err := checkPayload(payload, int(seq), tokens, rank, layout); err != nil {
			return err
		}
		have[seq] = true
		for next < int64(n) && have[next] {
			next++
		}
		return nil
	}
	for next < int64(n) {
		msg, err := sub.Recv()
		if err != nil {
			return err
		}
		if len(msg.Frames) != 3 || string(msg.Frames[0]) != topic || len(msg.Frames[1]) != 8 {
			return errors.Newf("a message of %d frames (want topic %q, 8-byte sequence number, payload)", len(msg.Frames), topic)
		}
		seq := int64(binary.BigEndian.Uint64(msg.Frames[1]))
		if seq > next {
			gaps++
			from := next
			var req [8]byte
			binary.BigEndian.PutUint64(req[:], uint64(from))
			if err := dealer.SendMulti(zmq4.NewMsgFrom(nil, req[:])); err != nil {
				return err
			}
			for {
				r, err := dealer.Recv()
				if err != nil {
					return err
				}
				if len(r.Frames) != 3 || len(r.Frames[0]) != 0 || len(r.Frames[1]) != 8 {
					return errors.Newf("a replay reply of %d frames", len(r.Frames))
				}
				rs := int64(binary.BigEndian.Uint64(r.Frames[1]))
				if rs == EndSeq {
					if len(r.Frames[2]) != 0 {
						return errors.New("an end marker with a payload")
					}
					break
				}
				if rs < from {
					return errors.Newf("replay from %d sent %d", from, rs)
				}
				replayed++
				if err := take(rs, r.Frames[2]); err != nil {
					return err
				}
			}
		}
		live++
		if err := take(seq, msg.Frames[2]); err != nil {
			return err
		}
	}
	fmt.Printf("ok gaps %d replayed %d live %d\n", gaps, replayed, live)
	return nil
}

// child is a subscriber process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *lines
	done  chan error
}

// lines collects a child's output and tells when a line came.
type lines struct {
	mu   sync.Mutex
	text strings.Builder
	cond *sync.Cond
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.text.Write(p)
	l.cond.Broadcast()
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// waitFor waits until s is in the output or the child ended.
func (l *lines) waitFor(s string, done *bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !strings.Contains(l.text.String(), s) && !*done {
		l.cond.Wait()
	}
	return strings.Contains(l.text.String(), s)
}

type subOpts struct {
	n, tokens int
	layout    Layout
	rank      *int
	topic     string
	wait      bool
	ipc       bool // the publisher listens on ipc:// endpoints
}

// spawn starts a subscriber of p's and waits until p has its
// subscription.
func spawn(t *testing.T, p *Publisher, o subOpts) *child {
	t.Helper()
	ctx, cancel := testexec.Context(t)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	env := []string{"VMARENA_KVEVENTS_CHILD=subscriber", "VMARENA_KVEVENTS_PUB=" + p.Endpoint(), "VMARENA_KVEVENTS_REPLAY=" + p.ReplayEndpoint(),
		"VMARENA_KVEVENTS_N=" + strconv.Itoa(o.n), "VMARENA_KVEVENTS_TOKENS=" + strconv.Itoa(o.tokens), "VMARENA_KVEVENTS_LAYOUT=" + o.layout.String(),
		"VMARENA_KVEVENTS_TOPIC=" + o.topic}
	if o.rank != nil {
		env = append(env, "VMARENA_KVEVENTS_RANK="+strconv.Itoa(*o.rank))
	}
	if o.wait {
		env = append(env, "VMARENA_KVEVENTS_WAIT=1")
	}
	cmd.Env = append(os.Environ(), env...)
	c := &child{cmd: cmd, out: &lines{}, done: make(chan error, 1)}
	c.out.cond = sync.NewCond(&c.out.mu)
	cmd.Stdout, cmd.Stderr = c.out, c.out
	var err error
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ended := false
	go func() {
		err := cmd.Wait()
		c.out.mu.Lock()
		ended = true
		c.out.cond.Broadcast()
		c.out.mu.Unlock()
		c.done <- err
	}()
	c.out.mu.Lock()
	endedp := &ended
	c.out.mu.Unlock()
	require.True(t, c.out.waitFor("subscribed", endedp), "the subscriber ended: %s", c.out)
	// The PUB socket sends a batch only to the connections whose
	// subscription it has read.
	for p.Stats().Subscribers == 0 {
		time.Sleep(time.Millisecond)
	}
	return c
}

// counts parses the child's "ok gaps G replayed R live L".
func (c *child) counts(t *testing.T) (gaps, replayed, live int) {
	t.Helper()
	out := c.out.String()
	i := strings.Index(out, "ok gaps")
	require.GreaterOrEqual(t, i, 0, "the subscriber's output: %s", out)
	_, err := fmt.Sscanf(out[i:], "ok gaps %d replayed %d live %d", &gaps, &replayed, &live)
	require.NoError(t, err, out)
	t.Logf("subscriber pid %d: %s", c.cmd.Process.Pid, strings.TrimSpace(out[i:]))
	return gaps, replayed, live
}

// TestSubscriberProcess: a subscriber in another process takes every
// batch live and decodes it as vLLM's classes define the format, in
// both layouts, with a topic and a rank or with neither, over tcp and
// over ipc endpoints (offset by the rank).
func TestSubscriberProcess(t *testing.T) {
	two, one := 2, 1
	for _, o := range []subOpts{{n: 300, layout: Array, rank: &two, topic: "kv@node-1"}, {n: 300, layout: Map}, {n: 300, layout: Array, rank: &one, ipc: true}} {
		var p *Publisher
		if o.ipc {
			dir := shortDir(t)
			var err error
			p, err = New(Options{Endpoint: "ipc://" + dir + "/pub", ReplayEndpoint: "ipc://" + dir + "/replay", Layout: o.layout, Rank: o.rank})
			require.NoError(t, err)
			require.Equal(t, "ipc://"+dir+"/pub_dp1", p.Endpoint())
		} else {
			p = newPublisher(t, Options{Layout: o.layout, Rank: o.rank, Topic: o.topic})
		}
		c := spawn(t, p, o)
		for i := range o.n {
			p.Publish(makeBatch(i, 0))
		}
		require.NoError(t, <-c.done, c.out.String())
		gaps, _, live := c.counts(t)
		require.Equal(t, o.n, live, "every batch live")
		require.Zero(t, gaps)
		require.Zero(t, p.Stats().Dropped)
		require.NoError(t, p.Close())
	}
}

// TestMissedBatchesReplayed: batches published before the subscriber
// connected reach it through the replay socket.
func TestMissedBatchesReplayed(t *testing.T) {
	p := newPublisher(t, Options{})
	for i := range 100 {
		p.Publish(makeBatch(i, 0))
	}
	o := subOpts{n: 200, layout: Array}
	c := spawn(t, p, o)
	for i := 100; i < o.n; i++ {
		p.Publish(makeBatch(i, 0))
	}
	require.NoError(t, <-c.done, c.out.String())
	gaps, replayed, _ := c.counts(t)
	require.GreaterOrEqual(t, gaps, 1)
	require.GreaterOrEqual(t, replayed, 100)
	s := p.Stats()
	require.GreaterOrEqual(t, s.Replays, 1)
	require.Zero(t, s.ReplayRefused)
	require.NoError(t, p.Close())
}

// TestSlowSubscriber: a subscriber that stops reading while 96 batches
// of 64 Ki tokens (about 200 KiB each) are published fills its buffers,
// the PUB socket's queue reaches its mark of 2 and drops; when it reads
// again it sees the gaps and the replay socket gives it what was
// dropped. Batches after the stream (fillers) keep coming until it has
// all, as a live server's would, so that a dropped tail shows as a gap.
func TestSlowSubscriber(t *testing.T) {
	const n, tokens = 96, 64 << 10
	p := newPublisher(t, Options{HWM: 2})
	c := spawn(t, p, subOpts{n: n, tokens: tokens, layout: Array, wait: true})
	for i := range n {
		p.Publish(makeBatch(i, tokens))
	}
	_, err := c.stdin.Write([]byte("go\n"))
	require.NoError(t, err)
	var childErr error
	for filler := n; ; filler++ {
		select {
		case childErr = <-c.done:
		default:
			p.Publish(kvcache0(filler))
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	require.NoError(t, childErr, c.out.String())
	gaps, replayed, _ := c.counts(t)
	require.GreaterOrEqual(t, gaps, 1, "the PUB socket dropped nothing: %s", c.out)
	require.Positive(t, replayed)
	require.Positive(t, p.Stats().Dropped, "the subscriber's queue reached its mark")
	require.NoError(t, p.Close())
}

// kvcache0 is an empty batch (a filler past a test stream's end).
func kvcache0(i int) (b kvcacheBatch) {
	b.TS = time.Unix(int64(i), 0)
	return b
}
