package physical

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/mapref"
	"github.com/vmarena/vmarena/internal/units"
)

// Chunk is one physical chunk of memory on one device. Its handle, device,
// size and shareability are fixed at Create; its state is guarded by its
// Memory's mutex.
type Chunk struct {
	m         *Memory
	handle    driver.Handle
	dev       driver.DeviceID
	size      uint64
	shareable bool

	// released: the handle was given up. maps: mappings acquired and not
	// dropped. returned: released with maps == 0, memory back on the
	// device and the chunk gone from m.chunks. returned implies released.
	released bool
	maps     int
	returned bool

	imported bool      // made from another process's shareable handle
	export   *exported // the shareable handle, once exported
}

// Handle is the driver's handle of the chunk.
func (c *Chunk) Handle() driver.Handle {
	if c == nil {
		return 0
	}
	return c.handle
}

// Device is the device whose memory the chunk holds.
func (c *Chunk) Device() driver.DeviceID {
	if c == nil {
		return 0
	}
	return c.dev
}

// Size is the chunk's size in bytes.
func (c *Chunk) Size() uint64 {
	if c == nil {
		return 0
	}
	return c.size
}

// Shareable reports whether the chunk was created shareable.
func (c *Chunk) Shareable() bool {
	if c == nil {
		return false
	}
	return c.shareable
}

// made returns ErrBadHandle for a Chunk that Memory.Create or Import did
// not make (a zero Chunk).
func (c *Chunk) made(op string) error {
	if c == nil || c.m == nil {
		return errors.Wrapf(driver.ErrBadHandle, "physical: %s %s: the chunk was not made by Memory.Create or Import", op, c)
	}
	return nil
}

// Released reports whether the handle has been released.
func (c *Chunk) Released() bool {
	if c == nil || c.m == nil {
		return true // never created: nothing to release
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.released
}

// Mappings is the number of mappings acquired and not yet dropped.
func (c *Chunk) Mappings() int {
	if c == nil || c.m == nil {
		return 0
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.maps
}

// String formats c as "chunk 7 (2 MiB on device 1)".
func (c *Chunk) String() string {
	if c == nil {
		return "chunk (nil)"
	}
	return fmt.Sprintf("chunk %d (%s on device %d)", c.handle, units.Bytes(c.size), c.dev)
}

// Release gives up the handle (driver.Release): the chunk can no longer be
// mapped. Its memory stays counted in Used until its last mapping is dropped
// too. Releasing twice is driver.ErrBadHandle.
//
// A handle the driver no longer knows (driver.ErrBadHandle from the driver:
// someone called Driver.Release on it behind this package's back) is
// marked released all the same, since the driver holds it no longer, and
// the error, which wraps driver.ErrBadHandle, says what happened: the books
// follow the driver, so that the chunk's memory leaves Used once it is
// unmapped and Close and Check can still finish.
func (c *Chunk) Release() error {
	if err := c.made("release"); err != nil {
		return err
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("release")
	if c.m.closed {
		return driver.Closed(fmt.Sprintf("physical: release %s: the memory is closed (Close released every chunk)", c))
	}
	return c.releaseLocked()
}

func (c *Chunk) releaseLocked() error {
	what := func() string { return fmt.Sprintf("physical: release %s", c) }
	if c.released {
		return errors.Wrapf(driver.ErrBadHandle, "%s: already released", what())
	}
	if err := c.m.d.Release(c.handle); err != nil {
		if !errors.Is(err, driver.ErrBadHandle) {
			return errors.Wrapf(err, "%s", what())
		}
		c.released = true
		if c.maps == 0 {
			c.returnLocked()
		}
		return errors.WithHint(
			errors.Wrapf(err, "%s: the driver no longer holds the handle (released through the driver behind the memory's back?); the memory has let it go", what()),
			"release chunks with Chunk.Release, never with Driver.Release")
	}
	c.released = true
	if c.maps == 0 {
		c.returnLocked()
	}
	return nil
}

// returnLocked takes a released, unmapped chunk off the books.
func (c *Chunk) returnLocked() {
	c.closeExportLocked()
	c.returned = true
	c.m.chunks.remove(c)
	u := &c.m.usage[c.dev]
	u.Used -= c.size
	u.Chunks--
}

func init() {
	mapref.Map = func(c any, op mapref.Op) error { return c.(*Chunk).mapWith(op) }
	mapref.Unmap = func(c any, op mapref.Op) error { return c.(*Chunk).unmapWith(op) }
}

// mapWith counts one more mapping of c and runs op — the driver's map —
// under the memory's lock, so the books and the driver change together;
// if do fails, the count is as it was. A released chunk is
// driver.ErrBadHandle, and op does not run.
func (c *Chunk) mapWith(op mapref.Op) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("map")
	if err := c.acquireLocked(); err != nil {
		return err
	}
	if err := op.Do(); err != nil {
		return errors.CombineErrors(err, c.dropLocked())
	}
	return nil
}

// unmapWith runs op — the driver's unmap — and counts one mapping of c
// fewer, under the memory's lock: the driver cannot return the memory of a
// released chunk before these books do, so a device's Used never shows
// memory the driver has already handed to someone else. If op fails
// nothing changes.
func (c *Chunk) unmapWith(op mapref.Op) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("unmap")
	if c.maps == 0 {
		return errors.AssertionFailedf("physical: unmap a mapping of %s: it has no mappings", c)
	}
	if err := op.Do(); err != nil {
		return err
	}
	return c.dropLocked()
}

// acquire counts one more mapping of c (physical's own tests play the
// mapping layer with it and drop). A released chunk is driver.ErrBadHandle.
func (c *Chunk) acquire() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("acquire")
	return c.acquireLocked()
}

func (c *Chunk) acquireLocked() error {
	what := func() string { return fmt.Sprintf("physical: acquire %s for a mapping", c) }
	if c.m.closed {
		return driver.Closed(what() + ": the memory is closed")
	}
	if c.released {
		return errors.WithHint(errors.Wrapf(driver.ErrBadHandle, "%s: the chunk is released", what()),
			"a released chunk cannot be mapped again; create a new one")
	}
	c.maps++
	return nil
}

// drop counts one mapping of c fewer. Dropping the last mapping of a
// released chunk returns its memory. It works after Close too. More drops
// than acquires is an assertion failure and changes nothing.
func (c *Chunk) drop() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("drop")
	return c.dropLocked()
}

func (c *Chunk) dropLocked() error {
	if c.maps == 0 {
		return errors.AssertionFailedf("physical: drop a mapping of %s: it has no mappings (more drops than acquires)", c)
	}
	c.maps--
	if c.released && c.maps == 0 {
		c.returnLocked()
	}
	return nil
}

// Memory is the physical memory the chunk was created in. The mapping layer
// checks it, so a chunk is never mapped through a driver that did not make it.
func (c *Chunk) Memory() *Memory {
	if c == nil {
		return nil
	}
	return c.m
}
