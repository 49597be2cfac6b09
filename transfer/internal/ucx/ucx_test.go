//go:build ucx && linux && cgo

package ucx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// The transfer tests run a real peer process: the test binary re-executed
// with VMARENA_UCX_PEER set, which TestMain runs instead of the tests. The
// peer registers memfd memory and answers commands on stdin, one a line,
// with hex on stdout (see peerMain).
const peerEnv = "VMARENA_UCX_PEER"

// memSize is the size of the memory each side registers.
const memSize = 1 << 20

func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" {
		if err := peerMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "peer error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// mapped is memfd memory mapped shared, outside the Go heap, as UCX needs.
type mapped struct {
	fd int
	b  []byte
}

func newMapped(size int) (*mapped, error) {
	fd, err := unix.MemfdCreate("vmarena-ucx-test", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &mapped{fd: fd, b: b}, nil
}

func (m *mapped) addr() uintptr { return uintptr(unsafe.Pointer(&m.b[0])) }

func (m *mapped) close() {
	_ = unix.Munmap(m.b)
	_ = unix.Close(m.fd)
}

// peerMain is the peer: a worker, memSize bytes of memfd memory registered
// on it, and a line announcing "worker-address base rkey" in hex. Then
// "read OFF N" answers the N bytes at OFF in hex, "write OFF HEX" stores
// them and answers "ok", "open OFF N W" opens a window over N bytes at
// OFF (writable when W is 1) and answers its token in hex, "wait TOKEN"
// answers "ok" once it is full or "err MESSAGE",
// "shut TOKEN" closes it and answers "ok", "dropped" answers the count of
// messages the worker dropped, and "quit" (or the end of stdin) closes
// all and ends.
func peerMain(in io.Reader, out io.Writer) error {
	w, err := NewWorker(true)
	if err != nil {
		return err
	}
	defer w.Close()
	mem, err := newMapped(memSize)
	if err != nil {
		return err
	}
	defer mem.close()
	reg, err := w.Register(mem.addr(), memSize)
	if err != nil {
		return err
	}
	defer reg.Close()
	rkey, err := reg.RKey()
	if err != nil {
		return err
	}
	addr, err := w.Address()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%x %x %x\n", addr, mem.addr(), rkey)
	windows := map[string]*Window{}
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "read":
			off, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			fmt.Fprintf(out, "%x\n", mem.b[off:off+n])
		case len(f) == 3 && f[0] == "write":
			off, _ := strconv.Atoi(f[1])
			b, err := hex.DecodeString(f[2])
			if err != nil {
				return err
			}
			copy(mem.b[off:], b)
			fmt.Fprintln(out, "ok")
		case len(f) == 4 && f[0] == "open":
			off, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			x, token, err := w.Open(mem.addr()+uintptr(off), uint64(n), f[3] == "1")
			if err != nil {
				return err
			}
			windows[fmt.Sprintf("%x", token)] = x
			fmt.Fprintf(out, "%x\n", token)
		case len(f) == 2 && f[0] == "wait":
			err := windows[f[1]].Wait(context.Background())
			if err != nil {
				fmt.Fprintln(out, "err", strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				fmt.Fprintln(out, "ok")
			}
		case len(f) == 2 && f[0] == "shut":
			if err := windows[f[1]].Close(); err != nil {
				return err
			}
			fmt.Fprintln(out, "ok")
		case len(f) == 1 && f[0] == "dropped":
			n, err := w.Dropped()
			if err != nil {
				return err
			}
			fmt.Fprintln(out, n)
		case len(f) == 1 && f[0] == "quit":
			return nil
		default:
			return errors.Newf("unknown command %q", line)
		}
	}
}

// peer is a running peer process as the test sees it.
type peer struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	addr   []byte // its worker's address
	base   uint64 // its registered memory's address
	rkey   []byte
}

// startPeer runs the peer with this process's environment (UCX_TLS and
// the like included) and reads its announcement. The peer is killed at
// the test's end if it is still running.
func startPeer(t *testing.T) *peer {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	p := &peer{t: t, lines: make(chan string, 1)}
	p.cmd = exec.Command(exe, "-test.run=^$")
	// A peer built with -race would sleep a second before it exits (the
	// race runtime's atexit_sleep_ms) unless told not to.
	p.cmd.Env = append(os.Environ(), peerEnv+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.cmd.Stderr = &p.stderr
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		r := bufio.NewReaderSize(stdout, 1<<16)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(p.lines)
				return
			}
			p.lines <- strings.TrimSpace(line)
		}
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	f := strings.Fields(p.line())
	require.Len(t, f, 3, "the peer's announcement")
	p.addr, err = hex.DecodeString(f[0])
	require.NoError(t, err)
	p.base, err = strconv.ParseUint(f[1], 16, 64)
	require.NoError(t, err)
	p.rkey, err = hex.DecodeString(f[2])
	require.NoError(t, err)
	return p
}

// line returns the peer's next line, failing the test when the peer
// ended instead (a peer that never answers is go test -timeout's).
func (p *peer) line() string {
	p.t.Helper()
	l, ok := <-p.lines
	if !ok {
		p.t.Fatalf("the peer ended: %s", p.stderr.String())
	}
	return l
}

func (p *peer) send(format string, args ...any) {
	p.t.Helper()
	_, err := fmt.Fprintf(p.stdin, format+"\n", args...)
	require.NoError(p.t, err)
}

// read returns n bytes of the peer's memory at off.
func (p *peer) read(off, n int) []byte {
	p.t.Helper()
	p.send("read %d %d", off, n)
	b, err := hex.DecodeString(p.line())
	require.NoError(p.t, err)
	return b
}

// write stores b in the peer's memory at off.
func (p *peer) write(off int, b []byte) {
	p.t.Helper()
	p.send("write %d %x", off, b)
	require.Equal(p.t, "ok", p.line())
}

// quit asks the peer to close everything and waits for it to end.
func (p *peer) quit() {
	p.t.Helper()
	p.send("quit")
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	require.NoError(p.t, <-done, "the peer's stderr: %s", p.stderr.String())
}

// transports are the UCX configurations the tests run under: tcp over the
// loopback device, and shared memory with tcp beside it. UCX 1.13's
// shared-memory transports (posix, sysv, self) have no peer failure
// handler, which UCP_ERR_HANDLING_MODE_PEER needs of the transport that
// carries wireup and active messages, so UCX_TLS=sm,self is unreachable
// here; with tcp for those, cma (process_vm_writev) carries the large puts
// and gets between the processes.
var transports = []struct {
	name string
	env  map[string]string
}{
	{"tcp", map[string]string{"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}},
	{"shm+tcp", map[string]string{"UCX_TLS": "sm,tcp", "UCX_NET_DEVICES": "lo"}},
}

// skipUnsupported skips the test when err says UCX has no transport for
// the configuration here (ErrUnsupported: no device; or UCS_ERR_UNREACHABLE,
// which the tests, whose peers are alive, only get for want of a
// transport), and otherwise requires no error.
func skipUnsupported(t *testing.T, err error, what string) {
	t.Helper()
	if errors.Is(err, driver.ErrUnsupported) || err != nil && strings.Contains(err.Error(), "Destination is unreachable") {
		t.Skipf("UCX has no transport for %s=%q here (%s: %v)", "UCX_TLS", os.Getenv("UCX_TLS"), what, err)
	}
	require.NoError(t, err, what)
}

// newWorker is NewWorker, the worker closed at the test's end.
func newWorker(t *testing.T) *Worker {
	t.Helper()
	w, err := NewWorker(true)
	skipUnsupported(t, err, "NewWorker")
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	return w
}

func newMappedT(t *testing.T) *mapped {
	t.Helper()
	m, err := newMapped(memSize)
	require.NoError(t, err)
	t.Cleanup(m.close)
	return m
}

// flushed flushes e with a context nothing ends: a flush that hangs is
// go test -timeout's.
func flushed(t *testing.T, e *Endpoint) error {
	t.Helper()
	return e.Flush(context.Background())
}

// span is a random length, from one byte to 256 KiB, as likely short as
// long (so UCX's short, copy and zero-copy protocols all run), and an
// offset for it in memSize bytes.
func span(rng *rand.Rand) (off, n int) {
	n = 1 + rng.IntN(1<<(4+rng.IntN(15)))
	return rng.IntN(memSize - n + 1), n
}

// TestPutGetByteExact puts and gets 20 random spans of random bytes
// between this process and a peer, each transport, and compares every
// byte on the other side.
func TestPutGetByteExact(t *testing.T) {
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			w := newWorker(t)
			p := startPeer(t)
			local := newMappedT(t)
			e, err := w.Connect(p.addr)
			skipUnsupported(t, err, "Connect")
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 22))
			for i := range 20 {
				loff, n := span(rng)
				roff := rng.IntN(memSize - n + 1)
				for j := range n {
					local.b[loff+j] = byte(rng.Uint32())
				}
				require.NoError(t, e.Put(local.addr()+uintptr(loff), uint64(n), p.base+uint64(roff), p.rkey))
				require.NoError(t, flushed(t, e))
				require.True(t, bytes.Equal(local.b[loff:loff+n], p.read(roff, n)), "round %d: put %d bytes", i, n)

				roff, n = span(rng)
				loff = rng.IntN(memSize - n + 1)
				want := make([]byte, n)
				for j := range want {
					want[j] = byte(rng.Uint32())
				}
				p.write(roff, want)
				require.NoError(t, e.Get(local.addr()+uintptr(loff), uint64(n), p.base+uint64(roff), p.rkey))
				require.NoError(t, flushed(t, e))
				require.True(t, bytes.Equal(want, local.b[loff:loff+n]), "round %d: got %d bytes", i, n)
			}
			t.Logf("Connect tried again %d times", w.retries.Load())
			require.NoError(t, e.Close())
			require.NoError(t, e.Close(), "closing twice")
			p.quit()
		})
	}
}

// TestDeadPeerFlush: once the peer process has died, a Flush answers an
// error (the endpoint's error callback ran) well before its context ends,
// and so does every later call; Close still closes.
func TestDeadPeerFlush(t *testing.T) {
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			w := newWorker(t)
			p := startPeer(t)
			local := newMappedT(t)
			e, err := w.Connect(p.addr)
			skipUnsupported(t, err, "Connect")
			require.NoError(t, e.Put(local.addr(), 4096, p.base, p.rkey))
			require.NoError(t, flushed(t, e))

			require.NoError(t, p.cmd.Process.Kill())
			_ = p.cmd.Wait()
			start := time.Now()
			var failed error
			for failed == nil {
				if failed = e.Put(local.addr(), 4096, p.base, p.rkey); failed == nil {
					failed = flushed(t, e)
				}
			}
			t.Logf("after %s: %v", time.Since(start).Round(time.Millisecond), failed)
			require.Error(t, failed, "a call fails after the peer's death")
			require.ErrorIs(t, flushed(t, e), driver.ErrDeviceFault, "a failed endpoint stays failed")
			require.NoError(t, e.Close())
		})
	}
}

// TestFlushDeadline: a Flush whose context ends first (the peer is
// stopped, so its worker cannot acknowledge the put) answers the context's
// error; once the peer runs again, the next Flush completes the put.
func TestFlushDeadline(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w := newWorker(t)
	p := startPeer(t)
	local := newMappedT(t)
	e, err := w.Connect(p.addr)
	skipUnsupported(t, err, "Connect")
	require.NoError(t, p.cmd.Process.Signal(unix.SIGSTOP))
	cont := func() { _ = p.cmd.Process.Signal(unix.SIGCONT) }
	defer cont()
	copy(local.b, "written while the peer was stopped")
	require.NoError(t, e.Put(local.addr(), 34, p.base+100, p.rkey))
	// The context's end is what is under test: a flush waiting on a
	// stopped peer returns when it ends, however long that took.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	require.ErrorIs(t, e.Flush(ctx), context.DeadlineExceeded)
	cancel()
	cont()
	require.NoError(t, flushed(t, e))
	require.Equal(t, "written while the peer was stopped", string(p.read(100, 34)))
	require.NoError(t, e.Close())
	p.quit()
}

// TestConnectToClosedWorker: Connect to the address of a worker that has
// closed answers an error after its bounded retries, never hangs, and
// leaves the worker working.
func TestConnectToClosedWorker(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	gone, err := NewWorker(true)
	skipUnsupported(t, err, "NewWorker")
	addr, err := gone.Address()
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	w := newWorker(t)
	_, err = w.Connect(addr)
	require.ErrorIs(t, err, driver.ErrDeviceFault)
	t.Logf("%v (tried again %d times)", err, w.retries.Load())
	own, err := w.Address()
	require.NoError(t, err)
	e, err := w.Connect(own)
	require.NoError(t, err)
	require.NoError(t, e.Close())
}

// TestConcurrentLoopback: goroutines putting and getting on one endpoint
// (to the worker itself) at once each see their own bytes.
func TestConcurrentLoopback(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w := newWorker(t)
	mem := newMappedT(t)
	reg, err := w.Register(mem.addr(), memSize)
	require.NoError(t, err)
	rkey, err := reg.RKey()
	require.NoError(t, err)
	own, err := w.Address()
	require.NoError(t, err)
	e, err := w.Connect(own)
	skipUnsupported(t, err, "Connect")
	const goroutines, rounds, n = 4, 10, 8192
	errs := make(chan error, goroutines)
	for g := range goroutines {
		go func() {
			errs <- func() error {
				// Goroutine g owns the quarter of the memory at g*memSize/4:
				// it puts its first n bytes to the next n, and gets those
				// back into the n after.
				base := g * memSize / goroutines
				src, dst, back := base, base+n, base+2*n
				for r := range rounds {
					for i := range n {
						mem.b[src+i] = byte(g*rounds + r + i)
					}
					if err := e.Put(mem.addr()+uintptr(src), n, uint64(mem.addr())+uint64(dst), rkey); err != nil {
						return err
					}
					if err := flushed(t, e); err != nil {
						return err
					}
					if err := e.Get(mem.addr()+uintptr(back), n, uint64(mem.addr())+uint64(dst), rkey); err != nil {
						return err
					}
					if err := flushed(t, e); err != nil {
						return err
					}
					if !bytes.Equal(mem.b[src:src+n], mem.b[back:back+n]) {
						return errors.Newf("goroutine %d, round %d: the bytes got back differ from those put", g, r)
					}
				}
				return nil
			}()
		}()
	}
	for range goroutines {
		require.NoError(t, <-errs)
	}
}

// TestRKeyCacheBounded: an endpoint that is handed more remote keys than
// its cache holds empties the cache when no op is in flight, and every
// put still lands.
func TestRKeyCacheBounded(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w := newWorker(t)
	mem := newMappedT(t)
	own, err := w.Address()
	require.NoError(t, err)
	e, err := w.Connect(own)
	skipUnsupported(t, err, "Connect")
	e.rkeyLimit = 4 // set before any key is unpacked; the goroutine reads it after run's hand-over
	const page = 4096
	for i := range 10 {
		reg, err := w.Register(mem.addr()+uintptr(i*page), page)
		require.NoError(t, err)
		rkey, err := reg.RKey()
		require.NoError(t, err)
		copy(mem.b[memSize/2:], fmt.Sprintf("key %d", i))
		require.NoError(t, e.Put(mem.addr()+memSize/2, 5, uint64(mem.addr())+uint64(i*page), rkey))
		require.NoError(t, flushed(t, e))
		require.Equal(t, fmt.Sprintf("key %d", i), string(mem.b[i*page:i*page+5]))
		var cached int
		require.NoError(t, w.run("test", func() error { cached = len(e.rkeys); return nil }))
		require.LessOrEqual(t, cached, 4)
		require.NoError(t, reg.Close())
	}
}

// TestRefusals: bad arguments are ErrInvalid and leave the endpoint as it
// was; a Flush whose context has ended answers the context's error; and
// after Close every call is ErrClosed, while Close again is nil.
func TestRefusals(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w, err := NewWorker(true)
	skipUnsupported(t, err, "NewWorker")
	mem := newMappedT(t)
	_, err = w.Register(0, memSize)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = w.Register(mem.addr(), 0)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = w.Connect(nil)
	require.ErrorIs(t, err, driver.ErrInvalid)
	reg, err := w.Register(mem.addr(), memSize)
	require.NoError(t, err)
	rkey, err := reg.RKey()
	require.NoError(t, err)
	addr, err := w.Address()
	require.NoError(t, err)
	e, err := w.Connect(addr) // to itself, over tcp on lo
	skipUnsupported(t, err, "Connect")
	base := uint64(mem.addr())

	require.ErrorIs(t, e.Put(mem.addr(), 0, base, rkey), driver.ErrInvalid)
	require.ErrorIs(t, e.Put(0, 8, base, rkey), driver.ErrInvalid)
	require.ErrorIs(t, e.Get(mem.addr(), 8, base, nil), driver.ErrInvalid)
	require.ErrorIs(t, e.Get(mem.addr(), 16, ^uint64(7), rkey), driver.ErrInvalid)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, e.Flush(ctx), context.Canceled)
	require.ErrorIs(t, e.Flush(nil), driver.ErrInvalid) //nolint:staticcheck // a nil context is what is refused

	// The endpoint works as before: a put from the first half of the
	// memory to the second, through the loopback.
	copy(mem.b, "refused calls change nothing")
	require.NoError(t, e.Put(mem.addr(), 28, base+memSize/2, rkey))
	require.NoError(t, flushed(t, e))
	require.Equal(t, "refused calls change nothing", string(mem.b[memSize/2:memSize/2+28]))

	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "closing twice")
	_, err = w.Address()
	require.ErrorIs(t, err, driver.ErrClosed)
	_, err = w.Register(mem.addr(), memSize)
	require.ErrorIs(t, err, driver.ErrClosed)
	_, err = w.Connect(addr)
	require.ErrorIs(t, err, driver.ErrClosed)
	_, err = reg.RKey()
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, e.Put(mem.addr(), 8, base, rkey), driver.ErrClosed)
	require.ErrorIs(t, e.Get(mem.addr(), 8, base, rkey), driver.ErrClosed)
	require.ErrorIs(t, flushed(t, e), driver.ErrClosed)
	require.NoError(t, e.Close(), "an endpoint's Close after the worker's")
	require.NoError(t, reg.Close(), "a registration's Close after the worker's")
}

// TestCloseLeaksNothing: a worker's whole life (registration, remote key,
// an endpoint to itself, a put and a get, Close) leaves no descriptor,
// mapping or goroutine behind. UCX keeps some process-wide state after its
// first use (its async thread's event descriptors, memory hooks), which
// leakcheck.Compare's warm-up round takes; the rounds measured are the
// later ones.
func TestCloseLeaksNothing(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	mem := newMappedT(t)
	goroutines := runtime.NumGoroutine()
	life := func() {
		w, err := NewWorker(true)
		skipUnsupported(t, err, "NewWorker")
		reg, err := w.Register(mem.addr(), memSize)
		require.NoError(t, err)
		rkey, err := reg.RKey()
		require.NoError(t, err)
		addr, err := w.Address()
		require.NoError(t, err)
		e, err := w.Connect(addr)
		skipUnsupported(t, err, "Connect")
		require.NoError(t, e.Put(mem.addr(), 4096, uint64(mem.addr())+8192, rkey))
		require.NoError(t, e.Get(mem.addr()+16384, 4096, uint64(mem.addr()), rkey))
		require.NoError(t, flushed(t, e))
		// Active messages through windows: a write, and a fetch.
		into, intoToken, err := w.Open(mem.addr()+8192, 4096, true)
		require.NoError(t, err)
		require.NoError(t, e.Send(intoToken, 0, mem.addr(), 4096))
		require.NoError(t, flushed(t, e))
		require.NoError(t, into.Wait(context.Background()))
		from, fromToken, err := w.Open(mem.addr(), 4096, false)
		require.NoError(t, err)
		back, backToken, err := w.Open(mem.addr()+16384, 4096, true)
		require.NoError(t, err)
		require.NoError(t, e.Fetch(fromToken, 0, 4096, backToken, 0))
		require.NoError(t, back.Wait(context.Background()))
		for _, x := range []*Window{into, from, back} {
			require.NoError(t, x.Close())
		}
		require.NoError(t, e.Close())
		require.NoError(t, reg.Close())
		require.NoError(t, w.Close())
	}
	before, after, same, err := leakcheck.Compare(3, life)
	require.NoError(t, err)
	require.True(t, same, "a worker's life leaked: before %s, after %s", before, after)
	for runtime.NumGoroutine() > goroutines { // ending ones take their time; a leak hangs to -timeout
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), goroutines, "goroutines left running")
}

// TestMemSpan: what a registration covers as UCX made it (ucp_mem_query)
// contains the bytes Register was given and no more than UCX's alignment
// (16 bytes with UCX 1.13) adds on either side: a remote key names that
// span. Package transfer's doc states it.
func TestMemSpan(t *testing.T) {
	mem := newMappedT(t)
	w, err := NewWorker(true)
	skipUnsupported(t, err, "NewWorker")
	defer func() { require.NoError(t, w.Close()) }()
	for _, c := range []struct{ off, n uint64 }{{0, memSize}, {100, 5000}, {4096, 4096}, {4095, 2}} {
		reg, err := w.Register(mem.addr()+uintptr(c.off), c.n)
		require.NoError(t, err)
		a, n, err := reg.Span()
		require.NoError(t, err)
		lo, hi := uint64(mem.addr())+c.off, uint64(mem.addr())+c.off+c.n
		t.Logf("registered [%#x, %#x), UCX covers [%#x, %#x)", lo, hi, a, uint64(a)+n)
		require.LessOrEqual(t, uint64(a), lo)
		require.GreaterOrEqual(t, uint64(a)+n, hi)
		require.Less(t, lo-uint64(a), uint64(16), "rounded down by less than 16 bytes")
		require.Less(t, uint64(a)+n-hi, uint64(16), "rounded up by less than 16 bytes")
		require.NoError(t, reg.Close())
		_, _, err = reg.Span()
		require.ErrorIs(t, err, driver.ErrClosed)
	}
}
