// Package series keeps a long series of samples as few enough points to
// draw, with every peak and trough intact. It owns no drawing; it never
// holds more than its limit of points, however long the series runs.
//
// The samples fall into buckets of consecutive samples; each bucket keeps
// its lowest and its highest sample, and when the buckets are all used
// neighbours merge in pairs (each bucket then covers twice as many
// samples). The first and the last sample are always kept, so a line
// drawn through the points starts and ends where the series does and
// reaches its maximum and minimum.
package series

// Thinned is a series of (x, y) samples, x never decreasing, kept as at
// most Max points. A series of at most Max/2 samples is kept whole. The
// zero value is not usable: make one with New.
type Thinned struct {
	max     int
	width   int      // samples a bucket covers
	buckets []bucket // full buckets, in sample order: at most max/2-1
	open    bucket   // the bucket being filled
	first   sample
	last    sample
	n       int // samples added
}

// sample is the i-th sample added.
type sample struct {
	i    int
	x, y float64
}

// bucket is a run of consecutive samples: n of them, lo the lowest (the
// earliest of equals) and hi the highest.
type bucket struct {
	lo, hi sample
	n      int
}

func (b *bucket) add(s sample) {
	if b.n == 0 || s.y < b.lo.y {
		b.lo = s
	}
	if b.n == 0 || s.y > b.hi.y {
		b.hi = s
	}
	b.n++
}

func (b *bucket) merge(o bucket) {
	if o.lo.y < b.lo.y {
		b.lo = o.lo
	}
	if o.hi.y > b.hi.y {
		b.hi = o.hi
	}
	b.n += o.n
}

// MinPoints is the smallest limit New accepts.
const MinPoints = 6

// New returns an empty series of at most max points (at least MinPoints;
// a smaller max is taken as MinPoints).
func New(max int) *Thinned {
	max = maxInt(max, MinPoints)
	return &Thinned{max: max, width: 1, buckets: make([]bucket, 0, max/2-1)}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// Add appends a sample.
func (t *Thinned) Add(x, y float64) {
	s := sample{i: t.n, x: x, y: y}
	if t.n == 0 {
		t.first = s
	}
	t.last = s
	t.n++
	t.open.add(s)
	if t.open.n < t.width {
		return
	}
	t.buckets = append(t.buckets, t.open)
	t.open = bucket{}
	if len(t.buckets) < cap(t.buckets) {
		return
	}
	// Merge neighbours in pairs; an odd last bucket stays as it is.
	k := 0
	for i := 0; i < len(t.buckets); i += 2 {
		b := t.buckets[i]
		if i+1 < len(t.buckets) {
			b.merge(t.buckets[i+1])
		}
		t.buckets[k] = b
		k++
	}
	t.buckets = t.buckets[:k]
	t.width *= 2
}

// Len is the number of samples added.
func (t *Thinned) Len() int { return t.n }

// Points returns the kept samples in the order they were added: the
// first, each bucket's lowest and highest, the last; at most Max.
func (t *Thinned) Points() (xs, ys []float64) {
	if t.n == 0 {
		return nil, nil
	}
	xs, ys = make([]float64, 0, t.max), make([]float64, 0, t.max)
	prev := -1
	keep := func(s sample) {
		if s.i > prev {
			xs, ys = append(xs, s.x), append(ys, s.y)
			prev = s.i
		}
	}
	keep(t.first)
	each := func(b bucket) {
		if b.lo.i <= b.hi.i {
			keep(b.lo)
			keep(b.hi)
		} else {
			keep(b.hi)
			keep(b.lo)
		}
	}
	for _, b := range t.buckets {
		each(b)
	}
	if t.open.n > 0 {
		each(t.open)
	}
	keep(t.last)
	return xs, ys
}

// Series is a recorded series: Y[i] at X[i], X never decreasing; replay
// and serving hand it out as their Series.
type Series struct {
	X, Y []float64
}

// Series returns the kept samples (Points) as a Series.
func (t *Thinned) Series() Series {
	x, y := t.Points()
	return Series{X: x, Y: y}
}

// Thin returns the series (xs[i], ys[i]) as at most max points, as
// Thinned keeps them; a series of at most max points comes back as it is.
// xs and ys must have the same length.
func Thin(xs, ys []float64, max int) ([]float64, []float64) {
	if len(xs) <= maxInt(max, MinPoints) {
		return xs, ys
	}
	t := New(max)
	for i := range xs {
		t.Add(xs[i], ys[i])
	}
	return t.Points()
}
