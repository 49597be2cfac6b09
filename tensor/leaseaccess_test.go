package tensor_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// TestRevokeWaitsForAccesses: Revoke returns only once no access through
// the lease's tensors is in flight, and none starts after it: an owner
// that unmaps right after Revoke never pulls memory from under an At, Set
// or Copy. The buffer stands for the memory: after Revoke the test
// poisons it, and no access may have read or written it since. Each
// goroutine has a third of the tensor (a view) and a destination of its
// own, so the only bytes two parties share are the poison's, and the
// race detector checks the revoke's ordering too.
func TestRevokeWaitsForAccesses(t *testing.T) {
	for round := 0; round < 200; round++ {
		l := tensor.NewLease()
		buf := make(goBytes, 256)
		x, err := tensor.NewLeased(l, buf, tensor.Float32, 64)
		require.NoError(t, err)
		const part = 21 // elements of x each goroutine owns
		var revoked, late atomic.Bool
		var wg sync.WaitGroup
		for g := 0; g < 3; g++ {
			x, err := x.Narrow(0, g*part, part)
			require.NoError(t, err)
			dst, err := tensor.New(make(goBytes, 4*part), tensor.Float32, part)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					after := revoked.Load()
					var err error
					switch (g + i) % 3 {
					case 0:
						var v float64
						v, err = x.At(i % part)
						if err == nil && v == -1 {
							late.Store(true) // read the poison
						}
					case 1:
						err = x.Set(1, i%part)
					case 2:
						err = tensor.Copy(dst, x)
					}
					if err != nil {
						if !errors.Is(err, driver.ErrClosed) {
							late.Store(true)
						}
						return
					}
					if after {
						late.Store(true) // an access started after Revoke returned
					}
				}
			}()
		}
		l.Revoke()
		revoked.Store(true)
		p, err := tensor.New(buf, tensor.Float32, 64)
		require.NoError(t, err)
		for i := range 64 {
			require.NoError(t, p.Set(-1, i))
		}
		wg.Wait()
		require.False(t, late.Load(), "round %d: an access after the revoke", round)
		for i := range 64 {
			v, err := p.At(i)
			require.NoError(t, err)
			require.Equal(t, -1.0, v, "round %d: element %d written after the revoke", round, i)
		}
	}
}

// TestLeasedReadOnly: the first bytes NewLeasedReadOnly names refuse
// writes through the tensor and its views (Set, Copy into it), with
// nothing written; reads, and writes past them, work; a count outside
// the buffer is refused.
func TestLeasedReadOnly(t *testing.T) {
	buf := make(goBytes, 64)
	x, err := tensor.NewLeasedReadOnly(tensor.NewLease(), buf, 32, tensor.Float32, 4, 4)
	require.NoError(t, err)
	drivertest.RequireIs(t, x.Set(1, 1, 3), driver.ErrAccessDenied, "read-only")
	require.NoError(t, x.Set(2, 2, 0), "past the read-only bytes")
	v, err := x.At(1, 3)
	require.NoError(t, err)
	require.Zero(t, v)
	row, err := x.Narrow(0, 1, 2) // rows 1 and 2: starts in the read-only bytes
	require.NoError(t, err)
	src, err := tensor.New(make(goBytes, 32), tensor.Float32, 2, 4)
	require.NoError(t, err)
	drivertest.RequireIs(t, tensor.Copy(row, src), driver.ErrAccessDenied, "read-only")
	last, err := x.Narrow(0, 2, 2)
	require.NoError(t, err)
	require.NoError(t, tensor.Copy(last, src))
	require.Equal(t, make(goBytes, 32), buf[:32], "nothing written in the read-only bytes")
	require.NoError(t, tensor.Copy(src, row), "reads are fine")

	for _, n := range []int{-1, 65} {
		_, err := tensor.NewLeasedReadOnly(tensor.NewLease(), buf, n, tensor.Float32, 16)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "read-only bytes")
	}
}
