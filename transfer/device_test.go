package transfer_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/transfer/internal/ucx"
	"github.com/vmarena/vmarena/vaspace"
)

// devStandin is the CUDA stand-in machine of the device tests: two
// devices of 256 granules of 64 KiB.
func devStandin() cudatest.Config {
	return cudatest.Config{Devices: 2, Capacity: 256 * gran, MinGranularity: gran, RecommendedGranularity: 2 << 20}
}

// devStaging is the staging of the device tests: 4 KiB, pieces of 2 KiB,
// so that every op of more than 2 KiB moves in several pieces.
func devStaging(d driver.Driver, dev driver.DeviceID) transfer.Staging {
	return transfer.Staging{Driver: d, Device: dev, Size: 4096}
}

// devMem is an arena on one device of a driver whose memory the process
// cannot address, and a stream and pinned buffer through which the test
// itself fills and reads device tensors (never the engine's).
type devMem struct {
	a  *arena.Arena
	s  *stream.Stream
	hb *stream.HostBuffer
}

func newDevMem(d driver.Driver, dev driver.DeviceID, limit uint64) (*devMem, error) {
	chunk := max(gran, d.Devices()[dev].MinGranularity) // 2 MiB on a GPU
	a, err := arena.New(vaspace.New(d), physical.New(d), arena.Options{Device: dev, Max: max(limit, chunk), ChunkSize: chunk})
	if err != nil {
		return nil, err
	}
	m := &devMem{a: a}
	if m.s, err = stream.New(d, dev); err != nil {
		return nil, errors.CombineErrors(err, a.Close())
	}
	if m.hb, err = stream.NewHostBuffer(d, gran); err != nil {
		return nil, errors.CombineErrors(err, errors.CombineErrors(m.s.Destroy(), a.Close()))
	}
	return m, nil
}

func (m *devMem) close() error {
	return errors.CombineErrors(errors.CombineErrors(m.hb.Free(), m.s.Destroy()), m.a.Close())
}

func mustDevMem(t testing.TB, d driver.Driver, dev driver.DeviceID, max uint64) *devMem {
	t.Helper()
	m, err := newDevMem(d, dev, max)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.close()) })
	return m
}

// tensor is a device tensor of n bytes on the arena, filled from seed.
func (m *devMem) tensor(n int, seed uint64) (*tensor.Tensor, error) {
	x, err := tensor.OnArena(m.a, tensor.Uint8, n)
	if err != nil {
		return nil, err
	}
	if err := m.write(x, seeded(n, seed)); err != nil {
		return nil, errors.CombineErrors(err, x.Release())
	}
	return x, nil
}

// write copies b into device tensor x, through the test's pinned buffer.
func (m *devMem) write(x *tensor.Tensor, b []byte) error {
	return x.AccessDevice(true, func(addr driver.Addr, n uint64) error {
		if n != uint64(len(b)) {
			return errors.Newf("%d bytes for a tensor of %d", len(b), n)
		}
		buf := m.hb.Bytes()
		for off := 0; off < len(b); off += len(buf) {
			k := copy(buf, b[off:])
			if err := m.s.CopyHtoDSync(addr+driver.Addr(off), buf[:k]); err != nil {
				return err
			}
		}
		return nil
	})
}

// read copies device tensor x's bytes out.
func (m *devMem) read(x *tensor.Tensor) ([]byte, error) {
	var out []byte
	err := x.AccessDevice(false, func(addr driver.Addr, n uint64) error {
		buf := m.hb.Bytes()
		for off := uint64(0); off < n; off += uint64(len(buf)) {
			k := min(n-off, uint64(len(buf)))
			if err := m.s.CopyDtoHSync(buf[:k], addr+driver.Addr(off)); err != nil {
				return err
			}
			out = append(out, buf[:k]...)
		}
		return nil
	})
	return out, err
}

func mustRead(t testing.TB, m *devMem, x *tensor.Tensor) []byte {
	t.Helper()
	b, err := m.read(x)
	require.NoError(t, err)
	return b
}

// mustDevTensor is m.tensor for a test, released at its end.
func mustDevTensor(t testing.TB, m *devMem, n int, seed uint64) *tensor.Tensor {
	t.Helper()
	x, err := m.tensor(n, seed)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.Release()) })
	return x
}

func mustEngine(t testing.TB, cfg transfer.Config) *transfer.Engine {
	t.Helper()
	e, err := transfer.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

func mustRegister(t testing.TB, e *transfer.Engine, x *tensor.Tensor) (*transfer.Registration, transfer.Descriptor) {
	t.Helper()
	r, err := e.Register(x)
	require.NoError(t, err)
	d, err := r.Descriptor()
	require.NoError(t, err)
	return r, d
}

// TestDevicePutGet: a put from a CUDA tensor on device 0 lands in a CUDA
// tensor on device 1, each engine staging through its own device, and
// gets come back, byte-exact at random offsets and lengths from one byte
// to many pieces; a host tensor's engine (no staging) puts into and gets
// from the same device registration. Each op is checked against a model
// of both sides' bytes, and the bytes around the target (between two
// canaries of its own tensor) never change.
func TestDevicePutGet(t *testing.T) {
	drv, _ := cudatest.Open(t, devStandin(), cuda.Options{})
	const size = 40000 // not a multiple of a piece
	m0, m1 := mustDevMem(t, drv, 0, 64*gran), mustDevMem(t, drv, 1, 64*gran)
	e0 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 0)})
	e1 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 1)})
	x := mustDevTensor(t, m0, size, 1)
	whole := mustDevTensor(t, m1, size+2*canaryPage, 2)
	y, err := whole.Narrow(0, canaryPage, size)
	require.NoError(t, err)
	require.False(t, x.Addressable())
	require.False(t, y.Addressable())
	rx, _ := mustRegister(t, e0, x)
	_, dy := mustRegister(t, e1, y)
	require.True(t, dy.Writable)
	require.Equal(t, uint64(size), dy.Len)
	p := connect(t, e0, e1.Addr())
	defer func() { require.NoError(t, p.Close()) }()

	h := mustHostMem(t, 16<<20)
	host, err := newRegion(h.a, size, 3)
	require.NoError(t, err)
	defer func() { require.NoError(t, host.end()) }()
	eh := mustEngine(t, transfer.Config{})
	rh, _ := mustRegister(t, eh, host.t)
	ph := connect(t, eh, e1.Addr())
	defer func() { require.NoError(t, ph.Close()) }()

	ctx := context.Background()
	mine, hostModel, theirs := seeded(size, 1), seeded(size, 3), seeded(size+2*canaryPage, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 24 {
		n := 1 + rng.Uint64N(size/2)
		if i%6 == 0 {
			n = size
		}
		lo, ro := rng.Uint64N(size-n+1), rng.Uint64N(size-n+1)
		fromHost := i%4 == 3
		src, srcModel, pp := rx, mine, p
		if fromHost {
			src, srcModel, pp = rh, hostModel, ph
		}
		op := transfer.Op{Local: src, LocalOff: lo, Remote: dy, RemoteOff: ro, Len: n}
		if i%2 == 0 {
			require.NoError(t, pp.Put(ctx, op), "op %d", i)
			copy(theirs[canaryPage+ro:canaryPage+ro+n], srcModel[lo:lo+n])
		} else {
			require.NoError(t, pp.Get(ctx, op), "op %d", i)
			copy(srcModel[lo:lo+n], theirs[canaryPage+ro:canaryPage+ro+n])
		}
		require.Equal(t, sha(theirs), sha(mustRead(t, m1, whole)), "the target's bytes (canaries included) after op %d", i)
		require.Equal(t, sha(mine), sha(mustRead(t, m0, x)), "device 0's bytes after op %d", i)
		got, err := host.bytes()
		require.NoError(t, err)
		require.Equal(t, sha(hostModel), sha(got), "the host tensor's bytes after op %d", i)
	}
	s0, s1 := e0.Stats(), e1.Stats()
	require.Equal(t, s0.Puts+eh.Stats().Puts, s1.Puts, "every put issued was served")
	require.Equal(t, s0.Gets+eh.Stats().Gets, s1.Gets)
	require.Equal(t, uint64(24), s1.Puts+s1.Gets)
	require.Zero(t, s0.Refused+s1.Refused)
	for _, e := range []*transfer.Engine{e0, e1, eh} {
		require.NoError(t, e.Check())
	}
}

// TestDeviceHostile: what a peer sends to a device registration is
// checked against it as for host memory: a descriptor forged a byte or a
// page wider, or moved past the registration, is refused (ErrInvalid), a
// write to a read-only device registration forged writable is refused
// (ErrAccessDenied), and a revoked lease makes the registration stale
// (ErrClosed); each refusal changes no byte of the target's tensor or its
// canaries, and the connection stays good.
func TestDeviceHostile(t *testing.T) {
	drv, _ := cudatest.Open(t, devStandin(), cuda.Options{})
	const size = 8192
	m0, m1 := mustDevMem(t, drv, 0, 64*gran), mustDevMem(t, drv, 1, 64*gran)
	e0 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 0)})
	e1 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 1)})
	x := mustDevTensor(t, m0, size+2*canaryPage, 1)
	rx, _ := mustRegister(t, e0, x)
	whole := mustDevTensor(t, m1, size+4*canaryPage, 2)
	y, err := whole.Narrow(0, 2*canaryPage, size)
	require.NoError(t, err)
	_, dy := mustRegister(t, e1, y)

	// A read-only device registration: a lease over a view of device
	// memory whose first bytes are read-only.
	v, err := m1.a.Append(size, 64)
	require.NoError(t, err)
	defer func() { require.NoError(t, v.Release()) }()
	w, err := tensor.NewLeased(tensor.NewLease(), v, tensor.Uint8, size)
	require.NoError(t, err)
	require.NoError(t, m1.write(w, seeded(size, 4)))
	l := tensor.NewLease()
	ro, err := tensor.NewLeasedReadOnly(l, v, 64, tensor.Uint8, size)
	require.NoError(t, err)
	_, dro := mustRegister(t, e1, ro)
	require.False(t, dro.Writable)

	p := connect(t, e0, e1.Addr())
	defer func() { require.NoError(t, p.Close()) }()
	ctx := context.Background()
	want, wantRO := sha(seeded(size+4*canaryPage, 2)), sha(seeded(size, 4))
	unchanged := func(what string) {
		t.Helper()
		require.Equal(t, want, sha(mustRead(t, m1, whole)), "%s: the target and its canaries are unchanged", what)
		require.Equal(t, wantRO, sha(mustRead(t, m1, ro)), "%s: the read-only registration is unchanged", what)
	}
	forge := func(f func(d *transfer.Descriptor)) transfer.Descriptor { d := dy; f(&d); return d }
	for _, c := range []struct {
		name string
		d    transfer.Descriptor
		off  uint64
		n    uint64
	}{
		{"a byte before", forge(func(d *transfer.Descriptor) { d.Addr--; d.Len++ }), 0, size + 1},
		{"a byte wider", forge(func(d *transfer.Descriptor) { d.Len++ }), 0, size + 1},
		{"a page before", forge(func(d *transfer.Descriptor) { d.Addr -= canaryPage; d.Len += canaryPage }), 0, canaryPage},
		{"a page past", forge(func(d *transfer.Descriptor) { d.Addr += size }), 0, canaryPage},
		{"all of the canaries", forge(func(d *transfer.Descriptor) { d.Addr -= 2 * canaryPage; d.Len += 4 * canaryPage }), 0, size + 4*canaryPage},
	} {
		op := transfer.Op{Local: rx, Remote: c.d, RemoteOff: c.off, Len: min(c.n, size+2*canaryPage)}
		drivertest.RequireIs(t, p.Put(ctx, op), driver.ErrInvalid, "outside the registration")
		unchanged(c.name)
	}
	forged := dro
	forged.Writable = true
	drivertest.RequireIs(t, p.Put(ctx, transfer.Op{Local: rx, Remote: forged, Len: size}), driver.ErrAccessDenied, "read-only")
	unchanged("a forged writable")
	drivertest.RequireIs(t, p.Put(ctx, transfer.Op{Local: rx, Remote: dro, Len: size}), driver.ErrAccessDenied, "read-only")

	l.Revoke()
	drivertest.RequireIs(t, p.Get(ctx, transfer.Op{Local: rx, Remote: dro, Len: size}), driver.ErrClosed, "stale")
	require.Equal(t, sha(seeded(size+2*canaryPage, 1)), sha(mustRead(t, m0, x)), "a refused get wrote nothing locally")
	require.Equal(t, uint64(7), e1.Stats().Refused, "the target counted each refusal")

	// The connection is good: a put in range lands.
	require.NoError(t, p.Put(ctx, transfer.Op{Local: rx, LocalOff: canaryPage, Remote: dy, Len: size}))
	expect := seeded(size+4*canaryPage, 2)
	copy(expect[2*canaryPage:2*canaryPage+size], seeded(size+2*canaryPage, 1)[canaryPage:canaryPage+size])
	require.Equal(t, sha(expect), sha(mustRead(t, m1, whole)))
}

// TestDeviceRefusals: a device tensor needs a tcp engine with staging:
// an engine without one refuses it (ErrUnsupported), as the ucx kind
// does, with or without staging; a staging buffer too small to halve is
// ErrInvalid. A refused New leaves no pinned memory or stream behind.
func TestDeviceRefusals(t *testing.T) {
	drv, lib := cudatest.Open(t, devStandin(), cuda.Options{})
	m := mustDevMem(t, drv, 0, 16*gran)
	x := mustDevTensor(t, m, 4096, 1)
	hostAllocs, streams := lib.Live("hostallocs"), lib.Live("streams")

	e := mustEngine(t, transfer.Config{})
	_, err := e.Register(x)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "no staging buffer")
	require.NoError(t, e.Check())

	_, err = transfer.New(transfer.Config{Kind: "ucx", Staging: devStaging(drv, 0)})
	drivertest.RequireIs(t, err, driver.ErrUnsupported)
	_, err = transfer.New(transfer.Config{Staging: transfer.Staging{Driver: drv, Size: 64}})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "at least 128 bytes")
	_, err = transfer.New(transfer.Config{Staging: transfer.Staging{Driver: drv, Device: 7}})
	require.Error(t, err, "a device the driver does not have")
	require.Equal(t, hostAllocs, lib.Live("hostallocs"), "the refused engines gave their pinned memory back")
	require.Equal(t, streams, lib.Live("streams"))

	if ucx.Available {
		u := mustEngine(t, transfer.Config{Kind: "ucx"})
		_, err := u.Register(x)
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "ucx kind registers host memory only")
		require.NoError(t, u.Check())
	}
}

// TestDeviceNoLeaks: engines that staged device bytes both ways and
// closed (one with its registration and a peer left open for Close)
// leave no descriptor, mapping or goroutine behind, and give their
// pinned staging buffers and streams back to the driver; the device's
// memory in use is what the test's own tensors hold.
func TestDeviceNoLeaks(t *testing.T) {
	drv, lib := cudatest.Open(t, devStandin(), cuda.Options{})
	m0, m1 := mustDevMem(t, drv, 0, 16*gran), mustDevMem(t, drv, 1, 16*gran)
	x, y := mustDevTensor(t, m0, 20000, 1), mustDevTensor(t, m1, 20000, 2)
	hostAllocs, streams := lib.Live("hostallocs"), lib.Live("streams")
	used0, used1 := drv.Used(0), drv.Used(1)
	goroutines := runtime.NumGoroutine()
	work := func() {
		e0, err := transfer.New(transfer.Config{Staging: devStaging(drv, 0)})
		require.NoError(t, err)
		e1, err := transfer.New(transfer.Config{Staging: devStaging(drv, 1)})
		require.NoError(t, err)
		rx, err := e0.Register(x)
		require.NoError(t, err)
		_, dy := mustRegister(t, e1, y)
		p, err := e0.Connect(context.Background(), e1.Addr())
		require.NoError(t, err)
		op := transfer.Op{Local: rx, Remote: dy, RemoteOff: 100, Len: 12345}
		require.NoError(t, p.Put(context.Background(), op))
		require.NoError(t, p.Get(context.Background(), op))
		require.Equal(t, hostAllocs+2, lib.Live("hostallocs"), "one pinned buffer per engine")
		require.NoError(t, e0.Close()) // the peer and registration left for Close
		require.NoError(t, e1.Close())
		require.Equal(t, hostAllocs, lib.Live("hostallocs"), "the staging buffers went back")
		require.Equal(t, streams, lib.Live("streams"), "the staging streams went back")
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %s, after %s", before, after)
	require.Equal(t, used0, drv.Used(0))
	require.Equal(t, used1, drv.Used(1))
	require.NoError(t, drv.Check())
	for runtime.NumGoroutine() > goroutines {
		time.Sleep(time.Millisecond) // -timeout bounds it: a goroutine that never ends is a hang
	}
}

// TestDeviceConcurrentPuts: peers of one engine put and get at once,
// each between its own device tensors, all through the engine's one
// staging buffer (and the target's); every byte lands where its op says.
// Run it with -race.
func TestDeviceConcurrentPuts(t *testing.T) {
	drv, _ := cudatest.Open(t, devStandin(), cuda.Options{})
	const peers, size, rounds = 4, 10000, 8
	m0, m1 := mustDevMem(t, drv, 0, 32*gran), mustDevMem(t, drv, 1, 32*gran)
	e0 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 0)})
	e1 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 1)})
	xs, ys := make([]*tensor.Tensor, peers), make([]*tensor.Tensor, peers)
	var wg sync.WaitGroup
	errs := make([]error, peers)
	for i := range peers {
		xs[i], ys[i] = mustDevTensor(t, m0, size, uint64(10+i)), mustDevTensor(t, m1, size, uint64(20+i))
		rx, _ := mustRegister(t, e0, xs[i])
		_, dy := mustRegister(t, e1, ys[i])
		p := connect(t, e0, e1.Addr())
		defer func() { require.NoError(t, p.Close()) }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				op := transfer.Op{Local: rx, LocalOff: uint64(r), Remote: dy, RemoteOff: uint64(2 * r), Len: size - 2*rounds}
				if err := p.Put(context.Background(), op); err != nil {
					errs[i] = err
					return
				}
				if err := p.Get(context.Background(), transfer.Op{Local: rx, LocalOff: size - 100, Remote: dy, Len: 100}); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := range peers {
		require.NoError(t, errs[i], "peer %d", i)
		mine, theirs := seeded(size, uint64(10+i)), seeded(size, uint64(20+i))
		for r := range rounds {
			n := size - 2*rounds
			copy(theirs[2*r:2*r+n], mine[r:r+n])
			copy(mine[size-100:], theirs[:100])
		}
		require.Equal(t, sha(theirs), sha(mustRead(t, m1, ys[i])), "peer %d's target", i)
		require.Equal(t, sha(mine), sha(mustRead(t, m0, xs[i])), "peer %d's source", i)
	}
	require.Equal(t, uint64(peers*rounds), e1.Stats().Puts)
	require.Equal(t, uint64(peers*rounds), e1.Stats().Gets)
}

// The device peer process: the test binary re-executed with devPeerEnv
// set to the stand-in file its parent built. It opens the CUDA driver
// over its own instance of the stand-in (another process's GPU), makes a
// tcp engine staging through device 1, prints "addr ADDR", then obeys a
// command a line:
//
//	dev NAME SIZE SEED   a device tensor on device 1, filled from SEED, registered: ok HEX(descriptor)
//	hash NAME            ok SHA256HEX of NAME's bytes (copied off the device)
//	stats                ok PUTS GETS BYTESOUT BYTESIN REFUSED
//	quit                 close everything; exit 1 if the stand-in still holds anything
const devPeerEnv = "VMARENA_TRANSFER_DEVPEER"

func runDevicePeer(path string, in io.Reader, out io.Writer) (err error) {
	drv, lib, err := cudatest.OpenFile(path, devStandin(), cuda.Options{})
	if err != nil {
		return err
	}
	m, err := newDevMem(drv, 1, 64*gran)
	if err != nil {
		return errors.CombineErrors(err, drv.Close())
	}
	e, err := transfer.New(transfer.Config{Staging: devStaging(drv, 1)})
	if err != nil {
		return errors.CombineErrors(err, errors.CombineErrors(m.close(), drv.Close()))
	}
	xs := map[string]*tensor.Tensor{}
	defer func() {
		err = errors.CombineErrors(err, e.Close())
		for _, x := range xs {
			err = errors.CombineErrors(err, x.Release())
		}
		err = errors.CombineErrors(err, errors.CombineErrors(m.close(), drv.Close()))
		if leaks := lib.Leaks(); err == nil && len(leaks) > 0 {
			err = errors.Newf("the stand-in still holds %s", strings.Join(leaks, ", "))
		}
	}()
	fmt.Fprintf(out, "addr %s\n", e.Addr())
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 0 || f[0] == "quit" {
			return nil
		}
		reply, err := devPeerDo(e, m, xs, f)
		if err != nil {
			fmt.Fprintf(out, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(out, "ok %s\n", reply)
		}
	}
	return lines.Err()
}

func devPeerDo(e *transfer.Engine, m *devMem, xs map[string]*tensor.Tensor, f []string) (string, error) {
	switch {
	case f[0] == "dev" && len(f) == 4:
		n, err1 := strconv.Atoi(f[2])
		seed, err2 := strconv.ParseUint(f[3], 10, 64)
		if err := errors.CombineErrors(err1, err2); err != nil {
			return "", err
		}
		x, err := m.tensor(n, seed)
		if err != nil {
			return "", err
		}
		xs[f[1]] = x
		r, err := e.Register(x)
		if err != nil {
			return "", err
		}
		d, err := r.Descriptor()
		if err != nil {
			return "", err
		}
		b, err := d.MarshalBinary()
		return hex.EncodeToString(b), err
	case f[0] == "hash" && len(f) == 2 && xs[f[1]] != nil:
		b, err := m.read(xs[f[1]])
		return sha(b), err
	case f[0] == "stats":
		s := e.Stats()
		return fmt.Sprintf("%d %d %d %d %d", s.Puts, s.Gets, s.BytesOut, s.BytesIn, s.Refused), nil
	}
	return "", errors.Newf("unknown command %q", f)
}

// TestDeviceTwoProcesses: the prefill side, this process, holds KV bytes
// in a tensor on its CUDA stand-in's device 0; the decode side, a peer
// process, in a tensor on its own stand-in's device 1 (another process's
// GPU: the stand-in instances share nothing). A put over the tcp kind
// lands them byte-exact on the other side, a get brings them back into
// a second device tensor here, both engines staging through one pinned
// buffer each; the peer exits with its stand-in holding nothing.
func TestDeviceTwoProcesses(t *testing.T) {
	drv, lib := cudatest.Open(t, devStandin(), cuda.Options{})
	const size = 3*64<<10 + 777 // three granules and a bit
	peer := startProc(t, nil, []string{devPeerEnv + "=" + lib.Path()})
	m := mustDevMem(t, drv, 0, 64*gran)
	e := mustEngine(t, transfer.Config{Staging: devStaging(drv, 0)})
	kv, back := mustDevTensor(t, m, size, 1), mustDevTensor(t, m, size, 2)
	rkv, _ := mustRegister(t, e, kv)
	rback, _ := mustRegister(t, e, back)
	remote := peer.desc(peer.do("dev KV %d 9", size))
	require.Equal(t, uint64(size), remote.Len)
	p := connect(t, e, peer.addr)
	defer func() { require.NoError(t, p.Close()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	require.NoError(t, p.Put(ctx, transfer.Op{Local: rkv, Remote: remote, Len: size}))
	require.Equal(t, sha(seeded(size, 1)), peer.hash("KV"), "the decode side's device holds the prefill side's KV bytes")
	require.NoError(t, p.Get(ctx, transfer.Op{Local: rback, Remote: remote, Len: size}))
	require.Equal(t, sha(seeded(size, 1)), sha(mustRead(t, m, back)), "and they come back")
	require.NoError(t, p.Put(ctx, transfer.Op{Local: rback, LocalOff: 5, Remote: remote, RemoteOff: 1000, Len: 5000}))
	want := seeded(size, 1)
	copy(want[1000:6000], seeded(size, 1)[5:5005])
	require.Equal(t, sha(want), peer.hash("KV"))
	require.Equal(t, fmt.Sprintf("2 1 %d %d 0", size, size+5000), peer.do("stats"))
}

// TestDeviceCopyFaults: a staging copy the driver refuses in the middle
// of an op fails the op with the driver's error, never a wrong byte
// outside the op's range, and leaves the engines as they were: a target
// whose host→device copy fails mid-put reads away the rest of the
// payload and answers the error (the connection stays good); one whose
// device→host copy fails mid-get, after its first bytes went, drops the
// connection (the initiator's peer is closed, ErrClosed); an initiator
// whose device→host copy fails mid-put drops its connection. After each,
// a new op through the same registrations lands byte-exact.
func TestDeviceCopyFaults(t *testing.T) {
	drv, lib := cudatest.Open(t, devStandin(), cuda.Options{})
	const size = 20000 // 10 pieces of 2 KiB
	m0, m1 := mustDevMem(t, drv, 0, 64*gran), mustDevMem(t, drv, 1, 64*gran)
	e0 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 0)})
	e1 := mustEngine(t, transfer.Config{Staging: devStaging(drv, 1)})
	x, y := mustDevTensor(t, m0, size, 1), mustDevTensor(t, m1, size, 2)
	rx, _ := mustRegister(t, e0, x)
	_, dy := mustRegister(t, e1, y)
	h := mustHostMem(t, 16<<20)
	host, err := newRegion(h.a, size, 3)
	require.NoError(t, err)
	defer func() { require.NoError(t, host.end()) }()
	eh := mustEngine(t, transfer.Config{})
	rh, dh := mustRegister(t, eh, host.t)
	ctx := context.Background()
	op := transfer.Op{Local: rh, Remote: dy, Len: size}

	// The target's host→device copy fails at the third piece of a put
	// from the host engine: only e1 copies.
	ph := connect(t, eh, e1.Addr())
	defer func() { require.NoError(t, ph.Close()) }()
	lib.Fail("cuMemcpyHtoDAsync_v2", 3, 1, 1)
	drivertest.RequireIs(t, ph.Put(ctx, op), driver.ErrInvalid, "staging: copy", "CUDA_ERROR_INVALID_VALUE")
	lib.Fail("cuMemcpyHtoDAsync_v2", 0, 0, 0)
	theirs := seeded(size, 2)
	copy(theirs[:4096], seeded(size, 3)[:4096]) // the two pieces before the failed one landed
	require.Equal(t, sha(theirs), sha(mustRead(t, m1, y)), "the pieces before the failure, and nothing after")
	require.NoError(t, ph.Put(ctx, op), "the connection is still good")
	require.Equal(t, sha(seeded(size, 3)), sha(mustRead(t, m1, y)))

	// The target's device→host copy fails at the second piece of a get:
	// its first bytes went, so it drops the connection.
	lib.Fail("cuMemcpyDtoHAsync_v2", 2, 1, 1)
	drivertest.RequireIs(t, ph.Get(ctx, transfer.Op{Local: rh, Remote: dy, Len: size}), driver.ErrClosed, "connection")
	lib.Fail("cuMemcpyDtoHAsync_v2", 0, 0, 0)
	ph2 := connect(t, eh, e1.Addr())
	defer func() { require.NoError(t, ph2.Close()) }()
	require.NoError(t, ph2.Get(ctx, transfer.Op{Local: rh, Remote: dy, Len: size}))

	// The initiator's device→host copy fails at the fourth piece of a
	// put to the host engine: only e0 copies.
	p0 := connect(t, e0, eh.Addr())
	defer func() { require.NoError(t, p0.Close()) }()
	lib.Fail("cuMemcpyDtoHAsync_v2", 4, 1, 1)
	drivertest.RequireIs(t, p0.Put(ctx, transfer.Op{Local: rx, Remote: dh, Len: size}), driver.ErrClosed, "connection")
	lib.Fail("cuMemcpyDtoHAsync_v2", 0, 0, 0)
	p1 := connect(t, e0, eh.Addr())
	defer func() { require.NoError(t, p1.Close()) }()
	require.NoError(t, p1.Put(ctx, transfer.Op{Local: rx, Remote: dh, Len: size}))
	got, err := host.bytes()
	require.NoError(t, err)
	require.Equal(t, sha(seeded(size, 1)), sha(got))
	for _, e := range []*transfer.Engine{e0, e1, eh} {
		require.NoError(t, e.Check())
	}
}
