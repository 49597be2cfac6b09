package physical

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
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
func (c *Chunk) Handle() driver.Handle { return c.handle }

// Device is the device whose memory the chunk holds.
func (c *Chunk) Device() driver.DeviceID { return c.dev }

// Size is the chunk's size in bytes.
func (c *Chunk) Size() uint64 { return c.size }

// Shareable reports whether the chunk was created shareable.
func (c *Chunk) Shareable() bool { return c.shareable }

// Released reports whether the handle has been released.
func (c *Chunk) Released() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.released
}

// Mappings is the number of mappings acquired and not yet dropped.
func (c *Chunk) Mappings() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.maps
}

// String formats c as "chunk 7 (2 MiB on device 1)".
func (c *Chunk) String() string {
	return fmt.Sprintf("chunk %d (%s on device %d)", c.handle, units.Bytes(c.size), c.dev)
}

// Release gives up the handle (driver.Release): the chunk can no longer be
// mapped. Its memory stays counted in Used until its last mapping is dropped
// too. Releasing twice is driver.ErrBadHandle.
func (c *Chunk) Release() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
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
		return errors.Wrapf(err, "%s", what())
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
	delete(c.m.chunks, c.handle)
	u := &c.m.usage[c.dev]
	u.Used -= c.size
	u.Chunks--
}

// Acquire counts one more mapping of c. The mapping layer calls it before
// the driver maps the chunk, and calls Drop if the map then fails. A
// released chunk is driver.ErrBadHandle.
func (c *Chunk) Acquire() error {
	what := func() string { return fmt.Sprintf("physical: acquire %s for a mapping", c) }
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
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

// Drop counts one mapping of c fewer; the mapping layer calls it after the
// driver unmapped the chunk. Dropping the last mapping of a released chunk
// returns its memory. It works after Close too. More Drops than Acquires
// is an assertion failure and changes nothing.
func (c *Chunk) Drop() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.maps == 0 {
		return errors.AssertionFailedf("physical: drop a mapping of %s: it has no mappings (more Drops than Acquires)", c)
	}
	c.maps--
	if c.released && c.maps == 0 {
		c.returnLocked()
	}
	return nil
}

// Memory is the physical memory the chunk was created in. The mapping layer
// checks it, so a chunk is never mapped through a driver that did not make it.
func (c *Chunk) Memory() *Memory { return c.m }
