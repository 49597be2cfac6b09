package bench

import (
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// The stream-ordered pool benchmarks. Like the arena benchmarks they run
// rounds until more returns false (b.Loop in a benchmark, Rounds(n) in
// tests) and time only the operation named, with the baselines in the
// same loop.

// PoolPairs are the times of N alloc+free pairs made three ways in one
// loop: through a stream-ordered Pool (MallocAsync + FreeAsync), through a
// synchronous Allocator (Alloc + Free), and with Go's make.
type PoolPairs struct {
	N                 int
	Pool, Alloc, Make time.Duration
}

// PoolAllocFree times alloc+free pairs, allocBatch a round, with live
// allocations of mixed sizes (256 B to 64 KiB, log-uniform) held on each
// side: each pair allocates a fresh block and frees a live one picked at
// random, as AllocFree does. The pool's pairs are spread round-robin over
// streams streams of one device, each pair's MallocAsync and FreeAsync on
// the same stream (freeing there a block allocated on another stream is
// what makes memory cross streams); the pool keeps its default reuse
// policies (all on) and a release threshold of MaxUint64, so freed memory
// stays pooled as serving engines configure it. Every stream is
// synchronized after each round, untimed, so their queues of recorded
// events stay short and frees complete as they would on a running device.
//
// Sim driver (no memory behind it, 1 TiB device): the figures are the
// bookkeeping — the pool's pending list, its events and the stream
// engine's queues — not memory traffic. Alloc is an Allocator of the same
// driver on its own arena; Make is make([]byte) held in a slice, the
// replaced one dropped for Go's GC: a reference point only (host heap that
// Go zeroes and collects, not device memory).
func PoolAllocFree(more func() bool, streams, live int) (p PoolPairs, err error) {
	if streams < 1 || live < 1 {
		return p, errors.Newf("bench: pool alloc+free over %d streams with %d live: need at least one of each", streams, live)
	}
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: units.TiB})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	space, mem := vaspace.New(drv), physical.New(drv)
	pl, err := pool.New(space, mem, pool.Props{})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, pl.Destroy()) }()
	if err := pl.SetAttribute(pool.ReleaseThreshold, math.MaxUint64); err != nil {
		return p, err
	}
	ss := make([]*stream.Stream, streams)
	for i := range ss {
		if ss[i], err = stream.New(drv, 0); err != nil {
			return p, err
		}
		defer func(s *stream.Stream) { err = errors.CombineErrors(err, s.Destroy()) }(ss[i])
	}
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Max: units.TiB})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, al.Close()) }()

	// One cycle of (slot, size) steps, shared by the three sides.
	rng := rand.New(rand.NewPCG(5, uint64(live)))
	size := func() uint64 {
		e := 8 + rng.IntN(8) // [2^e, 2^(e+1)): 256 B to 64 KiB
		return 1<<e + rng.Uint64N(1<<e)
	}
	const cycle = 1 << 16
	slots, sizes := make([]int, cycle), make([]uint64, cycle)
	for i := range cycle {
		slots[i], sizes[i] = rng.IntN(live), size()
	}
	poolPtrs := make([]driver.Addr, live)
	alPtrs := make([]driver.Addr, live)
	bufs := make([][]byte, live)
	for i := range live {
		s := size()
		if poolPtrs[i], err = pl.MallocAsync(s, ss[i%streams]); err != nil {
			return p, err
		}
		if alPtrs[i], err = al.Alloc(s, 0); err != nil {
			return p, err
		}
		bufs[i] = make([]byte, s)
	}
	// Whatever happens, give every live block back: neither the pool nor
	// the allocator closes over live allocations.
	defer func() {
		for i := range live {
			if poolPtrs[i] != 0 {
				err = errors.CombineErrors(err, pl.FreeAsync(poolPtrs[i], ss[i%streams]))
			}
			if alPtrs[i] != 0 {
				err = errors.CombineErrors(err, al.Free(alPtrs[i]))
			}
		}
		for _, s := range ss {
			err = errors.CombineErrors(err, s.Synchronize())
		}
		err = errors.CombineErrors(err, pl.Check())
	}()

	step := 0
	viaPool := func(k int, into *time.Duration) error {
		t0 := time.Now()
		for j := range k {
			c := (step + j) % cycle
			s := ss[(step+j)%streams]
			q, err := pl.MallocAsync(sizes[c], s)
			if err != nil {
				return err
			}
			old := poolPtrs[slots[c]]
			poolPtrs[slots[c]] = q
			if err := pl.FreeAsync(old, s); err != nil {
				return err
			}
		}
		*into += time.Since(t0)
		return nil
	}
	viaAllocator := func(k int, into *time.Duration) error {
		t0 := time.Now()
		for j := range k {
			c := (step + j) % cycle
			q, err := al.Alloc(sizes[c], 0)
			if err != nil {
				return err
			}
			old := alPtrs[slots[c]]
			alPtrs[slots[c]] = q
			if err := al.Free(old); err != nil {
				return err
			}
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
	type side struct {
		run  func(int, *time.Duration) error
		into *time.Duration
	}
	sides := []side{{viaPool, &p.Pool}, {viaAllocator, &p.Alloc}, {viaMake, &p.Make}}
	for i := 0; more(); i++ {
		k := allocBatch
		p.N += k
		for j := range sides { // rotate which side goes first
			sd := sides[(i+j)%len(sides)]
			if err := sd.run(k, sd.into); err != nil {
				return p, err
			}
		}
		step += k
		for _, s := range ss {
			if err := s.Synchronize(); err != nil {
				return p, err
			}
		}
	}
	runtime.KeepAlive(bufs)
	if used, err := pl.Attribute(pool.UsedMemCurrent); err != nil {
		return p, err
	} else if st := al.Stats(); used != st.Allocated || st.Live != live {
		return p, errors.AssertionFailedf("bench: after the pairs the pool holds %d bytes live, the allocator %d bytes in %d allocations (%d expected)",
			used, st.Allocated, st.Live, live)
	}
	return p, errors.CombineErrors(pl.Check(), al.Check())
}

// PoolRelease times getting memory back from a pool that holds more than
// its release threshold. Each round the pool allocates total bytes in
// ChunkSize blocks on one stream and frees them there (untimed: reserved
// memory is now above the threshold), then the stream's Synchronize —
// which waits for the frees and runs the pool's release, giving the freed
// blocks to its allocator and unmapping its tail down to the threshold —
// is timed as Lib, and ReservedMemCurrent must have fallen to the
// threshold or below. Bare is the same amount released directly: an
// Allocator of the same driver and chunk size holding the same blocks,
// timed over their Frees and TrimTo(threshold). Host driver: the unmaps
// and punched holes are real; both sides commit total bytes a round
// (untimed, with page tables populated).
func PoolRelease(more func() bool, total, threshold uint64) (p Pair, err error) {
	if total%ChunkSize != 0 || total <= threshold {
		return p, errors.Newf("bench: pool release of %s above a threshold of %s: need a multiple of %s above the threshold",
			units.Bytes(total), units.Bytes(threshold), units.Bytes(ChunkSize))
	}
	// Each side's arena may grow past total by one growth step (MinGrow,
	// five chunks by default).
	drv, err := host.New(host.Options{Devices: 1, Capacity: 2 * (total + 8*ChunkSize), Granularity: ChunkSize})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	space, mem := vaspace.New(drv), physical.New(drv)
	pl, err := pool.New(space, mem, pool.Props{MaxSize: total + 8*ChunkSize, ChunkSize: ChunkSize})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, pl.Destroy()) }()
	if err := pl.SetAttribute(pool.ReleaseThreshold, threshold); err != nil {
		return p, err
	}
	s, err := stream.New(drv, 0)
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, s.Destroy()) }()
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Max: total + 8*ChunkSize, ChunkSize: ChunkSize})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, al.Close()) }()

	blocks := make([]driver.Addr, total/ChunkSize)
	viaPool := func(into *time.Duration) error {
		for i := range blocks {
			q, err := pl.MallocAsync(ChunkSize, s)
			if err != nil {
				return err
			}
			blocks[i] = q
		}
		for _, q := range blocks {
			if err := pl.FreeAsync(q, s); err != nil {
				return err
			}
		}
		before, err := pl.Attribute(pool.ReservedMemCurrent)
		if err != nil {
			return err
		}
		if before < total {
			return errors.AssertionFailedf("bench: the pool reserves %s before the release, %s allocated", units.Bytes(before), units.Bytes(total))
		}
		t0 := time.Now()
		err = s.Synchronize()
		*into += time.Since(t0)
		if err != nil {
			return err
		}
		after, err := pl.Attribute(pool.ReservedMemCurrent)
		if err != nil {
			return err
		}
		if after > threshold {
			return errors.AssertionFailedf("bench: the pool still reserves %s after the synchronize, above its threshold %s (%s before)",
				units.Bytes(after), units.Bytes(threshold), units.Bytes(before))
		}
		return nil
	}
	viaAllocator := func(into *time.Duration) error {
		for i := range blocks {
			q, err := al.Alloc(ChunkSize, 0)
			if err != nil {
				return err
			}
			blocks[i] = q
		}
		t0 := time.Now()
		for _, q := range blocks {
			if err := al.Free(q); err != nil {
				return err
			}
		}
		err := al.TrimTo(threshold)
		*into += time.Since(t0)
		if err != nil {
			return err
		}
		if c := al.Stats().Committed; c > threshold {
			return errors.AssertionFailedf("bench: the allocator still commits %s after TrimTo(%s)", units.Bytes(c), units.Bytes(threshold))
		}
		return nil
	}
	p, err = alternate(more, 1, viaPool, viaAllocator, nil)
	if err != nil {
		return p, err
	}
	return p, errors.CombineErrors(pl.Check(), al.Check())
}
