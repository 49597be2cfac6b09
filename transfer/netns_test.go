package transfer_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/transfer"
)

// Environment of the child processes of the two-host test.
const (
	// initiatorEnv makes the test binary the initiator process
	// (runInitiator) of that engine kind.
	initiatorEnv = "VMARENA_TRANSFER_INITIATOR"
	// listenEnv and leaseEnv are a child engine's Config.Listen and
	// Config.LeaseTimeout (a time.ParseDuration string).
	listenEnv = "VMARENA_TRANSFER_LISTEN"
	leaseEnv  = "VMARENA_TRANSFER_LEASE"
)

// idle reports the process's goroutines and open file descriptors, after
// a garbage collection.
func idle() (string, error) {
	s, err := leakcheck.Take()
	return fmt.Sprintf("%d %d", runtime.NumGoroutine(), s.FDs), err
}

// check reports whether the canary pages are as they were filled and
// each registered byte is that of seeded(n, a) or of seeded(n, b).
func (c *canaried) check(a, b uint64) (string, error) {
	pa, pb := seeded(int(c.n), a), seeded(int(c.n), b)
	var reply string
	err := c.r.t.Access(false, func(all []byte) error {
		want := seeded(len(all), c.seed)
		for i := range 2 * canaryPage {
			j := len(all) - 1 - i
			if all[i] != want[i] || all[j] != want[j] {
				return errors.Newf("canary byte %d or %d changed", i, j)
			}
		}
		mid := all[2*canaryPage : 2*canaryPage+int(c.n)]
		exactA, exactB := true, true
		for i, v := range mid {
			exactA, exactB = exactA && v == pa[i], exactB && v == pb[i]
			if v != pa[i] && v != pb[i] {
				return errors.Newf("registered byte %d is %#x, neither %#x (seed %d) nor %#x (seed %d)", i, v, pa[i], a, pb[i], b)
			}
		}
		switch {
		case exactA:
			reply = fmt.Sprintf("exact %d", a)
		case exactB:
			reply = fmt.Sprintf("exact %d", b)
		default:
			reply = "mixed"
		}
		return nil
	})
	return reply, err
}

// runInitiator is the initiator process: host memory and, once warm (an
// engine made and closed, so that what UCX keeps for the process's life
// is there), a leak snapshot; then one command a line:
//
//	connect ADDR        make an engine of the kind and a peer of ADDR: ok
//	desc HEX            the remote descriptor the puts go to: ok
//	puts N SEED         N puts of the whole descriptor, the i-th of seeded(Len, SEED+i): a line "step I" after each, then ok N, or err I MESSAGE at the first failure
//	proxy MODE ADDR     a fault-injecting proxy to ADDR (faultProxy): ok PROXYADDR
//	close               close the peer, the engine and the proxy: ok
//	quit                close everything; ok, or err naming what leaked
func runInitiator(kind string, in io.Reader, out io.Writer) (err error) {
	h, err := newHostMem(1 << 30)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, h.close()) }()
	lease, _ := time.ParseDuration(os.Getenv(leaseEnv))
	cfg := transfer.Config{Kind: kind, Listen: os.Getenv(listenEnv), LeaseTimeout: lease, DialRetries: 2}
	warm, err := transfer.New(cfg)
	if err != nil {
		return err
	}
	if err := warm.Close(); err != nil {
		return err
	}
	goroutines := runtime.NumGoroutine()
	before, err := leakcheck.Take()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "addr none")
	var (
		e      *transfer.Engine
		p      *transfer.Peer
		local  *region
		lr     *transfer.Registration
		remote transfer.Descriptor
		px     *faultProxy
	)
	closeAll := func() error {
		var err error
		if px != nil {
			px.close()
			px = nil
		}
		if e != nil {
			err = e.Close() // closes p and lr
			e, p, lr = nil, nil, nil
		}
		if local != nil {
			err = errors.CombineErrors(err, local.end())
			local = nil
		}
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := func(i int) string {
			if i < len(f) {
				return f[i]
			}
			return ""
		}
		num := func(i int) uint64 { v, _ := strconv.ParseUint(arg(i), 10, 64); return v }
		var reply string
		var err error
		switch f[0] {
		case "connect":
			if e == nil {
				e, err = transfer.New(cfg)
			}
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 4*cfg.LeaseTimeout)
				p, err = e.Connect(ctx, arg(1))
				cancel()
			}
		case "desc":
			var b []byte
			if b, err = hex.DecodeString(arg(1)); err == nil {
				err = remote.UnmarshalBinary(b)
			}
			if err == nil && local == nil {
				local, err = newRegion(h.a, remote.Len, 0)
			}
			if err == nil && lr == nil && e != nil {
				lr, err = e.Register(local.t)
			}
		case "puts":
			n, seed := num(1), num(2)
			var i uint64
			for ; i < n && err == nil; i++ {
				if err = local.t.Access(true, func(b []byte) error { fillSeed(b, seed+i); return nil }); err == nil {
					err = p.Put(context.Background(), transfer.Op{Local: lr, Remote: remote, Len: remote.Len})
				}
				if err == nil {
					fmt.Fprintln(out, "step", i)
				}
			}
			if err != nil {
				err = errors.Wrapf(err, "%d", i-1)
			}
			reply = fmt.Sprint(n)
		case "proxy":
			px, err = newFaultProxy(arg(1), arg(2))
			if err == nil {
				reply = px.addr()
			}
		case "close":
			err = closeAll()
		case "quit":
			err = closeAll()
			if err == nil {
				err = settled(goroutines, before)
			}
			answer(out, "", err)
			return nil
		default:
			err = errors.Newf("unknown command %q", f[0])
		}
		answer(out, reply, err)
	}
	return errors.CombineErrors(sc.Err(), closeAll())
}

// settled waits (a bounded count of rounds, as TestNoLeaks does) for the
// process's goroutines and file descriptors to come back to a snapshot's,
// and says what did not.
func settled(goroutines int, before leakcheck.Snapshot) error {
	var now leakcheck.Snapshot
	var err error
	for range 750 { // 15 s at most, within the 20 s the test waits for an answer
		if now, err = leakcheck.Take(); err != nil {
			return err
		}
		if runtime.NumGoroutine() <= goroutines && now.FDs <= before.FDs {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.Newf("leaked: %d goroutines (%d before), %s (before: %s)", runtime.NumGoroutine(), goroutines, now, before)
}

// faultProxy forwards TCP connections from its listener (127.0.0.1, in
// the initiator's network namespace) to a target and injects one fault
// in the data either way:
//
//	latency    each chunk waits 20 ms before it is forwarded
//	bandwidth  at most 2 MiB/s each way (a put of 1 MiB takes about half a second)
//	trickle    at most 64 KiB/s: a put of 1 MiB outlives a 2 s LeaseTimeout
//	reset      after 300 KiB toward the target, both connections are reset (RST)
//	stall      after 300 KiB toward the target, nothing more is forwarded, and the connections close 5 s later (a slow close)
//	slice      every chunk is forwarded in writes of 1 to 64 bytes
//
// It is written here rather than taken from toxiproxy: the six faults are
// a page of code, and toxiproxy/v2 would add its HTTP API, metrics and
// logging dependencies to go.mod for the test alone.
type faultProxy struct {
	ln     net.Listener
	mode   string
	to     string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed chan struct{}
}

func newFaultProxy(mode, to string) (*faultProxy, error) {
	switch mode {
	case "latency", "bandwidth", "trickle", "reset", "stall", "slice":
	default:
		return nil, errors.Newf("no proxy mode %q", mode)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	x := &faultProxy{ln: ln, mode: mode, to: to, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	x.wg.Add(1)
	go x.accept()
	return x, nil
}

func (x *faultProxy) addr() string { return x.ln.Addr().String() }

func (x *faultProxy) track(c net.Conn) {
	x.mu.Lock()
	x.conns[c] = struct{}{}
	x.mu.Unlock()
}

func (x *faultProxy) accept() {
	defer x.wg.Done()
	for {
		c, err := x.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", x.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		x.track(c)
		x.track(d)
		x.wg.Add(2)
		go func() { defer x.wg.Done(); x.pipe(c, d, true) }()
		go func() { defer x.wg.Done(); x.pipe(d, c, false) }()
	}
}

// pipe forwards from src to dst with the proxy's fault (toTarget: the
// direction of a put's payload).
func (x *faultProxy) pipe(src, dst net.Conn, toTarget bool) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 32<<10)
	var moved int
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		b := buf[:n]
		switch x.mode {
		case "latency":
			time.Sleep(20 * time.Millisecond)
		case "bandwidth", "trickle":
			rate := map[string]int{"bandwidth": 2 << 20, "trickle": 64 << 10}[x.mode]
			time.Sleep(time.Duration(n) * time.Second / time.Duration(rate))
		case "reset", "stall":
			if toTarget && moved+n > 300<<10 {
				if x.mode == "reset" {
					for _, c := range []net.Conn{src, dst} {
						_ = c.(*net.TCPConn).SetLinger(0)
					}
					return
				}
				select {
				case <-time.After(5 * time.Second):
				case <-x.closed:
				}
				return
			}
		}
		for len(b) > 0 {
			k := len(b)
			if x.mode == "slice" {
				k = min(k, 1+rng.IntN(64))
			}
			if _, err := dst.Write(b[:k]); err != nil {
				return
			}
			b = b[k:]
		}
		moved += n
	}
}

// close stops the proxy and closes its connections.
func (x *faultProxy) close() {
	close(x.closed)
	_ = x.ln.Close()
	x.mu.Lock()
	for c := range x.conns {
		_ = c.Close()
	}
	x.mu.Unlock()
	x.wg.Wait()
}

// kill kills the child process and waits for it.
func (p *peerProc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// send writes a command without reading its answer.
func (p *peerProc) send(format string, args ...any) {
	p.t.Helper()
	_, err := fmt.Fprintf(p.in, format+"\n", args...)
	require.NoError(p.t, err)
}

// until reads lines until one starts with "ok" or "err", calling onStep
// with the number of each "step" line before; it returns the last line.
func (p *peerProc) until(onStep func(i int)) string {
	p.t.Helper()
	for {
		l := p.line()
		if s, ok := strings.CutPrefix(l, "step "); ok {
			i, _ := strconv.Atoi(s)
			if onStep != nil {
				onStep(i)
			}
			continue
		}
		return l
	}
}

// netns is a pair of network namespaces joined by a veth pair, made for
// one test and removed after it.
type netns struct {
	a, b         string // the namespaces: the target's and the initiator's
	devA, devB   string // their ends of the veth pair
	addrA, addrB string // their addresses (no port)
	ip           func(args ...string) error
}

// newNetns makes the namespaces, or skips the test (fails it under CI)
// where they cannot be made.
func newNetns(t *testing.T) *netns {
	t.Helper()
	id := os.Getpid() % 100000
	n := &netns{
		a: fmt.Sprintf("vmxt%da", id), b: fmt.Sprintf("vmxt%db", id),
		devA: fmt.Sprintf("vx%da", id), devB: fmt.Sprintf("vx%db", id),
		addrA: fmt.Sprintf("10.231.%d.1", id%250), addrB: fmt.Sprintf("10.231.%d.2", id%250),
	}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return errors.Newf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	unable := func(err error) {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, and network namespaces cannot be made: %v", err)
		}
		t.Skipf("network namespaces cannot be made here (root and iproute2 are needed): %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		unable(err)
	}
	if err := ip("netns", "add", n.a); err != nil {
		unable(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", n.a) })
	if err := ip("netns", "add", n.b); err != nil {
		unable(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", n.b) }) // removes the veth pair with it
	for _, args := range [][]string{
		{"link", "add", n.devA, "netns", n.a, "type", "veth", "peer", "name", n.devB, "netns", n.b},
		{"-n", n.a, "addr", "add", n.addrA + "/24", "dev", n.devA},
		{"-n", n.b, "addr", "add", n.addrB + "/24", "dev", n.devB},
		{"-n", n.a, "link", "set", n.devA, "up"},
		{"-n", n.b, "link", "set", n.devB, "up"},
		{"-n", n.a, "link", "set", "lo", "up"},
		{"-n", n.b, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			unable(err)
		}
	}
	n.ip = ip
	if err := n.up(); err != nil {
		unable(err)
	}
	return n
}

// up waits (a bounded count of rounds) for both ends of the veth pair to
// be up (operstate UP: UCX uses only a device that is).
func (n *netns) up() error {
	var out []byte
	for range 200 {
		ready := 0
		for _, ns := range [][2]string{{n.a, n.devA}, {n.b, n.devB}} {
			var err error
			if out, err = exec.Command("ip", "-n", ns[0], "link", "show", "dev", ns[1]).CombinedOutput(); err != nil {
				return errors.Newf("ip link show %s: %v: %s", ns[1], err, out)
			}
			if strings.Contains(string(out), "state UP") {
				ready++
			}
		}
		if ready == 2 {
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return errors.Newf("the veth pair did not come up: %s", out)
}

// TestTwoHosts: a target in one network namespace and an initiator in
// another (the test binary re-executed in each with ip netns exec),
// joined by a veth pair, over both kinds, with faults injected while a
// put of 1 MiB is in flight:
//
//   - the link set down (for longer than LeaseTimeout) and up again;
//   - the initiator process killed;
//   - for tcp, through a fault-injecting proxy in the initiator's
//     namespace: latency, a bandwidth limit, a trickle below what
//     LeaseTimeout allows, a reset, a stall with a slow close, and writes
//     sliced to 1-64 bytes;
//   - the target process killed.
//
// The bound is the engines' LeaseTimeout (2 s in both processes): every
// op completes byte-exact or fails with an error, which the initiator
// reports (the test asserts that it returns, never how fast); the
// canary pages around the target's registration never change and its
// bytes are always those of the last put done or a mix of it and the one
// cut off; the target serves a new initiator after each fault; and
// neither side leaks goroutines or file descriptors (the target's counts
// come back to what they were before the first connection; the
// initiator's, after Close, to what they were before its first engine).
func TestTwoHosts(t *testing.T) {
	n := newNetns(t)
	kinds(t, func(t *testing.T, kind string) { twoHosts(t, n, kind) })
}

func twoHosts(t *testing.T, n *netns, kind string) {
	const size = 1 << 20
	env := func(role, dev string, more ...string) []string {
		return append([]string{role + "=" + kind, leaseEnv + "=2s", "UCX_TLS=tcp", "UCX_NET_DEVICES=" + dev}, more...)
	}
	target := startProc(t, []string{"ip", "netns", "exec", n.a}, env(peerEnv, n.devA, listenEnv+"="+n.addrA+":0"))
	d := target.desc(target.do("canary A %d 3", size))
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	desc := hex.EncodeToString(b)
	base := target.do("idle")
	initiator := func() *peerProc {
		return startProc(t, []string{"ip", "netns", "exec", n.b}, env(initiatorEnv, n.devB))
	}
	// failed parses "err I: MESSAGE", the index of the put that failed.
	failed := func(l string) uint64 {
		t.Helper()
		var i uint64
		_, err := fmt.Sscanf(l, "err %d:", &i)
		require.NoError(t, err, "the initiator's answer: %q", l)
		t.Logf("put %d failed: %s", i, l)
		return i
	}
	good := func(in *peerProc, to string, seed uint64) {
		t.Helper()
		in.do("connect %s", to)
		in.do("desc %s", desc)
		in.send("puts 3 %d", seed)
		require.Equal(t, "ok 3", in.until(nil))
		require.Equal(t, fmt.Sprintf("exact %d", seed+2), target.do("check A %d %d", seed+2, seed+2))
		in.do("close")
	}
	settle := func() {
		t.Helper()
		var g0, f0, g, f int
		_, err := fmt.Sscan(base, &g0, &f0)
		require.NoError(t, err)
		now := ""
		for range 750 { // about 15 s at most: generous on a loaded machine
			now = target.do("idle")
			_, err := fmt.Sscan(now, &g, &f)
			require.NoError(t, err)
			if g <= g0 && f <= f0 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("the target holds %s goroutines and fds, %s before the first connection", now, base)
	}

	in := initiator()
	good(in, target.addr, 100)
	if kind == "ucx" {
		// UCX keeps a socket of its own from the first connection on
		// (its tcp transport's): the counts to come back to are those
		// after it, once they stop changing.
		for prev := ""; base != prev; time.Sleep(200 * time.Millisecond) {
			prev, base = base, target.do("idle")
		}
	}
	settle()

	// The link down mid-put and up again, on the initiator's end of the
	// veth pair, then the target's: for 300 ms (TCP retransmits within
	// LeaseTimeout: the puts go on), then until the put in flight failed
	// (past LeaseTimeout). The long one is where the initiator's bytes
	// can reach the target after the initiator gave up and its
	// connection was reset: with UCX's one-sided put over its tcp
	// transport, UCX 1.13 aborted the target then (ucp_put_handler,
	// "ucp_request.inl:346 Fatal: unexpected error: Endpoint timeout");
	// the engine's active messages need no answer from the target's UCX,
	// and a window closed at the target drops what comes late.
	for k, side := range [][2]string{{n.b, n.devB}, {n.a, n.devA}} {
		for _, long := range []bool{false, true} {
			seed, count := 200+100*uint64(k), 12
			if long {
				seed, count = seed+50, 1000
			}
			in.do("connect %s", target.addr)
			in.do("desc %s", desc)
			in.send("puts %d %d", count, seed)
			downed := false
			l := in.until(func(i int) {
				if i == 2 && !downed {
					require.NoError(t, n.ip("-n", side[0], "link", "set", side[1], "down"))
					downed = true
					if !long {
						time.Sleep(300 * time.Millisecond) // the fault's length, not a bound
						require.NoError(t, n.ip("-n", side[0], "link", "set", side[1], "up"))
					}
				}
			})
			require.True(t, downed, "the puts ended before the link went down: %s", l)
			if long {
				require.NoError(t, n.ip("-n", side[0], "link", "set", side[1], "up"))
			}
			require.NoError(t, n.up())
			in.do("close")
			if last := seed + uint64(count) - 1; l == fmt.Sprintf("ok %d", count) {
				require.Equal(t, fmt.Sprintf("exact %d", last), target.do("check A %d %d", last, last))
			} else {
				// Failed (a short link down may outlast LeaseTimeout too,
				// with TCP's retransmission backoff).
				i := failed(l)
				settle() // the target dropped the connection and let go; its UCX closed its side
				require.NotEqual(t, "", target.do("check A %d %d", seed+i-1, seed+i))
			}
			good(in, target.addr, 300)
			settle()
		}
	}

	// The initiator killed mid-put.
	killed := initiator()
	killed.do("connect %s", target.addr)
	killed.do("desc %s", desc)
	killed.send("puts 1000 400")
	last, dead := -1, false
	killed.until(func(i int) {
		last = max(last, i)
		if i == 2 && !dead {
			killed.kill()
			dead = true
		}
	})
	require.True(t, dead)
	settle()
	require.NotEqual(t, "", target.do("check A %d %d", 400+last, 400+last+1))
	good(in, target.addr, 500)
	settle()

	if kind == "tcp" {
		prev := uint64(502)
		for k, mode := range []string{"latency", "bandwidth", "trickle", "reset", "stall", "slice"} {
			seed := 600 + 10*uint64(k)
			paddr := in.do("proxy %s %s", mode, target.addr)
			in.do("connect %s", paddr)
			in.do("desc %s", desc)
			in.send("puts 2 %d", seed)
			l := in.until(nil)
			switch mode {
			case "trickle", "reset", "stall":
				require.Equal(t, uint64(0), failed(l), mode)
				require.NotEqual(t, "", target.do("check A %d %d", prev, seed))
			default:
				if l == "ok 2" {
					require.Equal(t, fmt.Sprintf("exact %d", seed+1), target.do("check A %d %d", seed+1, seed+1), mode)
					break
				}
				// These faults slow a put without stopping it, and it
				// completes within LeaseTimeout (2 s) on an idle machine;
				// on a loaded one (sliced writes cost CPU) it may not,
				// and a failure within the bound is what the package
				// promises too. Expecting success would be a timing
				// assertion.
				i := failed(l)
				from := prev
				if i > 0 {
					from = seed + i - 1
				}
				require.NotEqual(t, "", target.do("check A %d %d", from, seed+i), mode)
			}
			in.do("close")
			settle()
			good(in, target.addr, seed+5)
			prev = seed + 7
			settle()
		}
	}

	// The target killed mid-put: the initiator's op fails, and it leaks
	// nothing.
	in.do("connect %s", target.addr)
	in.do("desc %s", desc)
	in.send("puts 1000 900")
	gone := false
	l := in.until(func(i int) {
		if i == 2 && !gone {
			target.kill()
			gone = true
		}
	})
	require.True(t, gone)
	failed(l)
	in.do("close")
	in.do("quit") // ok: the initiator leaked nothing
}

// listeningPorts lists the TCP ports this process listens on (its
// sockets in /proc/self/fd, found in /proc/self/net/tcp) but the port of
// addr.
func listeningPorts(addr string) (string, error) {
	_, skip, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return "", err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []string
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if err == nil && strconv.FormatUint(p, 10) != skip {
				ports = append(ports, strconv.FormatUint(p, 10))
			}
		}
	}
	return strings.Join(ports, " "), nil
}
