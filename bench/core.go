// Package bench measures vmarena against baselines run in the same process:
// each benchmark times the library's operation and the bare system calls
// that do the same work, interleaved in one loop (alternating which runs
// first, so neither always meets a warm cache), and reports both and their
// ratio. Figures are never asserted: the machines are shared and noisy.
//
// The baselines make memory system calls directly; that is their point.
// Nothing else outside driver/ does.
package bench

import (
	"runtime"
	"time"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// ChunkSize is the chunk the core benchmarks move: the usual GPU granularity.
const ChunkSize = 2 * units.MiB

// Pair is the time the library and the bare baseline took over n rounds.
// LibAllocs, where a benchmark measures it, is the Go heap allocations one
// operation of the library side makes, counted over a stretch of them run
// apart from the timing.
type Pair struct {
	N         int
	Lib, Bare time.Duration
	LibAllocs float64
}

// allocsPer is the Go heap allocations per call of n calls of fn (of the
// whole process: run it where nothing else allocates).
func allocsPer(n int, fn func() error) (float64, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

// Ratio is library time over baseline time.
func (p Pair) Ratio() float64 { return float64(p.Lib) / float64(p.Bare) }

// interleave runs lib and bare n times each, alternating which goes first.
func interleave(n int, lib, bare func() error) (Pair, error) {
	p := Pair{N: n}
	for i := 0; i < n; i++ {
		first, second := lib, bare
		firstT, secondT := &p.Lib, &p.Bare
		if i%2 == 1 {
			first, second, firstT, secondT = bare, lib, &p.Bare, &p.Lib
		}
		t0 := time.Now()
		if err := first(); err != nil {
			return p, err
		}
		t1 := time.Now()
		if err := second(); err != nil {
			return p, err
		}
		t2 := time.Now()
		*firstT += t1.Sub(t0)
		*secondT += t2.Sub(t1)
	}
	return p, nil
}

// alternate runs rounds while more() says so: lib and bare once each, timing
// themselves into the Pair, alternating which goes first so neither always
// meets a warm cache; then after (untimed, when not nil). Each round counts
// n operations.
func alternate(more func() bool, n int, lib, bare func(*time.Duration) error, after func() error) (Pair, error) {
	var p Pair
	for i := 0; more(); i++ {
		p.N += n
		first, second, firstT, secondT := lib, bare, &p.Lib, &p.Bare
		if i%2 == 1 {
			first, second, firstT, secondT = bare, lib, &p.Bare, &p.Lib
		}
		if err := first(firstT); err != nil {
			return p, err
		}
		if err := second(secondT); err != nil {
			return p, err
		}
		if after != nil {
			if err := after(); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

// MapAccessUnmap times mapping a committed 2 MiB chunk, granting one device
// read-write access, and unmapping it: through mapping.Table on the host
// driver, and as the same system calls made bare (mmap MAP_FIXED of the
// memfd, mprotect, madvise populate when populate is on, mmap MAP_FIXED of
// anonymous PROT_NONE to re-reserve).
func MapAccessUnmap(n int, populate bool) (Pair, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: ChunkSize, Granularity: ChunkSize, NoPopulate: !populate})
	if err != nil {
		return Pair{}, err
	}
	defer drv.Close()
	res, err := vaspace.New(drv).Reserve(ChunkSize, 0)
	if err != nil {
		return Pair{}, err
	}
	mem := physical.New(drv)
	tab, err := mapping.New(res, mem)
	if err != nil {
		return Pair{}, err
	}
	c, err := mem.Create(0, ChunkSize, driver.ChunkOptions{})
	if err != nil {
		return Pair{}, err
	}
	bare, err := newBareRegion(ChunkSize)
	if err != nil {
		return Pair{}, err
	}
	defer bare.close()
	if err := bare.commit(); err != nil {
		return Pair{}, err
	}
	lib := func() error {
		if err := tab.Map(res.Base(), c); err != nil {
			return err
		}
		if err := tab.SetAccess(res.Base(), ChunkSize, 0, driver.AccessReadWrite); err != nil {
			return err
		}
		return tab.Unmap(res.Base())
	}
	bareOp := func() error { return bare.mapAccessUnmap(populate) }
	return interleave(n, lib, bareOp)
}

// CreateRelease times committing and returning a 2 MiB chunk: through
// physical.Memory on the host driver, and as bare fallocate plus
// fallocate(PUNCH_HOLE) on a memfd.
func CreateRelease(n int) (Pair, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: ChunkSize, Granularity: ChunkSize})
	if err != nil {
		return Pair{}, err
	}
	defer drv.Close()
	mem := physical.New(drv)
	bare, err := newBareRegion(ChunkSize)
	if err != nil {
		return Pair{}, err
	}
	defer bare.close()
	lib := func() error {
		c, err := mem.Create(0, ChunkSize, driver.ChunkOptions{})
		if err != nil {
			return err
		}
		return c.Release()
	}
	bareOp := func() error { return bare.commitPunch() }
	return interleave(n, lib, bareOp)
}

// ReserveFree times reserving and freeing size bytes of address space:
// through vaspace on the host driver, and as bare mmap(PROT_NONE,
// MAP_NORESERVE) plus munmap.
func ReserveFree(n int, size uint64) (Pair, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: ChunkSize, Granularity: ChunkSize})
	if err != nil {
		return Pair{}, err
	}
	defer drv.Close()
	space := vaspace.New(drv)
	lib := func() error {
		r, err := space.Reserve(size, 0)
		if err != nil {
			return err
		}
		return r.Free()
	}
	bareOp := func() error { return bareReserveFree(size) }
	return interleave(n, lib, bareOp)
}
