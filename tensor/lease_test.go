package tensor_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// TestLease: tensors made under a lease, and their views, refuse to touch
// memory once it is revoked (ErrClosed), as a released tensor's do; the
// lease's holder, not the tensor, ends the memory.
func TestLease(t *testing.T) {
	l := tensor.NewLease()
	buf := make(goBytes, 64)
	x, err := tensor.NewLeased(l, buf, tensor.Float32, 4, 4)
	require.NoError(t, err)
	require.NoError(t, x.Set(3, 1, 2))
	row, err := x.Narrow(0, 1, 1)
	require.NoError(t, err)
	v, err := row.At(0, 2)
	require.NoError(t, err)
	require.Equal(t, 3.0, v)
	drivertest.RequireIs(t, x.Release(), driver.ErrInvalid, "the lease's holder")
	other, err := tensor.NewLeased(tensor.NewLease(), buf, tensor.Float32, 16)
	require.NoError(t, err)

	l.Revoke()
	l.Revoke() // twice does nothing
	require.True(t, l.Revoked())
	for name, tt := range map[string]*tensor.Tensor{"tensor": x, "view": row} {
		require.True(t, tt.Released(), name)
		_, err := tt.At(0, 0)
		drivertest.RequireIs(t, err, driver.ErrClosed, "released")
		drivertest.RequireIs(t, tt.Set(1, 0, 0), driver.ErrClosed, "released")
		_, err = tt.Narrow(0, 0, 1)
		drivertest.RequireIs(t, err, driver.ErrClosed)
		drivertest.RequireIs(t, tensor.Copy(other, tt), driver.ErrClosed)
	}
	require.Equal(t, byte(0), buf[0], "nothing written after the revoke")
	w, err := other.At(6)
	require.NoError(t, err, "another lease's tensors live on")
	require.Equal(t, 3.0, w)

	_, err = tensor.NewLeased(l, buf, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrClosed, "revoked")
	_, err = tensor.NewLeased(nil, buf, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "lease is nil")
	_, err = tensor.NewLeased(tensor.NewLease(), nil, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "buffer is nil")
	var nilLease *tensor.Lease
	nilLease.Revoke()
	require.True(t, nilLease.Revoked())
}

// goBytes is a Buffer over Go memory.
type goBytes []byte

func (b goBytes) Bytes() ([]byte, error) { return b, nil }

// TestLeaseStop: Stop refuses every access that starts after it and every
// new tensor, while an access in flight goes on (not Idle) until it ends;
// Revoke then returns at once. Nothing here waits on the clock: the
// access in flight is held by a channel.
func TestLeaseStop(t *testing.T) {
	l := tensor.NewLease()
	buf := make(goBytes, 64)
	x, err := tensor.NewLeased(l, buf, tensor.Float32, 16)
	require.NoError(t, err)
	require.True(t, l.Idle())
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- x.Access(true, func(b []byte) error {
			close(inside)
			<-release
			b[0] = 7
			return nil
		})
	}()
	<-inside
	require.False(t, l.Idle())
	l.Stop()
	l.Stop() // twice does nothing
	require.True(t, l.Revoked())
	require.False(t, l.Idle(), "the access in flight goes on")
	_, err = x.At(1)
	drivertest.RequireIs(t, err, driver.ErrClosed, "released") // a new access is refused
	_, err = tensor.NewLeased(l, buf, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrClosed, "revoked") // no tensor is made under a stopped lease
	close(release)
	require.NoError(t, <-done)
	require.True(t, l.Idle())
	l.Revoke() // nothing in flight: returns at once
	require.Equal(t, byte(7), buf[0], "the access in flight wrote")
	var nilLease *tensor.Lease
	nilLease.Stop()
	require.True(t, nilLease.Idle())
}
