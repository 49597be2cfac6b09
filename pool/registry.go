package pool

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// registry finds pools: the pool whose memory holds an address (for the
// package-level FreeAsync) and each device's default pool (Default). It
// is the one owner of both indexes; nothing else keeps a list of pools.
//
// Lock order, in one direction only:
//
//	registry.creating  →  Pool.mu  →  registry.mu
//
// registry.mu is a leaf: with it held nothing is called but this file's
// slice and map operations — no pool, allocator, stream or driver method.
// New registers a pool before sharing it and destroy unregisters it under
// the pool's own lock; FreeAsync looks the owner up under registry.mu,
// lets go, and only then calls into the pool. registry.creating makes the
// creation of default pools one at a time (two first uses must not make
// two) and is held across New and CloseDefaults' destroys, so it comes
// first; Default takes it only to create, never to find a pool.
//
// Invariants (checked by check): the ranges of one driver are sorted by
// base and disjoint; each registered pool has all its ranges indexed, is
// not destroyed, and appears nowhere else; every default pool is
// registered, is a default pool, and is filed under its driver and device.
// Every driver key is comparable (driver.CheckComparable), so no map
// access can panic.
type registry struct {
	creating lockrank.Mutex[lockrank.PoolCreating]

	mu lockrank.Mutex[lockrank.PoolRegistry]
	// ranges are the live pools' address ranges by driver: each driver has
	// its own address space, so ranges of different drivers may overlap.
	ranges map[driver.Driver]*ranges.List[driver.Addr, *Pool]
	// defaults are the default pools by driver and device.
	defaults map[driver.Driver]map[driver.DeviceID]*Pool
}

// reg is the package's registry.
var reg registry

// add indexes p's ranges. A range overlapping one already indexed for the
// same driver is a broken invariant (the driver handed an address range
// out twice), and nothing is added.
func (r *registry) add(p *Pool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.ranges[p.d]
	if rs == nil {
		rs = &ranges.List[driver.Addr, *Pool]{}
	}
	for k, pr := range p.ranges {
		if i, ok := rs.Insert(pr.Base, pr.End(), p); !ok {
			o := rs.At(i)
			for _, done := range p.ranges[:k] { // put back what was added
				j, _ := rs.Find(done.Base)
				rs.Delete(j, j+1)
			}
			return errors.AssertionFailedf("pool: registering %s: it overlaps %s of another live pool", pr, vaspace.Range{Base: o.Start, Size: o.Size()})
		}
	}
	if r.ranges == nil {
		r.ranges = map[driver.Driver]*ranges.List[driver.Addr, *Pool]{}
	}
	if rs.Len() > 0 {
		r.ranges[p.d] = rs
	}
	return nil
}

// remove takes p's ranges out of the index (and nothing else).
func (r *registry) remove(p *Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.ranges[p.d]
	if rs == nil {
		return
	}
	for _, pr := range p.ranges {
		if i, ok := rs.Find(pr.Base); ok && rs.At(i).Val == p {
			rs.Delete(i, i+1)
		}
	}
	if rs.Len() == 0 {
		delete(r.ranges, p.d)
	}
}

// owner returns the live pool of d whose ranges hold ptr, or nil. It
// calls no pool: the caller asks the pool itself after this returns.
func (r *registry) owner(d driver.Driver, ptr driver.Addr) *Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.ranges[d]
	if rs == nil {
		return nil
	}
	if i, ok := rs.Find(ptr); ok {
		return rs.At(i).Val
	}
	return nil
}

// defaultPool returns d's default pool of dev, or nil.
func (r *registry) defaultPool(d driver.Driver, dev driver.DeviceID) *Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.defaults[d][dev]
}

// setDefault files p as d's default pool of dev.
func (r *registry) setDefault(d driver.Driver, dev driver.DeviceID, p *Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.defaults == nil {
		r.defaults = map[driver.Driver]map[driver.DeviceID]*Pool{}
	}
	if r.defaults[d] == nil {
		r.defaults[d] = map[driver.DeviceID]*Pool{}
	}
	r.defaults[d][dev] = p
}

// forgetDefault drops p from the default pools, if it is one.
func (r *registry) forgetDefault(p *Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.defaults[p.d][p.props.Device] == p {
		delete(r.defaults[p.d], p.props.Device)
		if len(r.defaults[p.d]) == 0 {
			delete(r.defaults, p.d)
		}
	}
}

// defaultsOf lists d's default pools.
func (r *registry) defaultsOf(d driver.Driver) []*Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []*Pool
	for _, p := range r.defaults[d] {
		ps = append(ps, p)
	}
	return ps
}

// check verifies the registry's invariants and reports every violation.
// It reads pools' fixed fields only (their ranges, driver, device and
// whether they are defaults), never their locked state, so it keeps
// registry.mu a leaf; whether a registered pool is destroyed is checked by
// the caller, outside the lock, through pools.
func (r *registry) check() (pools []*Pool, errs error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	indexed := map[*Pool][]vaspace.Range{}
	for d, rs := range r.ranges {
		if rs.Len() == 0 {
			fail("pool: registry: an empty range list for the %s driver", d.Name())
		}
		if err := rs.Check(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrap(err, "pool: registry"))
		}
		for _, it := range rs.All() {
			pr := vaspace.Range{Base: it.Start, Size: it.Size()}
			if it.Val.d != d {
				fail("pool: registry: %s of a pool of the %s driver filed under the %s driver", pr, it.Val.d.Name(), d.Name())
			}
			indexed[it.Val] = append(indexed[it.Val], pr)
		}
	}
	for p, rs := range indexed {
		byBase := func(a, b vaspace.Range) int { return cmp.Compare(a.Base, b.Base) }
		want := slices.SortedFunc(slices.Values(p.ranges), byBase)
		slices.SortFunc(rs, byBase)
		if !slices.Equal(rs, want) {
			fail("pool: registry: a pool owns %v, the index has %v", want, rs)
		}
		pools = append(pools, p)
	}
	for d, byDev := range r.defaults {
		for dev, p := range byDev {
			if _, ok := indexed[p]; !ok || !p.isDflt || p.d != d || p.props.Device != dev {
				fail("pool: registry: the default pool of device %d of the %s driver is not a registered default pool of that device", dev, d.Name())
			}
		}
	}
	return pools, errs
}

// checkRegistry checks the registry and that no pool it holds is
// destroyed, taking each pool's lock only after the registry's.
func checkRegistry() error {
	pools, errs := reg.check()
	for _, p := range pools {
		p.mu.Lock()
		if p.destroyed {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("pool: registry: a destroyed pool is still registered (%v)", p.ranges))
		}
		p.mu.Unlock()
	}
	return errs
}

// Default returns dev's default pool on d, creating it on first use with
// its own address space and physical memory accounting. It cannot be
// destroyed; CloseDefaults ends it with the driver. A driver that cannot
// key a map (driver.CheckComparable) is ErrInvalid.
//
// An existing pool is found without registry.creating, which CloseDefaults
// holds while it waits for frees in flight: work ahead of those frees (a
// host function) may allocate from the default pool. During CloseDefaults
// the pool found may be one being destroyed; calls on it then say so
// (ErrClosed).
func Default(d driver.Driver, dev driver.DeviceID) (*Pool, error) {
	if err := driver.CheckComparable(func() string { return "pool: default pool" }, d); err != nil {
		return nil, err
	}
	if p := reg.defaultPool(d, dev); p != nil {
		return p, nil
	}
	reg.creating.Lock()
	defer reg.creating.Unlock()
	if p := reg.defaultPool(d, dev); p != nil {
		return p, nil
	}
	p, err := newPool(vaspace.New(d), physical.New(d), Props{Device: dev}, true)
	if err != nil {
		return nil, errors.Wrap(err, "pool: default pool")
	}
	reg.setDefault(d, dev, p)
	return p, nil
}

// CloseDefaults destroys d's default pools (before closing d); it refuses
// while any has live allocations, and destroys the others.
func CloseDefaults(d driver.Driver) error {
	if err := driver.CheckComparable(func() string { return "pool: close default pools" }, d); err != nil {
		return err
	}
	reg.creating.Lock()
	defer reg.creating.Unlock()
	var errs error
	for _, p := range reg.defaultsOf(d) {
		errs = errors.CombineErrors(errs, p.destroy())
	}
	return errs
}

// MallocAsync allocates from the default pool of s's device
// (cudaMallocAsync). A nil stream is ErrInvalid, a destroyed one
// ErrClosed, and neither creates the default pool.
func MallocAsync(size uint64, s *stream.Stream) (driver.Addr, error) {
	if err := usable(func() string { return fmt.Sprintf("pool: malloc async %s on %s", units.Bytes(size), s) }, s); err != nil {
		return 0, err
	}
	p, err := Default(s.Driver(), s.Device())
	if err != nil {
		return 0, err
	}
	return p.MallocAsync(size, s)
}

// MallocFromPoolAsync allocates from p (cudaMallocFromPoolAsync).
func MallocFromPoolAsync(p *Pool, size uint64, s *stream.Stream) (driver.Addr, error) {
	if p == nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "pool: malloc async %s from no pool (nil)", units.Bytes(size))
	}
	return p.MallocAsync(size, s)
}

// FreeAsync frees ptr, from whichever pool of s's driver holds it
// (cudaFreeAsync). The registry names the pool whose address ranges hold
// ptr without asking any pool; that pool then decides whether ptr is a
// live allocation.
func FreeAsync(ptr driver.Addr, s *stream.Stream) error {
	if err := usable(func() string { return fmt.Sprintf("pool: free async %s on %s", ptr, s) }, s); err != nil {
		return err
	}
	owner := reg.owner(s.Driver(), ptr)
	if owner == nil {
		return errors.Wrapf(driver.ErrNotAllocated, "pool: free async %s: no pool of this driver has memory there", ptr)
	}
	return owner.FreeAsync(ptr, s)
}
