package arena

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
)

// Pool keeps the chunks that ranges decommit, unmapped but not released,
// for the next commits of any range that uses it (SparseOptions.Pool): a
// commit maps a kept chunk of the device and size it needs instead of
// creating one, a decommit keeps the chunk instead of releasing it. A
// driver create and release cost far more than a map and an unmap (an
// A100 creates a 2 MiB chunk in 193 µs and maps it in 1.5 µs), so a
// range that gives memory back and takes it again soon — a KV cache under
// pressure evicting one page to fill another — pays only the maps.
//
// The pool's chunks stay committed: the device counts them as used, and
// so must whoever budgets the memory (Bytes). It keeps at most Limit
// bytes — a decommit past it releases — and Trim releases down to a
// figure; Close releases all. A commit whose device has no room for a
// chunk the pool lacks the size of releases pooled chunks of other sizes
// on it first, the largest first, as many as make the room (ranges of
// one pool may cut chunks of different sizes: a KV cache's slots a page,
// its prefix store a unit of several); a commit they cannot make room
// for releases none. Shareable chunks are never pooled (their
// exports name them). A reused chunk holds whatever was written to it
// last, as a created one holds whatever the device had.
//
// Safe for concurrent use. Its lock is a leaf: taken under a range's
// locks, never held while anything else is locked or called but the
// physical memory's create-free release.
type Pool struct {
	mem *physical.Memory
	mu  sync.Mutex
	// free holds the kept chunks by device and size, each list last in,
	// first out; bytes is their sum, never above limit.
	free   map[poolKey][]*physical.Chunk
	bytes  uint64
	limit  uint64
	stats  PoolStats
	closed bool
}

type poolKey struct {
	dev  driver.DeviceID
	size uint64
}

// PoolStats are a pool's figures.
type PoolStats struct {
	// Bytes and Chunks are what the pool keeps now.
	Bytes  uint64
	Chunks int
	// Kept counts chunks a decommit gave the pool, Filled those Fill
	// created for it, Reused those a commit took from it, Released those
	// it released (past its limit, trimmed, closed).
	Kept, Filled, Reused, Released int
}

// NewPool makes a pool of mem's chunks that keeps at most limit bytes.
func NewPool(mem *physical.Memory, limit uint64) (*Pool, error) {
	if mem == nil || mem.Driver() == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: new pool: the physical memory is nil or has no driver")
	}
	return &Pool{mem: mem, free: map[poolKey][]*physical.Chunk{}, limit: limit}, nil
}

func (p *Pool) unmade() bool { return p == nil || p.mem == nil }

// Limit is the most the pool keeps.
func (p *Pool) Limit() uint64 {
	if p.unmade() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limit
}

// SetLimit sets the most the pool keeps, releasing chunks (the latest
// kept first) until it keeps no more.
func (p *Pool) SetLimit(limit uint64) error {
	if p.unmade() {
		return unmade("Pool.SetLimit", "NewPool")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return driver.Closed("arena: set the limit of a closed pool")
	}
	p.limit = limit
	return p.trimLocked(limit)
}

// Trim releases chunks until the pool keeps at most to bytes; the limit
// stays.
func (p *Pool) Trim(to uint64) error {
	if p.unmade() {
		return unmade("Pool.Trim", "NewPool")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return driver.Closed("arena: trim a closed pool")
	}
	return p.trimLocked(to)
}

// trimLocked releases chunks until bytes <= to. A chunk the driver
// refuses to release is dropped from the pool all the same (its memory
// is the physical memory's to report) and the error returned.
func (p *Pool) trimLocked(to uint64) error {
	var errs error
	for k := range p.free {
		for p.bytes > to {
			c := p.popLocked(k)
			if c == nil {
				break
			}
			p.stats.Released++
			errs = errors.CombineErrors(errs, c.Release())
		}
		if p.bytes <= to {
			break
		}
	}
	return errs
}

// popLocked takes the latest kept chunk of k out of the pool, nil when
// it keeps none.
func (p *Pool) popLocked(k poolKey) *physical.Chunk {
	list := p.free[k]
	if len(list) == 0 {
		return nil
	}
	c := list[len(list)-1]
	list[len(list)-1] = nil
	if list = list[:len(list)-1]; len(list) == 0 {
		delete(p.free, k)
	} else {
		p.free[k] = list
	}
	p.bytes -= k.size
	return c
}

// Bytes is what the pool keeps now: committed memory no range maps.
func (p *Pool) Bytes() uint64 {
	if p.unmade() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// Stats returns the pool's figures.
func (p *Pool) Stats() PoolStats {
	if p.unmade() {
		return PoolStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Bytes = p.bytes
	for _, l := range p.free {
		st.Chunks += len(l)
	}
	return st
}

// takeFor hands s a kept chunk of dev and size, if there is one (none
// from a nil pool), counting it in s's figures.
func (p *Pool) takeFor(s *Sparse, dev driver.DeviceID, size uint64) *physical.Chunk {
	if p == nil {
		return nil
	}
	c := p.take(dev, size)
	if c != nil {
		s.stats.Reused++
	}
	return c
}

// count is how many chunks of dev and size the pool keeps.
func (p *Pool) count(dev driver.DeviceID, size uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0
	}
	return len(p.free[poolKey{dev, size}])
}

// sizesOn lists the sizes of dev's kept chunks and how many of each, the
// largest first.
func (p *Pool) sizesOn(dev driver.DeviceID) []sizeCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []sizeCount
	if p.closed {
		return nil
	}
	for k, l := range p.free {
		if k.dev == dev && len(l) > 0 {
			out = append(out, sizeCount{k.size, len(l)})
		}
	}
	slices.SortFunc(out, func(a, b sizeCount) int { return cmp.Compare(b.size, a.size) })
	return out
}

// release releases n of dev's kept chunks of size (fewer if it keeps
// fewer), the latest kept first, to make room on the device for chunks of
// another size (Sparse's plan). A chunk the driver refuses to release is
// dropped all the same and the error returned, as trimLocked does.
func (p *Pool) release(dev driver.DeviceID, size uint64, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs error
	for ; n > 0; n-- {
		c := p.popLocked(poolKey{dev, size})
		if c == nil {
			break
		}
		p.stats.Released++
		errs = errors.CombineErrors(errs, c.Release())
	}
	return errs
}

// take hands out a kept chunk of dev and size, if there is one.
func (p *Pool) take(dev driver.DeviceID, size uint64) *physical.Chunk {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	c := p.popLocked(poolKey{dev, size})
	if c != nil {
		p.stats.Reused++
	}
	return c
}

// put keeps c, unmapped, if it fits under the limit; kept says whether it
// did (the caller releases it otherwise).
func (p *Pool) put(c *physical.Chunk) (kept bool) { return p.keep(c, false) }

// keep is put, of a chunk a decommit gives back or Fill created (filled).
func (p *Pool) keep(c *physical.Chunk, filled bool) (kept bool) {
	if p == nil || c.Shareable() || c.Mappings() > 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.bytes+c.Size() > p.limit || p.bytes+c.Size() < p.bytes {
		return false
	}
	k := poolKey{c.Device(), c.Size()}
	p.free[k] = append(p.free[k], c)
	p.bytes += c.Size()
	if filled {
		p.stats.Filled++
	} else {
		p.stats.Kept++
	}
	return true
}

// Fill creates chunks of dev and size for the pool until it keeps n of
// them, within its limit: the creates a later commit would make on its
// path, made ahead (while a device computes, or idles) so that the
// commit only maps. It returns how many chunks of dev and size the pool
// keeps then. A create the driver refuses ends it with the error, the
// chunks created before it kept (counted in PoolStats.Filled). It
// refuses a size of 0 (ErrInvalid) and a closed pool (ErrClosed).
func (p *Pool) Fill(dev driver.DeviceID, size uint64, n int) (int, error) {
	if p.unmade() {
		return 0, unmade("Pool.Fill", "NewPool")
	}
	if size == 0 {
		return 0, errors.Wrap(driver.ErrInvalid, "arena: fill a pool with chunks of 0 bytes")
	}
	for {
		p.mu.Lock()
		have := len(p.free[poolKey{dev, size}])
		full := p.bytes+size > p.limit || p.bytes+size < p.bytes
		closed := p.closed
		p.mu.Unlock()
		switch {
		case closed:
			return have, driver.Closed("arena: fill a closed pool")
		case have >= n || full:
			return have, nil
		}
		// The create is made without the lock, which is a leaf.
		c, err := p.mem.Create(dev, size, driver.ChunkOptions{})
		if err != nil {
			return have, errors.Wrapf(err, "arena: fill the pool")
		}
		if !p.keep(c, true) {
			return have, errors.Wrapf(c.Release(), "arena: fill the pool: it filled meanwhile")
		}
	}
}

// Close releases every chunk the pool keeps; later decommits release
// theirs. Closing twice is ErrClosed.
func (p *Pool) Close() error {
	if p.unmade() {
		return unmade("Pool.Close", "NewPool")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return driver.Closed("arena: close a closed pool")
	}
	err := p.trimLocked(0)
	p.closed = true
	return err
}

// Check verifies the pool's books: every chunk kept is of its memory,
// unreleased and unmapped, under its key, and they sum to Bytes, within
// the limit.
func (p *Pool) Check() error {
	if p.unmade() {
		return unmade("Pool.Check", "NewPool")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var sum uint64
	for k, list := range p.free {
		for _, c := range list {
			sum += c.Size()
			switch {
			case c.Memory() != p.mem || c.Released():
				fail("arena: pool keeps %s, released or of another memory", c)
			case c.Device() != k.dev || c.Size() != k.size:
				fail("arena: pool keeps %s among the chunks of %s on device %d", c, units.Bytes(k.size), k.dev)
			case c.Mappings() > 0:
				fail("arena: pool keeps %s, mapped %d times", c, c.Mappings())
			}
		}
	}
	if sum != p.bytes || p.bytes > p.limit {
		fail("arena: pool keeps chunks of %s, counts %s, limit %s", units.Bytes(sum), units.Bytes(p.bytes), units.Bytes(p.limit))
	}
	return errs
}

// String describes the pool: "pool of 6 MiB (limit 64 MiB)".
func (p *Pool) String() string {
	if p.unmade() {
		return "arena: not a pool"
	}
	return fmt.Sprintf("pool of %s (limit %s)", units.Bytes(p.Bytes()), units.Bytes(p.Limit()))
}
