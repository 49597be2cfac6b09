package metrics

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/pool"
)

// poolStats are a pool's attributes that are figures, read one by one.
type poolStats struct {
	reserved, reservedHigh, used, usedHigh, threshold uint64
}

// NewPoolCollector makes the collector of the stream-ordered pool p, whose
// series carry the label name="name": vmarena_pool_*, the pool's memory
// attributes (cudaMemPoolAttr's reserved and used memory, current and
// high, and its release threshold). A nil pool and one not made by
// pool.New or pool.Default are refused (ErrInvalid). A pool has no
// accessor that says it is destroyed: a destroyed pool's collector goes on
// sending what its attributes read, no memory reserved or used.
func NewPoolCollector(name string, p *pool.Pool) (*Collector, error) {
	what := func() string { return "metrics: new pool collector" }
	if err := checkName(what, name); err != nil {
		return nil, err
	}
	switch {
	case p == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: the pool is nil", what(), name)
	case p.Max() == 0:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s %q: not a pool made by pool.New or pool.Default", what(), name)
	}
	limit := float64(p.Props().MaxSize)
	type st = poolStats
	b := func(n uint64) float64 { return float64(n) }
	figs := []figure[st]{
		gauge("max_bytes", "The most memory the pool may reserve.",
			func(*st) float64 { return limit }),
		gauge("reserved_bytes", "Memory the pool holds from the device (cudaMemPoolAttrReservedMemCurrent).",
			func(s *st) float64 { return b(s.reserved) }),
		gauge("peak_reserved_bytes", "The most reserved_bytes has been since the mark was last reset (cudaMemPoolAttrReservedMemHigh).",
			func(s *st) float64 { return b(s.reservedHigh) }),
		gauge("used_bytes", "Memory of live allocations, as asked for (cudaMemPoolAttrUsedMemCurrent).",
			func(s *st) float64 { return b(s.used) }),
		gauge("peak_used_bytes", "The most used_bytes has been since the mark was last reset (cudaMemPoolAttrUsedMemHigh).",
			func(s *st) float64 { return b(s.usedHigh) }),
		gauge("release_threshold_bytes", "Memory the pool may keep reserved beyond what is used when a stream synchronizes.",
			func(s *st) float64 { return b(s.threshold) }),
	}
	read := func() (poolStats, error) {
		var s poolStats
		var errs error
		for _, a := range []struct {
			attr pool.Attr
			to   *uint64
		}{
			{pool.ReservedMemCurrent, &s.reserved}, {pool.ReservedMemHigh, &s.reservedHigh},
			{pool.UsedMemCurrent, &s.used}, {pool.UsedMemHigh, &s.usedHigh},
			{pool.ReleaseThreshold, &s.threshold},
		} {
			var err error
			*a.to, err = p.Attribute(a.attr)
			errs = errors.CombineErrors(errs, err)
		}
		return s, errs
	}
	return newCollector("pool", name, figs, func() bool { return false }, read)
}
