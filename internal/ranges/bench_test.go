package ranges

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/vmarena/vmarena/internal/cachemiss"
)

// benchSizes are the list sizes the benchmarks compare: a thousand ranges
// fit the caches, a million do not, so the second descends cold nodes.
var benchSizes = [...]int{1_000, 1_000_000}

// benchList returns a list of n unit ranges [2i, 2i+1), built once.
func benchList(n int) *List[uint64, *int] {
	if l := benchLists[n]; l != nil {
		return l
	}
	l := &List[uint64, *int]{}
	v := new(int)
	for i := range n {
		x := uint64(i) * 7919 % uint64(n) // out of order, as books fill
		l.Add(2*x, 2*x+1, v)
	}
	benchLists[n] = l
	return l
}

var benchLists = map[int]*List[uint64, *int]{}

// benchRandom times op at random places of a list of each size, b.N times
// each, and reports the CPU time of one at each size and their ratio.
func benchRandom(b *testing.B, op func(l *List[uint64, *int], x uint64)) {
	var ns [len(benchSizes)]float64
	for s, n := range benchSizes {
		l := benchList(n)
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		xs := make([]uint64, 1<<16)
		for i := range xs {
			xs[i] = uint64(rng.IntN(n))
		}
		runtime.LockOSThread() // threadCPU is this thread's
		start := threadCPU()
		for i := range b.N {
			op(l, xs[i&(len(xs)-1)])
		}
		ns[s] = float64((threadCPU() - start).Nanoseconds()) / float64(b.N)
		runtime.UnlockOSThread()
	}
	miss := missNS()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ns[0], "ns@1K")
	b.ReportMetric(ns[1], "ns@1M")
	b.ReportMetric(ns[1]/ns[0], "1M/1K")
	b.ReportMetric(miss, "miss-ns")
	b.ReportMetric((ns[1]-ns[0])/miss, "extra-misses")
}

// missNS is the CPU time of a load that misses the caches and mostly the
// TLB, measured once: loads that each depend on the one before, along one
// random cycle (cachemiss.Cycle) through 64 MiB of uint32 links, as
// bench.MissLatency does. A random operation at a million ranges cannot
// cost less than one such miss more than at a thousand: the range it
// reads is in no cache.
func missNS() float64 {
	if benchMiss > 0 {
		return benchMiss
	}
	next, p := cachemiss.Cycle(64 << 20)
	const loads = 1 << 18
	runtime.LockOSThread()
	start := threadCPU()
	p = cachemiss.Walk(next, p, loads)
	benchMiss = float64((threadCPU() - start).Nanoseconds()) / loads
	runtime.UnlockOSThread()
	runtime.KeepAlive(p)
	return benchMiss
}

var benchMiss float64

// BenchmarkRandom: Get, and DeleteStart then Add back, of one range at a
// random place, at a thousand and at a million ranges.
func BenchmarkRandom(b *testing.B) {
	b.Run("get", func(b *testing.B) {
		benchRandom(b, func(l *List[uint64, *int], x uint64) {
			if l.Get(2*x) == nil {
				b.Fatal("missing", x)
			}
		})
	})
	b.Run("delete-add", func(b *testing.B) {
		benchRandom(b, func(l *List[uint64, *int], x uint64) {
			it, ok := l.DeleteStart(2 * x)
			if !ok {
				b.Fatal("missing", x)
			}
			if _, ok := l.Add(it.Start, it.End, it.Val); !ok {
				b.Fatal("in the way", x)
			}
		})
	})
	b.Run("at", func(b *testing.B) {
		benchRandom(b, func(l *List[uint64, *int], x uint64) {
			if l.At(int(x)).Start != 2*x {
				b.Fatal("misplaced", x)
			}
		})
	})
}
