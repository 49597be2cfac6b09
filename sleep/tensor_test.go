package sleep

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/tensor"
)

// heldAccess runs an Access (write) of tt in a goroutine whose fn, once
// entered, waits for release, then writes patch at the start of the
// bytes and records that it returned. entered is closed once fn runs;
// done yields Access's error.
type heldAccess struct {
	entered, release chan struct{}
	returned         atomic.Bool
	done             chan error
}

func holdAccess(t *testing.T, tt *tensor.Tensor, patch []byte) *heldAccess {
	t.Helper()
	h := &heldAccess{entered: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		h.done <- tt.Access(true, func(b []byte) error {
			close(h.entered)
			<-h.release
			copy(b, patch)
			h.returned.Store(true)
			return nil
		})
	}()
	<-h.entered
	return h
}

// waitRevoked waits until tt's lease is revoked (the revoke has begun and
// waits for the accesses in flight).
func waitRevoked(t *testing.T, tt *tensor.Tensor) {
	t.Helper()
	for !tt.Released() { // one never revoked is go test -timeout's
		runtime.Gosched()
	}
}

func mustTensor(t *testing.T, m *Manager, p driver.Addr) *tensor.Tensor {
	t.Helper()
	tt, err := m.Tensor(p)
	require.NoError(t, err)
	return tt
}

func tensorBytes(t *testing.T, tt *tensor.Tensor) []byte {
	t.Helper()
	var out []byte
	require.NoError(t, tt.Access(false, func(b []byte) error {
		out = bytes.Clone(b)
		return nil
	}))
	return out
}

// TestSleepWaitsForTensorAccess: a Sleep of the tag waits for an access
// in flight through a tensor over one of its allocations (a transfer
// writing into it, say) before it backs up anything: the sleep's work
// starts (the hook) only after fn returned, fn's write is in the backup
// and comes back at wake, and the old tensor, and a view of it, answer
// ErrClosed. A new tensor after Wake holds the restored bytes. Calls on
// other tags go on while the Sleep waits.
func TestSleepWaitsForTensorAccess(t *testing.T) {
	for _, mode := range []Mode{Host, File} {
		t.Run(mode.String(), func(t *testing.T) {
			d := openHost(t, testCap)
			m := newManager(t, d)
			defer closeAll(t, m)
			const n = 100 * kib
			p, err := m.Alloc("weights", n)
			require.NoError(t, err)
			want := pattern(1, n)
			require.NoError(t, d.Write(p, want))
			tt := mustTensor(t, m, p)
			require.True(t, tt.Mapped())
			require.Equal(t, p, tt.Addr())
			require.Equal(t, []int{int(n)}, tt.Shape())
			require.Equal(t, tensor.Uint8, tt.DType())
			view, err := tt.Narrow(0, 10, 20)
			require.NoError(t, err)
			require.Equal(t, want, tensorBytes(t, tt))

			patch := pattern(2, 4*kib)
			h := holdAccess(t, tt, patch)
			var sawReturned atomic.Bool
			m.hook = func(op, name string) {
				if op == "sleep" && name == "weights" {
					sawReturned.Store(h.returned.Load())
				}
			}
			slept := make(chan error, 1)
			go func() { slept <- m.Sleep(mode, "weights") }()
			waitRevoked(t, tt)
			// The Sleep is waiting for fn, without the Manager's lock.
			kv, err := m.Alloc("kv", 4*kib)
			require.NoError(t, err)
			require.NoError(t, m.Free(kv))
			close(h.release)
			require.NoError(t, within(t, "the access", h.done))
			require.NoError(t, within(t, "Sleep", slept))
			require.True(t, sawReturned.Load(), "the sleep began its work before the access returned")
			m.hook = nil

			for _, old := range []*tensor.Tensor{tt, view} {
				require.ErrorIs(t, old.Access(false, func([]byte) error { return nil }), driver.ErrClosed)
				_, err := old.At(0)
				require.ErrorIs(t, err, driver.ErrClosed)
			}
			require.NoError(t, m.Wake("weights"))
			copy(want, patch)
			require.Equal(t, want, read(t, d, p, n), "the access's write was backed up")
			require.ErrorIs(t, tt.Access(false, func([]byte) error { return nil }), driver.ErrClosed, "stays closed after wake")
			nt := mustTensor(t, m, p)
			require.Equal(t, want, tensorBytes(t, nt), "the new tensor holds the restored bytes")
			require.NoError(t, nt.Set(7, 3))
			require.Equal(t, []byte{7}, read(t, d, p+3, 1))
			require.NoError(t, m.Check())
		})
	}
}

// TestFreeWaitsForTensorAccess: Free of an allocation waits for an access
// in flight through its tensor, without the Manager's lock (other tags
// go on; a Tensor of the same allocation waits and then finds it gone),
// then frees it; the tensor answers ErrClosed.
func TestFreeWaitsForTensorAccess(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	defer closeAll(t, m)
	p, err := m.Alloc("a", 8*kib)
	require.NoError(t, err)
	tt := mustTensor(t, m, p)
	h := holdAccess(t, tt, []byte{1})
	freed := make(chan error, 1)
	go func() { freed <- m.Free(p) }()
	waitRevoked(t, tt)
	q, err := m.Alloc("b", 4*kib)
	require.NoError(t, err)
	require.NoError(t, m.Free(q))
	_, err = m.Size(p)
	require.NoError(t, err, "live until the access ends")
	again := make(chan error, 1)
	go func() {
		_, err := m.Tensor(p)
		again <- err
	}()
	require.False(t, h.returned.Load())
	close(h.release)
	require.NoError(t, within(t, "the access", h.done))
	require.NoError(t, within(t, "Free", freed))
	require.ErrorIs(t, within(t, "Tensor", again), driver.ErrNotAllocated)
	require.ErrorIs(t, tt.Access(true, func([]byte) error { return nil }), driver.ErrClosed)
	require.ErrorIs(t, tt.Set(1, 0), driver.ErrClosed)
	require.NoError(t, m.Check())
}

// TestTensorLeases: tensors over one allocation in one waking share a
// lease; a Sleep of one tag closes its tensors only; Free closes the
// freed allocation's only; a Close refused while allocations live leaves
// their tensors working; a tensor's Release is refused (the Manager owns
// the memory).
func TestTensorLeases(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	w1, err := m.Alloc("w", 3*kib)
	require.NoError(t, err)
	w2, err := m.Alloc("w", 5*kib)
	require.NoError(t, err)
	kv, err := m.Alloc("kv", 7*kib)
	require.NoError(t, err)
	a, b := mustTensor(t, m, w1), mustTensor(t, m, w1)
	c, k := mustTensor(t, m, w2), mustTensor(t, m, kv)
	require.Error(t, a.Release())
	require.NoError(t, a.Set(9, 0))
	v, err := b.At(0)
	require.NoError(t, err)
	require.Equal(t, 9.0, v, "the same memory")

	require.NoError(t, m.Free(w2))
	require.True(t, c.Released())
	require.False(t, a.Released() || b.Released() || k.Released())

	require.NoError(t, m.Sleep(Discard, "w"))
	require.True(t, a.Released() && b.Released())
	require.False(t, k.Released(), "another tag's tensor")
	require.NoError(t, k.Set(1, 0))
	require.NoError(t, m.Wake())

	require.ErrorIs(t, m.Close(), driver.ErrBusy)
	require.NoError(t, k.Set(2, 0), "a refused Close leaves the tensors as they were")
	require.NoError(t, m.Check())
	require.NoError(t, m.Free(kv))
	require.True(t, k.Released())
	require.NoError(t, m.Free(w1))
	require.NoError(t, m.Close())
	require.Zero(t, d.Used(0))
}

// TestTensorRefused: Tensor in a sleeping tag is ErrBusy naming it, over
// an address that is no live allocation ErrNotAllocated, on a closed
// Manager ErrClosed, on a nil or zero one ErrInvalid; each changes
// nothing (Check, the figures, no lease listed).
func TestTensorRefused(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	p, err := m.Alloc("weights", 64*kib)
	require.NoError(t, err)
	require.NoError(t, d.Write(p, pattern(3, 64*kib)))
	require.NoError(t, m.Sleep(Host, "weights"))
	before := m.Stats()
	_, err = m.Tensor(p)
	require.ErrorIs(t, err, driver.ErrBusy)
	require.ErrorContains(t, err, `"weights"`)
	_, err = m.Tensor(p + 1)
	require.ErrorIs(t, err, driver.ErrNotAllocated)
	_, err = m.Tensor(0)
	require.ErrorIs(t, err, driver.ErrNotAllocated)
	require.Equal(t, before, m.Stats())
	require.NoError(t, m.Check())
	require.Empty(t, m.tags["weights"].leases)
	require.NoError(t, m.Wake())
	require.Equal(t, pattern(3, 64*kib), tensorBytes(t, mustTensor(t, m, p)))
	require.NoError(t, m.Free(p))
	_, err = m.Tensor(p)
	require.ErrorIs(t, err, driver.ErrNotAllocated, "freed")
	require.Empty(t, m.tags["weights"].leases)
	require.NoError(t, m.Close())
	_, err = m.Tensor(p)
	require.ErrorIs(t, err, driver.ErrClosed)

	var nilM *Manager
	_, err = nilM.Tensor(p)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = (&Manager{}).Tensor(p)
	require.ErrorIs(t, err, driver.ErrInvalid)
}

// TestTensorSim: the sim driver's memory is not addressable from the
// process: Tensor is ErrUnsupported, as tensor.OnArena is there, and
// changes nothing.
func TestTensorSim(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 1 << 30})
	require.NoError(t, err)
	defer d.Close()
	m, err := New(d, Options{TagMax: 64 * mib})
	require.NoError(t, err)
	p, err := m.Alloc("w", mib)
	require.NoError(t, err)
	_, err = m.Tensor(p)
	require.ErrorIs(t, err, driver.ErrUnsupported)
	require.Empty(t, m.tags["w"].leases)
	require.NoError(t, m.Check())
	require.NoError(t, m.Sleep(Discard))
	require.NoError(t, m.Wake())
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Close())
}

// TestTensorNoLeak: cycles of allocating, taking tensors, sleeping,
// waking and freeing leave no descriptor or mapping behind.
func TestTensorNoLeak(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	defer closeAll(t, m)
	work := func() {
		p, err := m.Alloc("w", 200*kib)
		require.NoError(t, err)
		for range 3 {
			tt := mustTensor(t, m, p)
			require.NoError(t, tt.Set(5, 100))
			require.NoError(t, m.Sleep(Host, "w"))
			require.NoError(t, m.Wake("w"))
		}
		require.NoError(t, m.Free(p))
	}
	_, _, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "the cycles leak")
	require.Zero(t, stats(t, m, "w").BackupBytes)
}
