package sleep

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// pinnedMin is the smallest backup given a pinned buffer of its own:
// each is a mapping of the process (and a cuMemHostAlloc on CUDA), so
// the many small allocations of a model (PyTorch makes thousands) are
// kept in Go memory instead, and the mappings a sleeping tag adds stay
// under its bytes / pinnedMin.
const pinnedMin = 1 << 20

// A hostCache hands out the host buffers of Host-mode backups and takes
// them back. Backups of at least pinnedMin get the driver's pinned
// memory where it has streams (cuMemHostAlloc on CUDA: copies at full
// speed), smaller ones Go memory.
//
// Pinned memory is slow to get and to give back: on an H100 host,
// pinning 1 GiB and unpinning it cost far more than copying it both
// ways. With a limit (Options.HostCache), a pinned buffer given back
// is kept, up to limit bytes in all, for a later backup of the same
// size (the same tag sleeping again); without one (the default) it
// goes back to the system at once, so a woken tag holds no host memory.
// Invariant: bytes is the sum of the lengths of the buffers in kept,
// at most limit.
type hostCache struct {
	d     driver.Driver
	limit uint64

	// mu guards bytes and kept; a leaf: the driver's HostAlloc and
	// HostFree (which waits for the streams' work) run without it.
	mu    lockrank.Mutex[lockrank.SleepHostCache]
	bytes uint64
	kept  map[uint64][][]byte // by length
}

func newHostCache(d driver.Driver, limit uint64) *hostCache {
	return &hostCache{d: d, limit: limit, kept: map[uint64][][]byte{}}
}

// alloc returns a host buffer of n bytes and whether it is pinned.
func (c *hostCache) alloc(n uint64) ([]byte, bool, error) {
	s, ok := c.d.(driver.Streams)
	if !ok || n < pinnedMin || !c.d.Supports(driver.FeatureStreams) {
		return make([]byte, n), false, nil
	}
	c.mu.Lock()
	if bufs := c.kept[n]; len(bufs) > 0 {
		b := bufs[len(bufs)-1]
		bufs[len(bufs)-1] = nil
		if len(bufs) == 1 {
			delete(c.kept, n)
		} else {
			c.kept[n] = bufs[:len(bufs)-1]
		}
		c.bytes -= n
		c.mu.Unlock()
		return b, true, nil
	}
	c.mu.Unlock()
	b, err := s.HostAlloc(n)
	if err != nil {
		return nil, false, err
	}
	return b[:n], true, nil
}

// release takes back buffer buf that alloc returned: kept for reuse
// while the cache has room, else given back to the driver.
func (c *hostCache) release(buf []byte, pinned bool) error {
	if !pinned {
		return nil
	}
	n := uint64(len(buf))
	c.mu.Lock()
	if c.bytes+n <= c.limit {
		c.kept[n] = append(c.kept[n], buf)
		c.bytes += n
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	return c.d.(driver.Streams).HostFree(buf)
}

// held is how many bytes of pinned memory the cache keeps (Check holds it
// to the limit).
func (c *hostCache) held() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// close gives every kept buffer back to the driver. It takes them out of
// the cache first and frees them without mu: a HostFree waits for the
// work on the driver's streams, which may be a host function that
// allocates here.
func (c *hostCache) close() error {
	c.mu.Lock()
	kept := c.kept
	c.kept, c.bytes = map[uint64][][]byte{}, 0
	c.mu.Unlock()
	var errs error
	for n, bufs := range kept {
		for _, b := range bufs {
			if err := c.d.(driver.Streams).HostFree(b); err != nil {
				errs = errors.CombineErrors(errs, errors.Wrapf(err, "sleep: give back a kept host buffer of %d bytes", n))
			}
		}
	}
	return errs
}
