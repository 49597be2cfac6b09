package bench

import (
	"math/rand/v2"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Cost flat in scale: one operation timed while the structure it edits
// holds a thousand, a hundred thousand and a million objects — live
// allocations, mappings, committed chunks. A memory manager runs for days
// under millions of operations; no operation may walk, copy or rehash
// state in proportion to what is live. Each operation keeps its subject at
// its size (an alloc and a free, a map and an unmap, a commit and a
// decommit), and the three sizes' rounds alternate, so each sees the same
// machine. Everything runs on the sim driver: a host process cannot hold a
// million kernel mappings (vm.max_map_count), and the books are the same.

// ScaleSizes are the numbers of objects an operation is timed at.
var ScaleSizes = []int{1_000, 100_000, 1_000_000}

// Scaled is an operation's mean time at each size.
type Scaled struct {
	Sizes []int
	// Time is the total time of N operations at each size.
	Time []time.Duration
	N    int
}

// NS is the mean nanoseconds of one operation at size i; 0 where there is
// no figure.
func (s Scaled) NS(i int) float64 {
	if s.N == 0 || i < 0 || i >= len(s.Time) {
		return 0
	}
	return float64(s.Time[i].Nanoseconds()) / float64(s.N)
}

// Ratio is the slowest size's mean over the fastest's: 1 when the cost
// does not grow with what is live.
func (s Scaled) Ratio() float64 {
	if len(s.Time) == 0 || s.NS(0) == 0 {
		return 0
	}
	lo, hi := s.NS(0), s.NS(0)
	for i := range s.Time {
		lo, hi = min(lo, s.NS(i)), max(hi, s.NS(i))
	}
	return hi / lo
}

// scaleBatch is how many operations one timed stretch holds.
const scaleBatch = 256

// subject is one structure at one size: step does one operation (leaving
// it at its size), done takes it down.
type subject struct {
	step func() error
	done func() error
}

// scale builds a subject of each size with build and times step rounds of
// scaleBatch operations, the sizes in turn, while more says so.
func scale(more func() bool, sizes []int, build func(n int) (subject, error)) (s Scaled, err error) {
	subs := make([]subject, 0, len(sizes))
	defer func() {
		for _, sub := range subs {
			err = errors.CombineErrors(err, sub.done())
		}
	}()
	for _, n := range sizes {
		sub, err := build(n)
		if err != nil {
			return s, errors.Wrapf(err, "bench: a subject of %d", n)
		}
		subs = append(subs, sub)
	}
	s = Scaled{Sizes: sizes, Time: make([]time.Duration, len(sizes))}
	for round := 0; more(); round++ {
		for k := range subs {
			i := (k + round) % len(subs) // a different size first each round
			t0 := time.Now()
			for range scaleBatch {
				if err := subs[i].step(); err != nil {
					return s, err
				}
			}
			s.Time[i] += time.Since(t0)
		}
		s.N += scaleBatch
	}
	return s, nil
}

// ScaleAllocFree times an Alloc and a Free with n allocations live (32 B
// to 4 KiB, as AllocFree's) on an allocator of the sim driver. recent frees
// the allocation made scaleBatch pairs before — a temporary, the common
// case — so what is timed is the books; otherwise it frees a live one at
// random, which at a million live reads a record no cache holds
// (MissLatency is that floor).
func ScaleAllocFree(more func() bool, sizes []int, recent bool) (Scaled, error) {
	return scale(more, sizes, func(n int) (subject, error) {
		drv, err := sim.New(sim.Options{Devices: 1, Capacity: units.TiB})
		if err != nil {
			return subject{}, err
		}
		al, err := arena.NewAllocator(vaspace.New(drv), physical.New(drv), arena.AllocatorOptions{Max: units.TiB})
		if err != nil {
			return subject{}, errors.CombineErrors(err, drv.Close())
		}
		rng := rand.New(rand.NewPCG(7, uint64(n)))
		size := func() uint64 {
			e := 5 + rng.IntN(7)
			return 1<<e + rng.Uint64N(1<<e)
		}
		live := make([]driver.Addr, n)
		for i := range live {
			if live[i], err = al.Alloc(size(), 0); err != nil {
				return subject{}, err
			}
		}
		const cycle = 1 << 16
		sizes, slots := make([]uint64, cycle), make([]int, cycle)
		for i := range cycle {
			sizes[i], slots[i] = size(), rng.IntN(n)
		}
		window := make([]driver.Addr, scaleBatch) // the recent ones, a ring
		for i := range window {
			if window[i], err = al.Alloc(size(), 0); err != nil {
				return subject{}, err
			}
		}
		c := 0
		step := func() error {
			c = (c + 1) % cycle
			p, err := al.Alloc(sizes[c], 0)
			if err != nil {
				return err
			}
			old := &window[c%scaleBatch]
			if !recent {
				old = &live[slots[c]]
			}
			err = al.Free(*old)
			*old = p
			return err
		}
		done := func() error {
			var errs error
			for _, p := range append(live, window...) {
				errs = errors.CombineErrors(errs, al.Free(p))
			}
			return errors.CombineErrors(errs, errors.CombineErrors(al.Close(), drv.Close()))
		}
		return subject{step, done}, nil
	})
}

// scaleGran is the granularity of the mapping and commit subjects: a
// million of them fit the sim driver's address space many times over.
const scaleGran = 64 * units.KiB

// scaleWindow is the number of slots, in the middle of a range, that a
// local subject works in.
const scaleWindow = 2 * scaleBatch

// scalePlaces lays n chunks out over 2n slots of a range: mapped are the
// slots that hold one, free the slots an operation works at. local keeps
// the work in a window in the middle of the range — every other slot of
// it mapped, the rest of the range half full at random — as an arena
// working where it last worked does: what is timed is the books, and a
// book that moved its tail on an edit would move half of it. Otherwise
// free is every empty slot, so each operation reads books no cache holds
// at a million (MissLatency is that floor).
func scalePlaces(rng *rand.Rand, n int, local bool) (mapped, free []int) {
	if !local {
		places := rng.Perm(2 * n)
		return places[:n], places[n:]
	}
	w := min(scaleWindow, n)
	lo := n - w/2
	for i := range w {
		if i%2 == 0 {
			mapped = append(mapped, lo+i)
		} else {
			free = append(free, lo+i)
		}
	}
	out := rng.Perm(2*n - w) // the slots outside the window, renumbered
	for _, o := range out[:n-len(mapped)] {
		if o >= lo {
			o += w
		}
		mapped = append(mapped, o)
	}
	return mapped, free
}

// ScaleMapUnmap times a page table's Map of a chunk and its Unmap, at an
// unmapped place of a reservation with n chunks mapped (scalePlaces, local
// or at random): the table's and the driver's books both hold n mappings.
func ScaleMapUnmap(more func() bool, sizes []int, local bool) (Scaled, error) {
	return scale(more, sizes, func(n int) (subject, error) {
		drv, err := sim.New(sim.Options{Devices: 1, Capacity: uint64(2*n+1) * scaleGran, Granularity: scaleGran})
		if err != nil {
			return subject{}, err
		}
		mem := physical.New(drv)
		res, err := vaspace.New(drv).Reserve(uint64(2*n)*scaleGran, 0)
		if err != nil {
			return subject{}, errors.CombineErrors(err, drv.Close())
		}
		tab, err := mapping.New(res, mem)
		if err != nil {
			return subject{}, errors.CombineErrors(err, drv.Close())
		}
		rng := rand.New(rand.NewPCG(8, uint64(n)))
		mapped, free := scalePlaces(rng, n, local)
		chunks := make([]*physical.Chunk, 0, n+1)
		for i := range n + 1 { // n mapped, and a spare
			c, err := mem.Create(0, scaleGran, driver.ChunkOptions{})
			if err != nil {
				return subject{}, err
			}
			chunks = append(chunks, c)
			if i < n {
				if err := tab.Map(res.Base()+driver.Addr(uint64(mapped[i])*scaleGran), c); err != nil {
					return subject{}, err
				}
			}
		}
		spare := chunks[n]
		c := 0
		step := func() error {
			c = (c + 1) % len(free)
			at := res.Base() + driver.Addr(uint64(free[c])*scaleGran)
			if err := tab.Map(at, spare); err != nil {
				return err
			}
			return tab.Unmap(at)
		}
		done := func() error {
			errs := tab.Close()
			for _, c := range chunks {
				errs = errors.CombineErrors(errs, c.Release())
			}
			errs = errors.CombineErrors(errs, res.Free())
			return errors.CombineErrors(errs, drv.Close())
		}
		return subject{step, done}, nil
	})
}

// ScaleCommitDecommit times a growable range's Commit of one chunk and its
// Decommit — a create, a map, an access grant, an unmap and a release —
// at an uncommitted place of a range with n chunks committed (scalePlaces,
// local or at random): the range's, the page table's and the driver's
// books all hold n chunks.
func ScaleCommitDecommit(more func() bool, sizes []int, local bool) (Scaled, error) {
	return scale(more, sizes, func(n int) (subject, error) {
		drv, err := sim.New(sim.Options{Devices: 1, Capacity: uint64(2*n+1) * scaleGran, Granularity: scaleGran})
		if err != nil {
			return subject{}, err
		}
		s, err := arena.NewSparse(vaspace.New(drv), physical.New(drv), arena.SparseOptions{Max: uint64(2*n) * scaleGran, ChunkSize: scaleGran})
		if err != nil {
			return subject{}, errors.CombineErrors(err, drv.Close())
		}
		rng := rand.New(rand.NewPCG(9, uint64(n)))
		mapped, free := scalePlaces(rng, n, local)
		for _, pl := range mapped {
			if err := s.Commit(uint64(pl)*scaleGran, scaleGran); err != nil {
				return subject{}, err
			}
		}
		c := 0
		step := func() error {
			c = (c + 1) % len(free)
			off := uint64(free[c]) * scaleGran
			if err := s.Commit(off, scaleGran); err != nil {
				return err
			}
			return s.Decommit(off, scaleGran)
		}
		done := func() error { return errors.CombineErrors(s.Close(), drv.Close()) }
		return subject{step, done}, nil
	})
}

// ScaleHashFloor is the floor the random rows are read against: a Go map
// of n uint64 keys, each step deleting a live key chosen at random and
// inserting a new one — Go's own hash table, O(1) by construction, at
// random places. What it loses from a thousand keys to a million is what
// the memory hierarchy takes from any structure whose objects no longer
// fit in cache; a random row that grows by a few times this is paying a
// constant number of misses more, not a cost in proportion to what is
// live.
func ScaleHashFloor(more func() bool, sizes []int) (Scaled, error) {
	return scale(more, sizes, func(n int) (subject, error) {
		rng := rand.New(rand.NewPCG(10, uint64(n)))
		keys := make([]uint64, n)
		m := make(map[uint64]uint64, n)
		for i := range keys {
			keys[i] = rng.Uint64()
			m[keys[i]] = uint64(i)
		}
		const cycle = 1 << 16
		slots, fresh := make([]int, cycle), make([]uint64, cycle)
		for i := range cycle {
			slots[i], fresh[i] = rng.IntN(n), rng.Uint64()
		}
		c := 0
		step := func() error {
			c = (c + 1) % cycle
			k := &keys[slots[c]]
			v, ok := m[*k]
			if !ok {
				return errors.AssertionFailedf("bench: key %#x went missing", *k)
			}
			delete(m, *k)
			// fresh[c] lives only in slot slots[c], so a later lap finds it
			// there or already replaced: never two live copies.
			*k = fresh[c]
			m[*k] = v
			return nil
		}
		done := func() error {
			if len(m) != n {
				return errors.AssertionFailedf("bench: %d keys, want %d", len(m), n)
			}
			return nil
		}
		return subject{step, done}, nil
	})
}
