package accel

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/internal/units"
)

// Streams: the engine orders the work; each engine stream has a runtime
// stream under it, made with it and destroyed after it. A copy or fill is
// checked against the record when the engine runs it — in stream order,
// after the work before it has finished — and then enqueued on the
// runtime stream and waited for, with the record held for reading, so no
// mapping it touches can change under it.

func (c *Core) unsupportedStreams(op string) error {
	return errors.WithHint(c.errf(driver.ErrUnsupported, "%s: the runtime lacks the stream calls", op),
		"Supports(driver.FeatureStreams) says whether a driver has them")
}

// CreateStream makes an engine stream of dev and the runtime stream under
// it.
func (c *Core) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	if !c.info.Streams {
		return 0, c.unsupportedStreams("create stream")
	}
	s, err := c.engine.CreateStream(dev)
	if err != nil {
		return 0, err
	}
	rs, err := c.rt.CreateStream(dev)
	if err != nil {
		_ = c.engine.DestroyStream(s) // nothing was enqueued on it
		return 0, errors.Wrapf(err, "%s: create stream on device %d", c.info.Name, dev)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams == nil { // closed meanwhile
		_ = c.rt.DestroyStream(rs)
		return 0, driver.Closed(c.info.Name + ": create stream")
	}
	c.streams[s] = rs
	return s, nil
}

// DestroyStream waits for s's work, destroys it and then its runtime
// stream.
func (c *Core) DestroyStream(s driver.Stream) error {
	if !c.info.Streams {
		return c.unsupportedStreams("destroy stream")
	}
	err := c.engine.DestroyStream(s)
	if _, gone := c.engine.StreamDevice(s); gone == nil {
		return err // refused (a host function waiting for itself): nothing changed
	}
	c.mu.Lock()
	rs, ok := c.streams[s]
	delete(c.streams, s)
	c.mu.Unlock()
	if ok {
		err = errors.CombineErrors(err, c.rt.DestroyStream(rs))
	}
	return err
}

// runtimeStream is the runtime stream under s, while s lives.
func (c *Core) runtimeStream(s driver.Stream) (any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, ok := c.streams[s]
	if !ok {
		return nil, c.errf(driver.ErrBadHandle, "stream %d is unknown or destroyed", s)
	}
	return rs, nil
}

func (c *Core) CreateEvent(dev driver.DeviceID) (driver.Event, error) {
	if !c.info.Streams {
		return 0, c.unsupportedStreams("create event")
	}
	return c.engine.CreateEvent(dev)
}

func (c *Core) DestroyEvent(e driver.Event) error {
	if !c.info.Streams {
		return c.unsupportedStreams("destroy event")
	}
	return c.engine.DestroyEvent(e)
}

func (c *Core) RecordEvent(e driver.Event, s driver.Stream) error {
	if !c.info.Streams {
		return c.unsupportedStreams("record event")
	}
	return c.engine.RecordEvent(e, s)
}

func (c *Core) StreamWaitEvent(s driver.Stream, e driver.Event) error {
	if !c.info.Streams {
		return c.unsupportedStreams("stream wait event")
	}
	return c.engine.StreamWaitEvent(s, e)
}

func (c *Core) SyncStream(s driver.Stream) error {
	if !c.info.Streams {
		return c.unsupportedStreams("synchronize stream")
	}
	return c.engine.SyncStream(s)
}

func (c *Core) QueryStream(s driver.Stream) (bool, error) {
	if !c.info.Streams {
		return false, c.unsupportedStreams("query stream")
	}
	return c.engine.QueryStream(s)
}

func (c *Core) SyncEvent(e driver.Event) error {
	if !c.info.Streams {
		return c.unsupportedStreams("synchronize event")
	}
	return c.engine.SyncEvent(e)
}

func (c *Core) QueryEvent(e driver.Event) (bool, error) {
	if !c.info.Streams {
		return false, c.unsupportedStreams("query event")
	}
	return c.engine.QueryEvent(e)
}

func (c *Core) ElapsedTime(start, end driver.Event) (time.Duration, error) {
	if !c.info.Streams {
		return 0, c.unsupportedStreams("elapsed time")
	}
	return c.engine.ElapsedTime(start, end)
}

func (c *Core) LaunchHostFunc(s driver.Stream, name string, fn func() error) error {
	if !c.info.Streams {
		return c.unsupportedStreams("launch host function")
	}
	return c.engine.LaunchHostFunc(s, name, fn)
}

func (c *Core) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	return c.engine.CanAccessPeer(dev, peer)
}

// EnablePeerAccess enables it in the runtime, then in the engine, whose
// check every copy consults.
func (c *Core) EnablePeerAccess(dev, peer driver.DeviceID) error {
	ok, err := c.engine.CanAccessPeer(dev, peer)
	if err != nil || !ok || dev == peer {
		return c.engine.EnablePeerAccess(dev, peer) // the engine's refusal, naming why
	}
	if err := c.rt.EnablePeerAccess(dev, peer); err != nil {
		return errors.Wrapf(err, "%s: enable peer access from device %d to device %d", c.info.Name, dev, peer)
	}
	return c.engine.EnablePeerAccess(dev, peer)
}

// checkCopy validates what can be checked when a copy is enqueued: the
// stream, and the alignment the device declares for async copies.
func (c *Core) checkCopy(what func() string, s driver.Stream, addrs []driver.Addr, host []byte) (driver.DeviceID, error) {
	if !c.info.Streams {
		return 0, c.unsupportedStreams(what())
	}
	dev, err := c.engine.StreamDevice(s)
	if err != nil {
		return 0, err
	}
	if !c.info.HostAccess {
		return 0, errors.WithHint(c.errf(driver.ErrUnsupported, "%s: the runtime lacks its synchronous copies, and this driver moves bytes only where it has them", what()),
			"Supports(driver.FeatureHostAccess) says whether a driver moves bytes")
	}
	return dev, driver.CheckCopyAlign(what, c.info.Devices[dev], addrs, host)
}

func (c *Core) peer(dev driver.DeviceID) func(driver.DeviceID) bool {
	return func(owner driver.DeviceID) bool { return c.engine.PeerEnabled(dev, owner) }
}

// enqueue adds a device operation to s: when its turn comes the ranges
// are checked as dev, then run enqueues the work on the runtime stream,
// which is waited for before the record is let go.
func (c *Core) enqueue(s driver.Stream, dev driver.DeviceID, name, op string, wants []ledger.Want, run func(rs any) error) error {
	return c.engine.Enqueue(s, name, func() error {
		rs, err := c.runtimeStream(s)
		if err != nil {
			return err
		}
		return c.books.WithDeviceRanges(op, dev, c.peer(dev), wants, func([]*ledger.Region) error {
			if err := run(rs); err != nil {
				return err
			}
			return c.rt.Wait(rs)
		})
	})
}

// CopyHtoD enqueues a copy of src to dst on s.
func (c *Core) CopyHtoD(dst driver.Addr, src []byte, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("%s: copy %d bytes from the host to %s", c.info.Name, len(src), dst) }
	dev, err := c.checkCopy(what, s, []driver.Addr{dst}, src)
	if err != nil || len(src) == 0 {
		return err
	}
	return c.enqueue(s, dev, what(), "copy to device", []ledger.Want{{Addr: dst, N: uint64(len(src)), Access: driver.AccessReadWrite}},
		func(rs any) error { return c.rt.CopyHtoD(rs, dst, src) })
}

// CopyDtoH enqueues a copy of len(dst) bytes at src into dst on s.
func (c *Core) CopyDtoH(dst []byte, src driver.Addr, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("%s: copy %d bytes from %s to the host", c.info.Name, len(dst), src) }
	dev, err := c.checkCopy(what, s, []driver.Addr{src}, dst)
	if err != nil || len(dst) == 0 {
		return err
	}
	return c.enqueue(s, dev, what(), "copy from device", []ledger.Want{{Addr: src, N: uint64(len(dst)), Access: driver.AccessRead}},
		func(rs any) error { return c.rt.CopyDtoH(rs, dst, src) })
}

// CopyDtoD enqueues a copy of n bytes from src to dst on s.
func (c *Core) CopyDtoD(dst, src driver.Addr, n uint64, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("%s: copy %s from %s to %s", c.info.Name, units.Bytes(n), src, dst) }
	dev, err := c.checkCopy(what, s, []driver.Addr{dst, src}, nil)
	if err != nil || n == 0 {
		return err
	}
	return c.enqueue(s, dev, what(), "copy device to device",
		[]ledger.Want{{Addr: src, N: n, Access: driver.AccessRead}, {Addr: dst, N: n, Access: driver.AccessReadWrite}},
		func(rs any) error { return c.rt.CopyDtoD(rs, dst, src, n) })
}

// Memset enqueues a fill of n bytes at dst with value on s.
func (c *Core) Memset(dst driver.Addr, value byte, n uint64, s driver.Stream) error {
	what := func() string {
		return fmt.Sprintf("%s: fill %s at %s with %#x", c.info.Name, units.Bytes(n), dst, value)
	}
	dev, err := c.checkCopy(what, s, []driver.Addr{dst}, nil)
	if err != nil || n == 0 {
		return err
	}
	return c.enqueue(s, dev, what(), "fill", []ledger.Want{{Addr: dst, N: n, Access: driver.AccessReadWrite}},
		func(rs any) error { return c.rt.Memset(rs, dst, value, n) })
}

// HostAlloc returns size bytes of the runtime's pinned host memory.
func (c *Core) HostAlloc(size uint64) ([]byte, error) {
	if !c.info.Streams {
		return nil, c.unsupportedStreams("host alloc")
	}
	if c.engine.Closed() {
		return nil, driver.Closed(c.info.Name + ": host alloc")
	}
	if size == 0 {
		return nil, c.errf(driver.ErrInvalid, "host alloc of zero bytes")
	}
	p, err := c.rt.HostAlloc(size)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: host alloc of %s", c.info.Name, units.Bytes(size))
	}
	b := unsafe.Slice((*byte)(p), size)
	if !c.host.Add(b) { // closed meanwhile
		_ = c.rt.HostFree(p)
		return nil, driver.Closed(c.info.Name + ": host alloc")
	}
	return b, nil
}

// HostFree returns a buffer HostAlloc gave, whole, once the work enqueued
// on every stream before it has run (queue.HostBuffers.Remove): copies
// queued on it run on the engine's goroutines, which the runtime's own
// synchronizing free does not see.
func (c *Core) HostFree(b []byte) error {
	if !c.info.Streams {
		return c.unsupportedStreams("host free")
	}
	if c.engine.Closed() {
		return driver.Closed(c.info.Name + ": host free (Close returned every host buffer)")
	}
	if err := c.host.Remove(c.info.Name, c.engine, b); err != nil {
		return err
	}
	return errors.Wrapf(c.rt.HostFree(unsafe.Pointer(&b[0])), "%s: host free", c.info.Name)
}
