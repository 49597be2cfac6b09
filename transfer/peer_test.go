package transfer_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
)

// The peer process: the test binary re-executed with peerEnv set to the
// engine kind. It makes an engine and host-driver memory, prints "addr
// ADDR", then obeys one command a line on stdin, answering "ok ..." or
// "err MESSAGE" a line on stdout:
//
//	lease NAME SIZE SEED   a leased tensor over an arena view, filled from SEED, registered: ok HEX(descriptor)
//	kv NAME SEED           a KV cache sequence's layer-0 keys, filled, registered: ok HEX(descriptor)
//	remap NAME SEED        the owner takes the memory back and hands out new memory, filled: ok
//	canary NAME SIZE SEED  SIZE bytes between two canary pages on each side, all filled from SEED; the SIZE bytes registered: ok HEX(descriptor)
//	reg NAME               register NAME's current tensor: ok HEX(descriptor)
//	hash NAME              ok SHA256HEX of NAME's current bytes
//	whole NAME             ok SHA256HEX of a canary's bytes with the canary pages
//	check NAME A B         a canary's pages are as filled, and each registered byte is that of seeded(SIZE, A) or of B: ok exact A|exact B|mixed
//	idle                   ok GOROUTINES FDS (after a GC), once the engine's Check passes
//	ucxports               ok PORT...: the TCP ports this process listens on but the engine's control port (UCX's own)
//	stats                  ok PUTS GETS BYTESOUT BYTESIN REFUSED
//	cpu                    ok NANOSECONDS: the process's CPU time so far (user and system)
//	sock NAME              serve a plain TCP socket over NAME's memory (the benchmark's baseline): ok ADDR
//	quit                   close everything and exit
const peerEnv = "VMARENA_TRANSFER_PEER"

func TestMain(m *testing.M) {
	if os.Getenv(fdFloodEnv) != "" {
		if err := runFDFlood(); err != nil {
			fmt.Fprintln(os.Stderr, "descriptor flood:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if kind := os.Getenv(initiatorEnv); kind != "" {
		if err := runInitiator(kind, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "initiator:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if path := os.Getenv(devPeerEnv); path != "" {
		if err := runDevicePeer(path, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "device peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if kind := os.Getenv(peerEnv); kind != "" {
		if err := runPeer(kind, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// remappable is memory whose owner may take it back: a region or a KV
// cache sequence.
type remappable interface {
	tensor() *tensor.Tensor
	remapTo(seed uint64) error
}

func (r *region) tensor() *tensor.Tensor    { return r.t }
func (r *region) remapTo(seed uint64) error { return r.remap(seed) }
func (k *kvSeq) tensor() *tensor.Tensor     { return k.t }
func (k *kvSeq) remapTo(seed uint64) error  { return k.remap(seed) }
func (c *canaried) tensor() *tensor.Tensor  { return c.mid }
func (c *canaried) remapTo(seed uint64) error {
	if err := c.r.remap(seed); err != nil {
		return err
	}
	c.seed = seed
	return c.narrow()
}

// canaryPage is the size of each canary on either side of a canaried
// region's registered bytes: two pages, so that a descriptor moved by a
// byte or a page still lands in a canary.
const canaryPage = 4096

// canaried is a region of n bytes between canaries of 2*canaryPage bytes
// on each side, all filled from one seed; mid is the n bytes.
type canaried struct {
	r       *region
	n, seed uint64
	mid     *tensor.Tensor
}

func newCanaried(a *arena.Arena, n, seed uint64) (*canaried, error) {
	r, err := newRegion(a, n+4*canaryPage, seed)
	if err != nil {
		return nil, err
	}
	c := &canaried{r: r, n: n, seed: seed}
	if err := c.narrow(); err != nil {
		return nil, errors.CombineErrors(err, r.end())
	}
	return c, nil
}

func (c *canaried) narrow() (err error) {
	c.mid, err = c.r.t.Narrow(0, 2*canaryPage, int(c.n))
	return err
}

func runPeer(kind string, in io.Reader, out io.Writer) (err error) {
	h, err := newHostMem(1 << 30)
	if err != nil {
		return err
	}
	lease, _ := time.ParseDuration(os.Getenv(leaseEnv)) // unset: 0, the default
	e, err := transfer.New(transfer.Config{Kind: kind, Listen: os.Getenv(listenEnv), LeaseTimeout: lease})
	if err != nil {
		return errors.CombineErrors(err, h.close())
	}
	mems := map[string]remappable{}
	var kvs []*kvSeq
	var regions []*region
	var socks []net.Listener
	var wg sync.WaitGroup
	defer func() {
		err = errors.CombineErrors(err, e.Close())
		for _, l := range socks {
			_ = l.Close()
		}
		wg.Wait()
		for _, r := range regions {
			err = errors.CombineErrors(err, r.end())
		}
		for _, k := range kvs {
			err = errors.CombineErrors(err, k.close())
		}
		err = errors.CombineErrors(err, h.close())
	}()
	fmt.Fprintln(out, "addr", e.Addr())
	register := func(t *tensor.Tensor) (string, error) {
		r, err := e.Register(t)
		if err != nil {
			return "", err
		}
		d, err := r.Descriptor()
		if err != nil {
			return "", err
		}
		b, err := d.MarshalBinary()
		return hex.EncodeToString(b), err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		num := func(i int) uint64 {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseUint(f[i], 10, 64)
			return v
		}
		var reply string
		var err error
		switch f[0] {
		case "lease":
			var r *region
			if r, err = newRegion(h.a, num(2), num(3)); err == nil {
				regions = append(regions, r)
				mems[f[1]] = r
				reply, err = register(r.t)
			}
		case "kv":
			var k *kvSeq
			if k, err = newKVSeq(h, num(2)); err == nil {
				kvs = append(kvs, k)
				mems[f[1]] = k
				reply, err = register(k.t)
			}
		case "canary":
			var c *canaried
			if c, err = newCanaried(h.a, num(2), num(3)); err == nil {
				regions = append(regions, c.r)
				mems[f[1]] = c
				reply, err = register(c.mid)
			}
		case "whole":
			err = mems[f[1]].(*canaried).r.t.Access(false, func(b []byte) error { reply = sha(b); return nil })
		case "remap":
			err = mems[f[1]].remapTo(num(2))
		case "reg":
			reply, err = register(mems[f[1]].tensor())
		case "hash":
			err = mems[f[1]].tensor().Access(false, func(b []byte) error {
				s := sha256.Sum256(b)
				reply = hex.EncodeToString(s[:])
				return nil
			})
		case "check":
			reply, err = mems[f[1]].(*canaried).check(num(2), num(3))
		case "ucxports":
			reply, err = listeningPorts(e.Addr())
		case "idle":
			if err = e.Check(); err == nil {
				reply, err = idle()
			}
		case "cpu":
			reply = fmt.Sprint(cpuTime().Nanoseconds())
		case "stats":
			s := e.Stats()
			reply = fmt.Sprintf("%d %d %d %d %d", s.Puts, s.Gets, s.BytesOut, s.BytesIn, s.Refused)
		case "sock":
			var l net.Listener
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
				socks = append(socks, l)
				reply = l.Addr().String()
				wg.Add(1)
				go func(t *tensor.Tensor) { defer wg.Done(); serveSocket(l, t) }(mems[f[1]].tensor())
			}
		case "quit":
			fmt.Fprintln(out, "ok")
			return nil
		default:
			err = errors.Newf("unknown command %q", f[0])
		}
		answer(out, reply, err)
	}
	return sc.Err()
}

// answer writes a peer command's reply line: "err" and the error on one
// line, or "ok" and reply.
func answer(out io.Writer, reply string, err error) {
	if err != nil {
		fmt.Fprintln(out, "err", strings.ReplaceAll(err.Error(), "\n", " "))
	} else {
		fmt.Fprintln(out, "ok", reply)
	}
}

// serveSocket is the benchmark's baseline: a plain socket moving the
// same bytes, under the same tensor access, with no protocol but a
// 9-byte command ('P' or 'G', then a u64 length) and a 1-byte ack of a
// put.
func serveSocket(l net.Listener, t *tensor.Tensor) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		func() {
			defer c.Close()
			var h [9]byte
			for {
				if _, err := io.ReadFull(c, h[:]); err != nil {
					return
				}
				n := binary.BigEndian.Uint64(h[1:])
				err := t.Access(h[0] == 'P', func(b []byte) error {
					if n > uint64(len(b)) {
						return errors.New("too long")
					}
					if h[0] == 'P' {
						if _, err := io.ReadFull(c, b[:n]); err != nil {
							return err
						}
						_, err := c.Write([]byte{1})
						return err
					}
					_, err := c.Write(b[:n])
					return err
				})
				if err != nil {
					return
				}
			}
		}()
	}
}

// peerProc is a running peer process.
type peerProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	addr string
}

// startPeer starts the peer process with an engine of kind and env
// (KEY=VALUE) added; it is stopped at the end of the test.
func startPeer(t testing.TB, kind string, env ...string) *peerProc {
	t.Helper()
	return startProc(t, nil, append([]string{peerEnv + "=" + kind}, env...))
}

// startProc starts this test binary as a child, run through the prefix
// command (nil: none; e.g. ip netns exec NAME) with env added, and
// reads its first line, "addr ADDR".
func startProc(t testing.TB, prefix []string, env []string) *peerProc {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	argv := append(append([]string(nil), prefix...), exe, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &peerProc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(p.stop)
	line := p.line()
	require.True(t, strings.HasPrefix(line, "addr "), "the peer's first line: %q", line)
	p.addr = strings.TrimPrefix(line, "addr ")
	return p
}

// line reads one line from the peer, failing after 20 s.
func (p *peerProc) line() string {
	p.t.Helper()
	got := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			got <- p.out.Text()
		} else {
			got <- "eof"
		}
	}()
	l := <-got
	return l
}

// do sends a command and returns the ok reply (failing the test on err).
func (p *peerProc) do(format string, args ...any) string {
	p.t.Helper()
	_, err := fmt.Fprintf(p.in, format+"\n", args...)
	require.NoError(p.t, err)
	l := p.line()
	require.True(p.t, strings.HasPrefix(l, "ok"), "peer: %s: %s", fmt.Sprintf(format, args...), l)
	return strings.TrimSpace(strings.TrimPrefix(l, "ok"))
}

// desc decodes a descriptor reply.
func (p *peerProc) desc(reply string) transfer.Descriptor {
	p.t.Helper()
	b, err := hex.DecodeString(reply)
	require.NoError(p.t, err)
	var d transfer.Descriptor
	require.NoError(p.t, d.UnmarshalBinary(b))
	return d
}

func (p *peerProc) hash(name string) string { return p.do("hash %s", name) }

func (p *peerProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_, _ = fmt.Fprintln(p.in, "quit")
	_ = p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	err := <-done
	if err != nil {
		p.t.Errorf("peer: %v", err)
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// connect connects e to addr (a connect that never ends is go test
// -timeout's).
func connect(t testing.TB, e *transfer.Engine, addr string) *transfer.Peer {
	t.Helper()
	p, err := e.Connect(context.Background(), addr)
	require.NoError(t, err)
	return p
}
