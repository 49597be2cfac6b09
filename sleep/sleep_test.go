package sleep

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
)

// The test machine: one host device of 64 MiB; tags commit in 64 KiB
// chunks and may hold 16 MiB each.
const (
	kib      = uint64(1) << 10
	mib      = uint64(1) << 20
	testCap  = 64 * mib
	testCS   = 64 * kib
	testTMax = 16 * mib
)

func openHost(t testing.TB, capacity uint64) *host.Driver {
	t.Helper()
	d, err := host.New(host.Options{Devices: 1, Capacity: capacity, Granularity: 4 * kib})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	return d
}

func newManager(t testing.TB, d driver.Driver) *Manager {
	t.Helper()
	m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: t.TempDir()})
	require.NoError(t, err)
	return m
}

// closeAll frees what is live and closes m.
func closeAll(t testing.TB, m *Manager) {
	t.Helper()
	require.NoError(t, m.Check())
	m.mu.Lock()
	var ps []driver.Addr
	for p := range m.owner {
		ps = append(ps, p)
	}
	m.mu.Unlock()
	for _, p := range ps {
		require.NoError(t, m.Free(p))
	}
	require.NoError(t, m.Close())
}

// pattern is n bytes that differ with seed and n.
func pattern(seed uint64, n uint64) []byte {
	r := rand.New(rand.NewPCG(seed, n))
	b := make([]byte, (n+7)&^7)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

func stats(t testing.TB, m *Manager, tag string) TagStats {
	t.Helper()
	for _, s := range m.Stats() {
		if s.Tag == tag {
			return s
		}
	}
	t.Fatalf("no tag %q", tag)
	return TagStats{}
}

func read(t testing.TB, d driver.Driver, p driver.Addr, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.Read(p, b))
	return b
}

// TestSleepWake: in each mode, a tag sleeps (its memory goes back to the
// device, its neighbour tag untouched), refuses allocations and touches,
// and wakes at the same addresses with the same access and, but for
// Discard, the same bytes; Sleep and Wake are idempotent.
func TestSleepWake(t *testing.T) {
	for _, mode := range []Mode{Host, File, Discard} {
		t.Run(mode.String(), func(t *testing.T) {
			d := openHost(t, testCap)
			m := newManager(t, d)
			sizes := []uint64{100, 4 * kib, 40 * kib, 200 * kib, 3 * mib}
			var ps []driver.Addr
			for i, n := range sizes {
				p, err := m.Alloc("weights", n)
				require.NoError(t, err)
				require.NoError(t, d.Write(p, pattern(uint64(i), n)))
				ps = append(ps, p)
			}
			kv, err := m.Alloc("kv", 1*mib)
			require.NoError(t, err)
			require.NoError(t, d.Write(kv, pattern(99, mib)))
			usedKV := stats(t, m, "kv").AwakeBytes
			before := stats(t, m, "weights")
			require.Equal(t, before.AwakeBytes+usedKV, d.Used(0))

			require.NoError(t, m.Sleep(mode, "weights"))
			require.NoError(t, m.Sleep(mode, "weights"), "a second sleep is a no-op")
			s := stats(t, m, "weights")
			require.True(t, s.Asleep)
			require.Equal(t, mode, s.Mode)
			require.Zero(t, s.AwakeBytes)
			require.Equal(t, before.AwakeBytes, s.AsleepBytes)
			if mode == Discard {
				require.Zero(t, s.BackupBytes)
			} else {
				require.Equal(t, uint64(100+4*kib+40*kib+200*kib+3*mib), s.BackupBytes)
			}
			require.Equal(t, usedKV, d.Used(0), "the sleeping tag's memory is all given back")
			_, err = m.Alloc("weights", 10)
			require.ErrorIs(t, err, driver.ErrBusy)
			require.Contains(t, err.Error(), `"weights"`)
			require.Error(t, d.Read(ps[0], make([]byte, 1)), "the sleeping tag's addresses are not mapped")
			require.Equal(t, pattern(99, mib), read(t, d, kv, mib), "the other tag is untouched")
			require.NoError(t, m.Check())

			require.NoError(t, m.Wake("weights"))
			require.NoError(t, m.Wake(), "a second wake is a no-op")
			s = stats(t, m, "weights")
			require.False(t, s.Asleep)
			require.Equal(t, before.AwakeBytes, s.AwakeBytes)
			require.Zero(t, s.AsleepBytes)
			require.Zero(t, s.BackupBytes)
			require.Equal(t, 1, s.Cycles)
			for i, n := range sizes {
				got, err := m.Size(ps[i])
				require.NoError(t, err)
				require.Equal(t, n, got)
				acc, err := d.Access(ps[i], 0)
				require.NoError(t, err)
				require.Equal(t, driver.AccessReadWrite, acc)
				if mode != Discard {
					require.True(t, bytes.Equal(pattern(uint64(i), n), read(t, d, ps[i], n)), "allocation %d restored", i)
				}
			}
			closeAll(t, m)
			require.Zero(t, d.Used(0))
		})
	}
}

// TestBadInput: every refusal names what is wrong, wraps its sentinel
// and changes nothing.
func TestBadInput(t *testing.T) {
	d := openHost(t, testCap)
	_, err := New(nil, Options{})
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = New(d, Options{Device: 3})
	require.ErrorIs(t, err, driver.ErrNoDevice)
	_, err = New(d, Options{ChunkSize: testCS, TagMax: testCS + 1})
	require.ErrorIs(t, err, driver.ErrMisaligned)
	m := newManager(t, d)
	_, err = m.Alloc("a", 0)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = m.Alloc("a", testTMax+1)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	p, err := m.Alloc("a", 10)
	require.NoError(t, err)
	require.ErrorIs(t, m.Sleep(Mode(7)), driver.ErrInvalid)
	require.ErrorIs(t, m.Sleep(Host, "nope"), driver.ErrInvalid)
	require.ErrorIs(t, m.Wake("nope"), driver.ErrInvalid)
	require.ErrorIs(t, m.Free(p+1), driver.ErrNotAllocated)
	_, err = m.Size(p + 1)
	require.ErrorIs(t, err, driver.ErrNotAllocated)
	require.ErrorIs(t, m.AddStream(0), driver.ErrInvalid)
	require.ErrorIs(t, m.RemoveStream(5), driver.ErrInvalid)
	require.ErrorIs(t, m.Close(), driver.ErrBusy)
	require.False(t, stats(t, m, "a").Asleep)
	require.NoError(t, m.Free(p))
	require.ErrorIs(t, m.Free(p), driver.ErrNotAllocated, "freed twice")
	require.NoError(t, m.Close())
	_, err = m.Alloc("a", 1)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, m.Close(), driver.ErrClosed)
}

// TestSimDiscardOnly: the sim driver has no bytes: it sleeps in Discard
// mode, and Host mode is refused, the tag left awake.
func TestSimDiscardOnly(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 1 << 30})
	require.NoError(t, err)
	defer d.Close()
	m, err := New(d, Options{TagMax: 64 * mib})
	require.NoError(t, err)
	p, err := m.Alloc("w", 5*mib)
	require.NoError(t, err)
	used := d.Used(0)
	require.ErrorIs(t, m.Sleep(Host, "w"), driver.ErrUnsupported)
	require.False(t, stats(t, m, "w").Asleep)
	require.Equal(t, used, d.Used(0))
	require.NoError(t, m.Sleep(Discard))
	require.Zero(t, d.Used(0))
	require.NoError(t, m.Wake())
	require.Equal(t, used, d.Used(0))
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Close())
}

// TestSleepWaitsForStreams (the unmap that races in-flight kernels,
// CUDA_ERROR_ILLEGAL_ADDRESS): work still queued on a stream AddStream
// named — here a copy held back behind a slow host function — lands
// before Sleep takes its backup, so the woken tag holds its bytes.
func TestSleepWaitsForStreams(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	p, err := m.Alloc("w", 64*kib)
	require.NoError(t, err)
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	require.NoError(t, m.AddStream(s))
	buf, err := d.HostAlloc(64 * kib)
	require.NoError(t, err)
	copy(buf, pattern(7, 64*kib))
	require.NoError(t, d.LaunchHostFunc(s, "slow kernel", func() error { time.Sleep(30 * time.Millisecond); return nil }))
	require.NoError(t, d.CopyHtoD(p, buf, s))
	require.NoError(t, m.Sleep(Host))
	require.NoError(t, m.Wake())
	require.Equal(t, pattern(7, 64*kib), read(t, d, p, 64*kib))
	require.NoError(t, d.HostFree(buf))
	require.NoError(t, m.RemoveStream(s))
	closeAll(t, m)
}

// TestNilAndZero: a nil or zero Manager answers errors, never panics.
func TestNilAndZero(t *testing.T) {
	for _, m := range []*Manager{nil, {}} {
		_, err := m.Alloc("", 1)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorIs(t, m.Free(1), driver.ErrInvalid)
		require.ErrorIs(t, m.Sleep(Host), driver.ErrInvalid)
		require.ErrorIs(t, m.Wake(), driver.ErrInvalid)
		require.ErrorIs(t, m.Check(), driver.ErrInvalid)
		require.ErrorIs(t, m.Close(), driver.ErrInvalid)
		require.Nil(t, m.Stats())
	}
	require.Equal(t, "mode(9)", Mode(9).String())
	require.True(t, errors.Is(unmade("x"), driver.ErrInvalid))
}

// syncing is the host driver as a DeviceSyncer that counts its calls
// and, when err is set, fails them.
type syncing struct {
	*host.Driver
	calls int
	err   error
}

func (s *syncing) SyncDevice(dev driver.DeviceID) error {
	s.calls++
	return s.err
}

// TestSleepSyncsDevice: Sleep waits for the whole device first when the
// driver can (work on streams the library never saw, PyTorch's), and a
// failure to wait leaves every tag awake, unchanged.
func TestSleepSyncsDevice(t *testing.T) {
	d := &syncing{Driver: openHost(t, testCap), err: errors.Wrap(driver.ErrDeviceFault, "injected")}
	m := newManager(t, d)
	_, err := m.Alloc("w", 10)
	require.NoError(t, err)
	require.ErrorIs(t, m.Sleep(Host), driver.ErrDeviceFault)
	require.False(t, stats(t, m, "w").Asleep)
	require.NotZero(t, d.Used(0))
	d.err = nil
	require.NoError(t, m.Sleep(Host))
	require.Equal(t, 2, d.calls)
	require.True(t, stats(t, m, "w").Asleep)
	require.NoError(t, m.Wake())
	closeAll(t, m)
}

// TestConcurrent: allocations and frees in one tag from several
// goroutines while another tag sleeps and wakes; the race detector
// watches, a watchdog keeps it from hanging.
func TestConcurrent(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	w, err := m.Alloc("weights", 100*kib)
	require.NoError(t, err)
	require.NoError(t, d.Write(w, pattern(1, 100*kib)))
	done := make(chan error, 3)
	for g := range 3 {
		go func() {
			var err error
			for i := range 100 {
				var p driver.Addr
				if p, err = m.Alloc("kv", uint64(g*100+i+1)*64); err != nil {
					break
				}
				if err = m.Free(p); err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 30 {
		require.NoError(t, m.Sleep(Host, "weights"))
		require.NoError(t, m.Wake("weights"))
	}
	for range 3 {
		require.NoError(t, <-done)
	}
	require.Equal(t, pattern(1, 100*kib), read(t, d, w, 100*kib))
	closeAll(t, m)
}
