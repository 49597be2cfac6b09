package pool

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// noPanic returns what call returns, or an error if it panicked.
func noPanic(call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return call()
}

// TestUnmadePoolMallocFree: MallocAsync and FreeAsync on a nil or zero
// Pool, with a good stream, are ErrInvalid naming the method and the nil
// or zero value — not a nil dereference, nor a zero pool's "stream of
// another driver" — and the real pool's books are untouched.
func TestUnmadePoolMallocFree(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	ptr, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		p    *Pool
	}{{"nil", nil}, {"zero", &Pool{}}} {
		t.Run(c.name, func(t *testing.T) {
			before := pe.books(t, pe.a, ptr)
			err := noPanic(func() error { _, err := c.p.MallocAsync(1000, pe.a); return err })
			drivertest.RequireIs(t, err, driver.ErrInvalid, "Pool.MallocAsync", "nil or zero")
			err = noPanic(func() error { return c.p.FreeAsync(ptr, pe.a) })
			drivertest.RequireIs(t, err, driver.ErrInvalid, "Pool.FreeAsync", "nil or zero")
			require.Equal(t, before, pe.books(t, pe.a, ptr))
			require.NoError(t, pe.p.Check())
		})
	}
	require.NoError(t, pe.p.FreeAsync(ptr, pe.a))
	require.NoError(t, pe.a.Synchronize())
}

// TestBytesOfReusedBlock: Bytes of an allocation that reuses a larger
// freed block is the size asked for, length and capacity, not the block's:
// the bytes past it are no part of the allocation.
func TestBytesOfReusedBlock(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	p1, err := pe.p.MallocAsync(4096, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.p.FreeAsync(p1, pe.a))
	p2, err := pe.p.MallocAsync(3000, pe.a)
	require.NoError(t, err)
	require.Equal(t, p1, p2, "the freed block is reused on its own stream")
	b, err := pe.p.Bytes(p2)
	require.NoError(t, err)
	require.Equal(t, 3000, len(b))
	require.Equal(t, 3000, cap(b), "an append must not reach past the allocation")
	require.NoError(t, pe.p.FreeAsync(p2, pe.a))
	require.NoError(t, pe.a.Synchronize())
}
