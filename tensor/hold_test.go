package tensor_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// addressed is a Buffer with a device address, as a KV cache's page
// memory is (kvcache's memory type): Go bytes standing for a mapping.
type addressed struct {
	b    []byte
	addr driver.Addr
}

func (m *addressed) Bytes() ([]byte, error) { return m.b, nil }
func (m *addressed) Addr() driver.Addr      { return m.addr }

// TestAccessBytes: fn gets exactly the tensor's elements, from its first
// one, and writes through them are the tensor's; fn's error comes back
// as it is.
func TestAccessBytes(t *testing.T) {
	a := newArena(t, 4*gran)
	x, err := tensor.OnArena(a, tensor.Uint8, 4, 16)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Release()) }()
	row, err := x.Narrow(0, 1, 2)
	require.NoError(t, err)
	require.NoError(t, row.Access(true, func(b []byte) error {
		require.Len(t, b, 32)
		require.Equal(t, 32, cap(b), "fn cannot reach past the tensor")
		for i := range b {
			b[i] = byte(i + 1)
		}
		return nil
	}))
	v, err := x.At(1, 0)
	require.NoError(t, err)
	require.Equal(t, 1.0, v)
	v, err = x.At(2, 15)
	require.NoError(t, err)
	require.Equal(t, 32.0, v)
	v, err = x.At(0, 15)
	require.NoError(t, err)
	require.Equal(t, 0.0, v, "nothing before the view was written")
	mine := driver.ErrBusy
	require.Equal(t, mine, row.Access(false, func([]byte) error { return mine }))
}

// TestAccessRefusals: each refusal names its sentinel, never calls fn and
// leaves the bytes as they were.
func TestAccessRefusals(t *testing.T) {
	called := false
	fn := func(b []byte) error {
		called = true
		for i := range b {
			b[i] = 0xff
		}
		return nil
	}
	buf := make(goBytes, 64)

	x, err := tensor.New(buf, tensor.Float32, 4, 4)
	require.NoError(t, err)
	tr, err := x.Transpose(0, 1)
	require.NoError(t, err)
	drivertest.RequireIs(t, tr.Access(false, fn), driver.ErrInvalid, "not contiguous")
	drivertest.RequireIs(t, x.Access(false, nil), driver.ErrInvalid, "fn is nil")
	drivertest.RequireIs(t, (*tensor.Tensor)(nil).Access(false, fn), driver.ErrInvalid)
	drivertest.RequireIs(t, new(tensor.Tensor).Access(true, fn), driver.ErrInvalid)

	l := tensor.NewLease()
	ro, err := tensor.NewLeasedReadOnly(l, buf, 16, tensor.Float32, 16)
	require.NoError(t, err)
	drivertest.RequireIs(t, ro.Access(true, fn), driver.ErrAccessDenied, "read-only")
	past, err := ro.Narrow(0, 4, 12) // past the read-only bytes: writable
	require.NoError(t, err)
	require.NoError(t, past.Access(true, func(b []byte) error { require.Len(t, b, 48); return nil }))
	require.NoError(t, ro.Access(false, func(b []byte) error { require.Len(t, b, 64); return nil }))
	l.Revoke()
	drivertest.RequireIs(t, ro.Access(false, fn), driver.ErrClosed)
	drivertest.RequireIs(t, past.Access(true, fn), driver.ErrClosed)

	a := newArena(t, 4*gran)
	y, err := tensor.OnArena(a, tensor.Float32, 8)
	require.NoError(t, err)
	require.NoError(t, y.Release())
	drivertest.RequireIs(t, y.Access(false, fn), driver.ErrClosed)
	require.False(t, called)
	require.Equal(t, make(goBytes, 64), buf)
}

// TestAccessPanicLetsGo: a panic in fn comes through Access, and the hold
// is let go first: a Revoke after it returns, and the tensor is then
// closed.
func TestAccessPanicLetsGo(t *testing.T) {
	l := tensor.NewLease()
	x, err := tensor.NewLeased(l, make(goBytes, 64), tensor.Float32, 16)
	require.NoError(t, err)
	require.PanicsWithValue(t, "boom", func() {
		_ = x.Access(true, func([]byte) error { panic("boom") })
	})
	done := make(chan struct{})
	go func() { l.Revoke(); close(done) }()
	<-done
	drivertest.RequireIs(t, x.Access(false, func([]byte) error { return nil }), driver.ErrClosed)
}

// TestRevokeWaitsForAccess: a Revoke that comes while fn runs returns
// only after fn has, and an Access after it answers ErrClosed without
// calling fn.
func TestRevokeWaitsForAccess(t *testing.T) {
	l := tensor.NewLease()
	x, err := tensor.NewLeased(l, make(goBytes, 64), tensor.Float32, 16)
	require.NoError(t, err)
	inside, release := make(chan struct{}), make(chan struct{})
	var fnDone, revoked atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		require.NoError(t, x.Access(true, func(b []byte) error {
			close(inside)
			<-release
			b[0] = 1
			fnDone.Store(true)
			return nil
		}))
	}()
	<-inside
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.Revoke()
		revoked.Store(fnDone.Load()) // true only if fn had ended
	}()
	time.Sleep(10 * time.Millisecond) // give Revoke a chance to return early (it must not)
	close(release)
	wg.Wait()
	require.True(t, revoked.Load(), "Revoke returned while fn still ran")
	drivertest.RequireIs(t, x.Access(false, func([]byte) error { t.Error("fn called after revoke"); return nil }), driver.ErrClosed)
}

// TestAccessSim: an empty tensor on a sim driver's arena has no memory
// the process can address: Access says so instead of handing out no
// bytes as if they were it. (The sim driver refuses any non-empty tensor
// when it is made: TestOnArenaSim.)
func TestAccessSim(t *testing.T) {
	drv, err := sim.New(sim.Options{Granularity: gran})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 4 * gran, ChunkSize: gran})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	x, err := tensor.OnArena(a, tensor.Float32, 0, 8)
	require.NoError(t, err)
	drivertest.RequireIs(t, x.Access(false, func([]byte) error { t.Error("fn called"); return nil }), driver.ErrUnsupported, "not addressable")
	require.NoError(t, x.Release())
}

// TestMapped: memory with a device address (an arena view, an
// allocation, a KV cache's page buffer) is mapped; Go memory is not; nor
// is a nil or zero tensor. Views keep their storage's answer.
func TestMapped(t *testing.T) {
	a := newArena(t, 4*gran)
	x, err := tensor.OnArena(a, tensor.Float32, 8)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Release()) }()
	require.True(t, x.Mapped())
	v, err := x.Narrow(0, 2, 2)
	require.NoError(t, err)
	require.True(t, v.Mapped())

	b := make([]byte, 64)
	kv, err := tensor.NewLeasedReadOnly(tensor.NewLease(), &addressed{b, 0x7000_0000}, 0, tensor.Float32, 16)
	require.NoError(t, err)
	require.True(t, kv.Mapped())

	g, err := tensor.New(make(goBytes, 64), tensor.Float32, 16)
	require.NoError(t, err)
	require.False(t, g.Mapped())
	require.False(t, (*tensor.Tensor)(nil).Mapped())
	require.False(t, new(tensor.Tensor).Mapped())
}
