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

// TestAbsurdArguments: sizes that overflow when rounded, attributes and
// devices out of range, access values no driver knows, and frees of
// addresses never handed out are each refused with the sentinel and a
// message naming the call, and leave the pool's books as they were;
// absurd but meaningful values (a release threshold or a trim target of
// every byte) are taken, and move no memory.
func TestAbsurdArguments(t *testing.T) {
	pe := newPoolEnv(t, Props{}, true, true, true)
	ptr, err := pe.p.MallocAsync(1000, pe.a)
	require.NoError(t, err)
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error // nil: accepted
		mentions string
	}{
		{"malloc of every byte", func() error { _, err := pe.p.MallocAsync(^uint64(0), pe.a); return err }, driver.ErrOutOfMemory, "malloc async"},
		{"malloc overflowing when rounded to a chunk", func() error { _, err := pe.p.MallocAsync(^uint64(0)-g+2, pe.a); return err }, driver.ErrOutOfMemory, "malloc async"},
		{"malloc of 2^63+1", func() error { _, err := pe.p.MallocAsync(1<<63+1, pe.a); return err }, driver.ErrOutOfMemory, "malloc async"},
		{"free of an interior pointer", func() error { return pe.p.FreeAsync(ptr+8, pe.a) }, driver.ErrNotAllocated, "not the start"},
		{"free of an address never handed out", func() error { return pe.p.FreeAsync(12345, pe.a) }, driver.ErrNotAllocated, "not the start"},
		{"bytes of an interior pointer", func() error { _, err := pe.p.Bytes(ptr + 1); return err }, driver.ErrNotAllocated, "bytes of"},
		{"offset of an interior pointer", func() error { _, _, err := pe.p.Offset(ptr + 1); return err }, driver.ErrNotAllocated, "offset of"},
		{"unknown attribute", func() error { return pe.p.SetAttribute(Attr(-1), 0) }, driver.ErrInvalid, "unknown attribute -1"},
		{"policy of 2", func() error { return pe.p.SetAttribute(ReuseAllowOpportunistic, 2) }, driver.ErrInvalid, "takes 0 or 1"},
		{"high-water mark set", func() error { return pe.p.SetAttribute(UsedMemHigh, 1<<40) }, driver.ErrInvalid, "only be reset"},
		{"current value set", func() error { return pe.p.SetAttribute(UsedMemCurrent, 0) }, driver.ErrInvalid, "read-only"},
		{"access of device -1", func() error { return pe.p.SetAccess(-1, driver.AccessReadWrite) }, driver.ErrNoDevice, "device -1"},
		{"access of device 99", func() error { return pe.p.SetAccess(99, driver.AccessRead) }, driver.ErrNoDevice, "device 99"},
		{"access value 2 for a peer", func() error { return pe.p.SetAccess(1, driver.Access(2)) }, driver.ErrInvalid, "access value 2"},
		{"release import never exported", func() error { return pe.p.ReleaseImport(ptr) }, driver.ErrNotAllocated, "no process imported it"},
		{"export of a pool not shareable", func() error { _, err := pe.p.ExportPointer(ptr); return err }, driver.ErrInvalid, "Shareable"},
		{"export to process -5", func() error { _, err := pe.p.ExportPointer(ptr, -5); return err }, driver.ErrInvalid, "process ID -5"},
		{"default pool of device -1", func() error { _, err := Default(pe.drv, -1); return err }, driver.ErrNoDevice, "default pool"},
		{"threshold of every byte", func() error { return pe.p.SetAttribute(ReleaseThreshold, ^uint64(0)) }, nil, ""},
		{"trim to every byte", func() error { return pe.p.TrimTo(^uint64(0)) }, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := pe.books(t, pe.a, ptr)
			err := noPanic(c.call)
			if c.sentinel == nil {
				require.NoError(t, err)
			} else {
				drivertest.RequireIs(t, err, c.sentinel, c.mentions)
			}
			require.Equal(t, before, pe.books(t, pe.a, ptr))
		})
	}
	for _, props := range []Props{
		{MaxSize: 1 << 62, ChunkSize: g},            // a reservation no address space holds
		{MaxSize: ^uint64(0) / g * g, ChunkSize: g}, // one that overflows when the allocator sizes it
		{ChunkSize: 1 << 63},
		{ChunkSize: g + 1},
		{Device: -1},
	} {
		_, err := New(pe.space, pe.mem, props)
		require.Error(t, err, "%+v", props)
		require.Contains(t, err.Error(), "pool: new pool", "%+v", props)
	}
	_, defaults := registered(pe.drv)
	require.Zero(t, defaults, "no default pool was created")
	require.NoError(t, pe.p.FreeAsync(ptr, pe.a))
	require.NoError(t, pe.a.Synchronize())
}
