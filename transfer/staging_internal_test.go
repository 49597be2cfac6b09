package transfer

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// TestDeviceHoldCoversTheOp: the hold a device op takes on its tensor
// (tensor.AccessDevice, the lease a KV cache revokes) covers the whole
// op, all its pieces, on either side. The test stops the op between
// pieces by holding the staging half it needs (the target's for a put,
// the initiator's for a get), stops the tensor's lease (Revoke's first
// half) and sees the access still in flight; let go, the op completes,
// the lease is idle, and the next op through the registration is
// refused as stale (ErrClosed) without moving a byte.
func TestDeviceHoldCoversTheOp(t *testing.T) {
	for _, side := range []string{"target", "initiator"} {
		t.Run(side, func(t *testing.T) {
			drv, _ := cudatest.Open(t, cudatest.Config{Devices: 2, Capacity: 64 << 20, MinGranularity: 64 << 10, RecommendedGranularity: 2 << 20}, cuda.Options{})
			const size = 64 << 10 // 32 pieces of 2 KiB
			leased := func(dev driver.DeviceID, l *tensor.Lease) *tensor.Tensor {
				a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Device: dev, Max: 1 << 20, ChunkSize: 64 << 10})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, a.Close()) })
				v, err := a.Append(size, 64)
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, v.Release()) })
				x, err := tensor.NewLeased(l, v, tensor.Uint8, size)
				require.NoError(t, err)
				return x
			}
			engine := func(dev driver.DeviceID) *Engine {
				e, err := New(Config{Staging: Staging{Driver: drv, Device: dev, Size: 4096}})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, e.Close()) })
				return e
			}
			e0, e1 := engine(0), engine(1)
			l0, l1 := tensor.NewLease(), tensor.NewLease()
			r0, err := e0.Register(leased(0, l0))
			require.NoError(t, err)
			r1, err := e1.Register(leased(1, l1))
			require.NoError(t, err)
			d1, err := r1.Descriptor()
			require.NoError(t, err)
			p, err := e0.Connect(context.Background(), e1.Addr())
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Close()) }()

			l, half, do := l1, &e1.staging.served, p.Put
			if side == "initiator" {
				l, half, do = l0, &e0.staging.issued, p.Get
			}
			op := Op{Local: r0, Remote: d1, Len: size}
			half.mu.Lock()
			done := make(chan error, 1)
			go func() { done <- do(context.Background(), op) }()
			for l.Idle() { // until the op holds the tensor (-timeout bounds it)
				runtime.Gosched()
			}
			l.Stop()
			require.False(t, l.Idle(), "the op still holds the tensor, between pieces")
			half.mu.Unlock()
			require.NoError(t, <-done, "an op that held the tensor before the stop completes")
			require.True(t, l.Idle())
			l.Revoke()
			drivertest.RequireIs(t, do(context.Background(), op), driver.ErrClosed, "stale")
		})
	}
}
