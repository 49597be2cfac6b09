package stream_test

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/stream"
)

// mappedGranule maps one granule of device 0, read-write for it, filled
// with fill, and undoes it all at the end of the test.
func mappedGranule(t *testing.T, d driver.Driver, fill byte) driver.Addr {
	t.Helper()
	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	t.Cleanup(func() {
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(base, g))
	})
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, d.Write(base, bytes.Repeat([]byte{fill}, int(g))))
	return base
}

// TestHostBufferFreeWaitsForQueuedCopy: a host buffer freed while a copy
// into it is still queued. Free waits for the work queued before it, as
// cudaFreeHost synchronizes: the copy lands in the old buffer before it
// goes, and the next NewHostBuffer, which may get the same address, is
// never written.
func TestHostBufferFreeWaitsForQueuedCopy(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	const size = 4096
	src := mappedGranule(t, d, 0xab)
	for round := 0; round < 3; round++ {
		old, err := stream.NewHostBuffer(d, size)
		require.NoError(t, err)
		gate := make(chan struct{})
		require.NoError(t, s.Launch("gate", func() error {
			<-gate
			return nil
		}))
		require.NoError(t, s.CopyDtoH(old.Bytes(), src))
		var copied atomic.Bool
		require.NoError(t, s.Launch("after the copy", func() error { copied.Store(true); return nil }))

		type result struct {
			err        error
			copiedThen bool
			next       *stream.HostBuffer
		}
		freed := make(chan result, 1)
		go func() {
			err := old.Free()
			r := result{err: err, copiedThen: copied.Load()}
			r.next, r.err = stream.NewHostBuffer(d, size)
			r.err = errors.CombineErrors(err, r.err)
			freed <- r
		}()
		// Free waits here for the gate; a Free that returned at once
		// would let the next buffer take the freed address. The pause
		// only gives that fault time to show: it decides nothing.
		var r result
		early := false
		select {
		case r = <-freed:
			early = true
		case <-time.After(50 * time.Millisecond):
		}
		close(gate)
		if !early {
			require.NoError(t, bounded(t, "free", func() error { r = <-freed; return nil }))
		}
		require.NoError(t, bounded(t, "synchronize", s.Synchronize))
		require.NoError(t, r.err, "round %d", round)
		require.Equal(t, make([]byte, size), r.next.Bytes(), "round %d: the next buffer was written", round)
		require.True(t, r.copiedThen, "round %d: Free returned before the copy queued on the buffer ran", round)
		require.Nil(t, old.Bytes(), "freed")
		require.NoError(t, r.next.Free())
	}
}

// TestHostBufferFreeFromHostFunction: a Free from a host function with a
// copy into the buffer queued behind it cannot wait for that copy (the
// stream runs nothing until the host function returns): it is refused
// with ErrBusy and the buffer stays live, and the copy lands in it. With
// nothing queued behind it, a host function frees as anyone does.
func TestHostBufferFreeFromHostFunction(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	src := mappedGranule(t, d, 'x')
	hb, err := stream.NewHostBuffer(d, 64)
	require.NoError(t, err)
	gate := make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	defer open()
	require.NoError(t, s.Launch("gate", func() error { <-gate; return nil }))
	var inside error
	require.NoError(t, s.Launch("frees", func() error { inside = hb.Free(); return nil }))
	require.NoError(t, s.CopyDtoH(hb.Bytes(), src))
	open()
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	drivertest.RequireIs(t, inside, driver.ErrBusy, "host free", "host function")
	require.Equal(t, bytes.Repeat([]byte{'x'}, 64), hb.Bytes(), "live, and the copy landed")

	require.NoError(t, s.Launch("frees", func() error { inside = hb.Free(); return nil }))
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	require.NoError(t, inside, "nothing behind the host function")
	require.Nil(t, hb.Bytes())
	drivertest.RequireIs(t, hb.Free(), driver.ErrClosed)
}

// TestHostBufferBytesRacesFree: Bytes and Free from two goroutines do not
// race on the buffer's slice (under -race). Bytes returns the live memory
// or, once Free has begun, nil: never memory about to be given back.
func TestHostBufferBytesRacesFree(t *testing.T) {
	d := newHost(t)
	for round := 0; round < 100; round++ {
		hb, err := stream.NewHostBuffer(d, 64)
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Add(2)
		var freeErr error
		go func() { defer wg.Done(); freeErr = hb.Free() }()
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if b := hb.Bytes(); b != nil && len(b) != 64 {
					t.Errorf("Bytes is %d bytes", len(b))
				}
			}
		}()
		wg.Wait()
		require.NoError(t, freeErr)
		require.Nil(t, hb.Bytes())
	}
}

// TestNilAndZeroHostBuffer: a nil or zero HostBuffer has no bytes and
// refuses Free with ErrInvalid, without panicking.
func TestNilAndZeroHostBuffer(t *testing.T) {
	for name, hb := range map[string]*stream.HostBuffer{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			require.NotPanics(t, func() { require.Nil(t, hb.Bytes()) })
			drivertest.RequireIs(t, noPanic(hb.Free), driver.ErrInvalid, "NewHostBuffer")
		})
	}
}
