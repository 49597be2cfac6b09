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
