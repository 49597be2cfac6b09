package bench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/cachemiss"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The arena benchmarks. Each returns a Pair whose Lib is the
// arena and whose Bare is the baseline named in its doc, both timed in the
// same loop; only the operation named is timed, not the setup around it.
//
// Their setup is expensive (gigabytes committed, a million allocations), so
// they run rounds until more returns false rather than a count fixed
// beforehand: b.Loop in a benchmark, which sizes the run after the setup,
// and Rounds(n) in tests.

// Rounds returns a more that allows n rounds.
func Rounds(n int) func() bool {
	return func() bool { n--; return n >= 0 }
}

// ErrTooLarge says a benchmark needs more memory than the host driver's
// default capacity (half of MemAvailable) offers on this machine.
var ErrTooLarge = errors.New("bench: larger than the host driver's default device capacity")

// hostArenas opens a host driver with its default capacity, which must
// hold need bytes, and returns it with a vaspace and physical memory.
func hostArenas(need uint64, what string) (*host.Driver, *vaspace.Space, *physical.Memory, error) {
	drv, err := host.New(host.Options{Devices: 1})
	if err != nil {
		return nil, nil, nil, err
	}
	if c := drv.Devices()[0].Capacity; c < need {
		return nil, nil, nil, errors.CombineErrors(
			errors.Wrapf(ErrTooLarge, "bench: %s needs %s, the host driver's default device has %s (half of MemAvailable)",
				what, units.Bytes(need), units.Bytes(c)),
			drv.Close())
	}
	return drv, vaspace.New(drv), physical.New(drv), nil
}

// GrowOneChunk times growing an arena that holds size bytes by one more
// 2 MiB chunk (Grow alone is timed; Shrink and Trim then give the chunk
// back), beside the same growth of an arena that holds one chunk: Lib is
// the arena of size, Bare the one of 2 MiB. Both are filled with 2 MiB
// chunks (MaxChunk = ChunkSize), so the large arena also has the most
// chunks and mappings; a grow that costs the chunk and not the arena shows
// as Lib/Bare ≈ 1. Host driver, default capacity: ErrTooLarge when it
// cannot hold size plus the three chunks the run adds.
func GrowOneChunk(more func() bool, size uint64) (p Pair, err error) {
	drv, space, mem, err := hostArenas(size+3*ChunkSize, fmt.Sprintf("an arena of %s grown by one chunk", units.Bytes(size)))
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	big, err := filledArena(space, mem, size)
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, big.Close()) }()
	small, err := filledArena(space, mem, ChunkSize)
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, small.Close()) }()
	return alternate(more, 1,
		timed(func() error { return big.Grow(ChunkSize) }),
		timed(func() error { return small.Grow(ChunkSize) }),
		func() error { return errors.CombineErrors(giveBackChunk(big), giveBackChunk(small)) })
}

// filledArena is an arena of 2 MiB chunks holding size bytes, with room
// for one chunk more.
func filledArena(space *vaspace.Space, mem *physical.Memory, size uint64) (*arena.Arena, error) {
	a, err := arena.New(space, mem, arena.Options{Max: size + ChunkSize, ChunkSize: ChunkSize, MaxChunk: ChunkSize})
	if err != nil {
		return nil, err
	}
	if err := a.Grow(size); err != nil {
		return nil, errors.CombineErrors(err, a.Close())
	}
	return a, nil
}

// giveBackChunk undoes a one-chunk Grow: the arena shrinks by the chunk
// and gives it back to the device.
func giveBackChunk(a *arena.Arena) error {
	if err := a.Shrink(ChunkSize); err != nil {
		return err
	}
	return a.Trim()
}

// timed turns step into one side of alternate: its time is added to the
// side's total.
func timed(step func() error) func(*time.Duration) error {
	return func(into *time.Duration) error {
		t0 := time.Now()
		err := step()
		*into += time.Since(t0)
		return err
	}
}

// GrowStep times one growth step of an arena that holds size bytes — a
// Grow by one 2 MiB chunk: the chunk created, mapped and granted
// read-write — beside the same system calls made bare on a memfd and a
// reservation of the baseline's own (bareRegion.growStep), in the same
// loop. Lib/Bare is what the library's books cost on top of the calls; a
// step whose cost does not grow with the arena gives the same ratio at
// every size. Host driver, default capacity: ErrTooLarge when it cannot
// hold size plus the chunk.
func GrowStep(more func() bool, size uint64) (p Pair, err error) {
	drv, space, mem, err := hostArenas(size+2*ChunkSize, fmt.Sprintf("a growth step of an arena of %s", units.Bytes(size)))
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	a, err := filledArena(space, mem, size)
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, a.Close()) }()
	bare, err := newBareRegion(ChunkSize)
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, bare.close()) }()
	return alternate(more, 1,
		timed(func() error { return a.Grow(ChunkSize) }),
		timed(bare.growStep),
		func() error { return errors.CombineErrors(giveBackChunk(a), bare.undoStep()) })
}

// GrowTo times growing memory to total bytes in 2 MiB steps: an arena on
// the host driver grown ChunkSize at a time (Lib: arena.New and the Grows;
// Close is not timed), beside a []byte extended by 2 MiB of zeros at a
// time with append (Bare: Go's copying growth; a GC runs untimed after each
// round, so every round starts from the same heap). Both hand out zeroed
// memory and neither writes a payload; the arena's chunks come with their
// page tables filled (host populate), append's fresh tail is faulted in
// only when it is first touched. Host driver, default capacity:
// ErrTooLarge when it cannot hold total.
func GrowTo(more func() bool, total uint64) (p Pair, err error) {
	drv, space, mem, err := hostArenas(total, fmt.Sprintf("growing to %s", units.Bytes(total)))
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	viaArena := func(into *time.Duration) error {
		t0 := time.Now()
		a, err := arena.New(space, mem, arena.Options{Max: total, ChunkSize: ChunkSize})
		if err != nil {
			return err
		}
		for a.Len() < total {
			if err := a.Grow(ChunkSize); err != nil {
				return errors.CombineErrors(err, a.Close())
			}
		}
		*into += time.Since(t0)
		return a.Close()
	}
	viaAppend := func(into *time.Duration) error {
		t0 := time.Now()
		var b []byte
		for uint64(len(b)) < total {
			b = append(b, make([]byte, ChunkSize)...)
		}
		*into += time.Since(t0)
		runtime.KeepAlive(b)
		b = nil
		runtime.GC()
		return nil
	}
	return alternate(more, 1, viaArena, viaAppend, nil)
}

// allocBatch is how many alloc+free pairs one timed stretch holds: long
// enough that reading the clock costs nothing beside them.
const allocBatch = 256

// AllocFree times alloc+free pairs, allocBatch a round, on an Allocator holding live
// allocations of mixed sizes (32 B to 4 KiB, about 870 B on average): each
// pair allocates a fresh block and frees a live one picked at random, so
// the allocator stays at live allocations and its free space stays
// fragmented. Sim driver (no memory behind it), 1 TiB device. Bare is the
// same pattern with make([]byte) held in a slice, the replaced one dropped
// for Go's GC: only a reference point — Go's allocator hands out host heap
// that it zeroes and collects, not device memory, and keeps no device
// bookkeeping. LibAllocs counts the Go allocations of a further allocBatch
// pairs, run untimed.
func AllocFree(more func() bool, live int) (p Pair, err error) {
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: units.TiB})
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	al, err := arena.NewAllocator(vaspace.New(drv), physical.New(drv), arena.AllocatorOptions{Max: units.TiB})
	if err != nil {
		return Pair{}, err
	}
	defer func() { err = errors.CombineErrors(err, al.Close()) }()

	// One cycle of (slot, size) steps, shared by both sides.
	rng := rand.New(rand.NewPCG(3, uint64(live)))
	size := func() uint64 {
		e := 5 + rng.IntN(7)
		return 1<<e + rng.Uint64N(1<<e)
	}
	const cycle = 1 << 16
	slots, sizes := make([]int, cycle), make([]uint64, cycle)
	for i := range cycle {
		slots[i], sizes[i] = rng.IntN(live), size()
	}
	ptrs := make([]driver.Addr, live)
	bufs := make([][]byte, live)
	for i := range live {
		s := size()
		if ptrs[i], err = al.Alloc(s, 0); err != nil {
			return Pair{}, err
		}
		bufs[i] = make([]byte, s)
	}

	step := 0
	viaAllocator := func(k int, into *time.Duration) error {
		t0 := time.Now()
		for j := range k {
			c := (step + j) % cycle
			q, err := al.Alloc(sizes[c], 0)
			if err != nil {
				return err
			}
			if err := al.Free(ptrs[slots[c]]); err != nil {
				return err
			}
			ptrs[slots[c]] = q
		}
		*into += time.Since(t0)
		return nil
	}
	viaMake := func(k int, into *time.Duration) error {
		t0 := time.Now()
		for j := range k {
			c := (step + j) % cycle
			bufs[slots[c]] = make([]byte, sizes[c])
		}
		*into += time.Since(t0)
		return nil
	}
	p, err = alternate(more, allocBatch,
		func(d *time.Duration) error { return viaAllocator(allocBatch, d) },
		func(d *time.Duration) error { return viaMake(allocBatch, d) },
		func() error { step += allocBatch; return nil })
	if err != nil {
		return p, err
	}
	runtime.KeepAlive(bufs)
	c := step
	if p.LibAllocs, err = allocsPer(allocBatch, func() error {
		c = (c + 1) % cycle
		q, err := al.Alloc(sizes[c], 0)
		if err != nil {
			return err
		}
		err = al.Free(ptrs[slots[c]])
		ptrs[slots[c]] = q
		return err
	}); err != nil {
		return p, err
	}
	if st := al.Stats(); st.Live != live {
		return p, errors.AssertionFailedf("bench: %d live allocations after the pairs, %d expected", st.Live, live)
	}
	if err := al.Check(); err != nil {
		return p, err
	}
	for _, q := range ptrs { // the allocator refuses to close over live allocations
		if err := al.Free(q); err != nil {
			return p, err
		}
	}
	return p, nil
}

// MissSpan is the memory MissLatency walks in the benchmark: far more than
// any cache, and more pages than the TLB covers.
const MissSpan = 128 * units.MiB

// MissLatency is the mean time of a load that misses every cache (and
// mostly the TLB) on this machine: loads that each depend on the one
// before, along one random cycle through span bytes of uint32 links
// (Sattolo's shuffle, so the walk visits every link before it repeats);
// the benchmark walks MissSpan, a test a small span whose loads hit. It
// is AllocFree's floor at 1 M live allocations: a free of a random one of
// them reads that allocation's record, which no cache holds, before it
// can do anything else.
func MissLatency(span uint64, loads int) time.Duration {
	next, p := cachemiss.Cycle(span)
	t0 := time.Now()
	p = cachemiss.Walk(next, p, loads)
	d := time.Since(t0)
	runtime.KeepAlive(p)
	return d / time.Duration(max(loads, 1))
}
