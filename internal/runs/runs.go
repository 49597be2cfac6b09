// Package runs keeps a value per unit of a fixed-length sequence —
// the access rights of each granule of a mapping — run-length: runs of
// units that hold the same value. Access granted over a whole mapping,
// the common case, is one run whatever the mapping's size, so mapping,
// granting, sharing and checking a range cost the runs it crosses, not its
// granules: a 1 GiB share does the bookkeeping of a 2 MiB one.
//
// A List is not safe for concurrent use; its owner locks it. It never
// holds more runs than there are changes of value along the sequence.
package runs

import (
	"slices"
	"sort"

	"github.com/vmarena/vmarena/internal/errors"
)

// List is n units, each holding a W. A list that has only ever been one
// run keeps its value in one, with runs nil, so that making a list — one
// a mapping — allocates nothing. Once a Set splits it, runs holds every
// run and one is unused. Invariants (checked by Check): n >= 1; runs is
// nil, or it is non-empty, starts at unit 0, its starts increase and lie
// below n, and no two neighbours hold the same value.
type List[W comparable] struct {
	runs []run[W]
	one  W
	n    uint64
}

// run is units [start, the next run's start, or n) holding w.
type run[W comparable] struct {
	start uint64
	w     W
}

// New is n units (n >= 1) holding W's zero value. It allocates nothing.
func New[W comparable](n uint64) List[W] {
	return List[W]{n: n}
}

// Len is the number of units.
func (l *List[W]) Len() uint64 { return l.n }

// Runs is the number of runs.
func (l *List[W]) Runs() int {
	if l.runs == nil {
		return 1
	}
	return len(l.runs)
}

// end is where run i ends.
func (l *List[W]) end(i int) uint64 {
	if i+1 < len(l.runs) {
		return l.runs[i+1].start
	}
	return l.n
}

// find is the index of the run holding unit u (< n); runs is not nil.
func (l *List[W]) find(u uint64) int {
	return sort.Search(len(l.runs), func(i int) bool { return l.runs[i].start > u }) - 1
}

// At is the value of unit u (< Len).
func (l *List[W]) At(u uint64) W {
	if l.runs == nil {
		return l.one
	}
	return l.runs[l.find(u)].w
}

// Each calls fn with the runs over units [lo, hi) (lo < hi <= Len),
// clipped to it, in order, stopping at the first error.
func (l *List[W]) Each(lo, hi uint64, fn func(u0, u1 uint64, w W) error) error {
	if l.runs == nil {
		return fn(lo, hi, l.one)
	}
	for i := l.find(lo); i < len(l.runs) && l.runs[i].start < hi; i++ {
		if err := fn(max(lo, l.runs[i].start), min(hi, l.end(i)), l.runs[i].w); err != nil {
			return err
		}
	}
	return nil
}

// Set replaces the value w of every unit in [lo, hi) (lo < hi <= Len) by
// f(w), merging neighbours that end up equal. f is called once a run. It
// works in place: it allocates only when a split needs more room than the
// list has had, so setting a whole run — access granted over a whole
// mapping — allocates nothing.
func (l *List[W]) Set(lo, hi uint64, f func(w W) W) {
	if l.runs == nil {
		if lo == 0 && hi == l.n {
			l.one = f(l.one)
			return
		}
		l.runs = append(make([]run[W], 0, 3), run[W]{0, l.one}) // a split in the middle makes three
	}
	i := l.find(lo)
	if l.runs[i].start < lo { // split at lo
		l.runs = slices.Insert(l.runs, i+1, run[W]{lo, l.runs[i].w})
		i++
	}
	j := l.find(hi - 1)
	if hi < l.end(j) { // split at hi
		l.runs = slices.Insert(l.runs, j+1, run[W]{hi, l.runs[j].w})
	}
	for k := i; k <= j; k++ {
		l.runs[k].w = f(l.runs[k].w)
	}
	// Merge equal neighbours, from the run before i to the run after j.
	from, to := max(i, 1), min(j+2, len(l.runs))
	out := from
	for k := from; k < to; k++ {
		if l.runs[k].w == l.runs[out-1].w {
			continue
		}
		l.runs[out] = l.runs[k]
		out++
	}
	if out < to {
		l.runs = append(l.runs[:out], l.runs[to:]...)
	}
}

// Check verifies the invariants in the type's doc.
func (l *List[W]) Check() error {
	if l.n == 0 {
		return errors.AssertionFailedf("runs: a list of 0 units")
	}
	if l.runs == nil {
		return nil
	}
	if len(l.runs) == 0 || l.runs[0].start != 0 {
		return errors.AssertionFailedf("runs: %d runs over %d units do not start at unit 0", len(l.runs), l.n)
	}
	for i := 1; i < len(l.runs); i++ {
		if l.runs[i].start <= l.runs[i-1].start || l.runs[i].start >= l.n {
			return errors.AssertionFailedf("runs: run %d starts at %d, after %d, of %d units", i, l.runs[i].start, l.runs[i-1].start, l.n)
		}
		if l.runs[i].w == l.runs[i-1].w {
			return errors.AssertionFailedf("runs: runs %d and %d hold the same value %v", i-1, i, l.runs[i].w)
		}
	}
	return nil
}
