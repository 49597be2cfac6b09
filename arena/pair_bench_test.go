package arena

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/cachemiss"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// pairSpan is the memory the cache-miss floor walks: far more than any
// cache, and more pages than the TLB covers.
const pairSpan = 128 * units.MiB

// BenchmarkAllocFreePair times the allocator's fast path: an Alloc that a
// free block serves and the Free of a live allocation picked at random,
// with 1K and 1M allocations of 32 B to 4 KiB live (the mix of
// bench.AllocFree), on the sim driver. It reports, from one run, the pair
// in wall and in thread CPU time (the goroutine locked to its thread, so
// the thread clock counts its work alone, not what other processes take
// of a shared machine), and the floor it is read against: a load that
// misses every cache (internal/cachemiss's pointer chase over 128 MiB),
// by both clocks, and the pair over that floor by the thread clock. A
// free of a random one of a million allocations reads records no cache
// holds; the target is at most twice the floor there, and 150 ns at 1K.
func BenchmarkAllocFreePair(b *testing.B) {
	for _, live := range []int{1000, 1_000_000} {
		name := "1K"
		if live == 1_000_000 {
			name = "1M"
		}
		b.Run(name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			pb, err := newPairBench(live)
			if err != nil {
				b.Fatal(err)
			}
			defer pb.close(b)
			next, p := cachemiss.Cycle(pairSpan)
			var wall, cpu, missWall, missCPU time.Duration
			pairs, loads := 0, 0
			const batch = 4096
			for b.Loop() {
				w0, c0 := time.Now(), threadClock()
				if err := pb.pairs(batch); err != nil {
					b.Fatal(err)
				}
				wall += time.Since(w0)
				cpu += threadClock() - c0
				pairs += batch
				// The floor, interleaved with the pairs so that both see
				// the same machine.
				w0, c0 = time.Now(), threadClock()
				p = cachemiss.Walk(next, p, batch)
				missWall += time.Since(w0)
				missCPU += threadClock() - c0
				loads += batch
			}
			runtime.KeepAlive(p)
			ns := func(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(max(n, 1)) }
			b.ReportMetric(ns(wall, pairs), "wall-ns/pair")
			b.ReportMetric(ns(cpu, pairs), "cpu-ns/pair")
			b.ReportMetric(ns(missWall, loads), "miss-wall-ns")
			b.ReportMetric(ns(missCPU, loads), "miss-cpu-ns")
			b.ReportMetric(ns(cpu, pairs)/max(ns(missCPU, loads), 1e-9), "pair/miss")
			b.ReportMetric(0, "ns/op") // includes filling to live allocations
		})
	}
}

// pairBench is an allocator at a fixed number of live allocations and the
// cycle of (slot, size) steps its pairs take.
type pairBench struct {
	drv   *sim.Driver
	al    *Allocator
	ptrs  []driver.Addr
	slots []int32
	sizes []uint32
	step  int
}

func newPairBench(live int) (*pairBench, error) {
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: units.TiB})
	if err != nil {
		return nil, err
	}
	al, err := NewAllocator(vaspace.New(drv), physical.New(drv), AllocatorOptions{Max: units.TiB})
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(3, uint64(live)))
	size := func() uint64 { e := 5 + rng.IntN(7); return 1<<e + rng.Uint64N(1<<e) }
	const cycle = 1 << 16
	pb := &pairBench{drv: drv, al: al, ptrs: make([]driver.Addr, live), slots: make([]int32, cycle), sizes: make([]uint32, cycle)}
	for i := range cycle {
		pb.slots[i], pb.sizes[i] = int32(rng.IntN(live)), uint32(size())
	}
	for i := range live {
		if pb.ptrs[i], err = al.Alloc(size(), 0); err != nil {
			return nil, err
		}
	}
	// Warm: the slab, the index and the committed memory reach their size.
	return pb, pb.pairs(4 * cycle)
}

// pairs makes n alloc+free pairs.
func (pb *pairBench) pairs(n int) error {
	for range n {
		c := pb.step % len(pb.slots)
		pb.step++
		q, err := pb.al.Alloc(uint64(pb.sizes[c]), 0)
		if err != nil {
			return err
		}
		if err := pb.al.Free(pb.ptrs[pb.slots[c]]); err != nil {
			return err
		}
		pb.ptrs[pb.slots[c]] = q
	}
	return nil
}

func (pb *pairBench) close(b testing.TB) {
	if err := pb.al.Check(); err != nil {
		b.Error(err)
	}
	for _, p := range pb.ptrs {
		if err := pb.al.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	if err := pb.al.Close(); err != nil {
		b.Error(err)
	}
	if err := pb.drv.Close(); err != nil {
		b.Error(err)
	}
}

// TestAllocFreePairBody runs the pair benchmark's body small, so that a
// broken benchmark fails the tests rather than the next measurement.
func TestAllocFreePairBody(t *testing.T) {
	pb, err := newPairBench(300)
	if err != nil {
		t.Fatal(err)
	}
	if err := pb.pairs(1000); err != nil {
		t.Fatal(err)
	}
	if st := pb.al.Stats(); st.Live != 300 {
		t.Fatalf("%d live after the pairs, want 300", st.Live)
	}
	pb.close(t)
}
