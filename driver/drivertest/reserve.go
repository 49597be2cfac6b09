package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// span is a live reservation as the tests record it.
type span struct {
	base driver.Addr
	size uint64
}

// requireDisjoint fails the test if any two spans overlap.
func (f *fixture) requireDisjoint(spans []span) {
	f.t.Helper()
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			require.Truef(f.t, at(a.base, a.size) <= b.base || at(b.base, b.size) <= a.base,
				"reservations [%s, +%s) and [%s, +%s) overlap", a.base, units.Bytes(a.size), b.base, units.Bytes(b.size))
		}
	}
}

// reserve checks Reserve: its argument checks, alignment, hints, and that
// reservations never overlap.
func (s suite) reserve(t *testing.T) {
	s.run(t, "ZeroSize", func(f *fixture) {
		_, err := f.d.Reserve(0, 0, 0)
		f.requireIs(err, driver.ErrInvalid)
		f.reserve(f.gran)
	})
	s.run(t, "SizeNotMultipleOfGranularity", func(f *fixture) {
		for _, size := range []uint64{f.gran / 2, f.gran + f.gran/2} {
			_, err := f.d.Reserve(size, 0, 0)
			f.requireIs(err, driver.ErrMisaligned, units.Bytes(f.gran))
		}
		f.reserve(f.gran)
	})
	s.run(t, "AlignNotPowerOfTwo", func(f *fixture) {
		for _, align := range []uint64{3, 3 * f.gran, f.gran + 1} {
			_, err := f.d.Reserve(f.gran, align, 0)
			f.requireIs(err, driver.ErrInvalid)
		}
		f.reserve(f.gran)
	})
	s.run(t, "SmallAlignGivesGranularity", func(f *fixture) {
		var spans []span
		for _, align := range []uint64{0, 1, f.gran / 2} {
			base, err := f.d.Reserve(f.gran, align, 0)
			require.NoError(f.t, err, "reserve with align %d", align)
			require.Zerof(f.t, uint64(base)%f.gran, "align %d gave %s, not a multiple of the granularity %s",
				align, base, units.Bytes(f.gran))
			spans = append(spans, span{base, f.gran})
		}
		f.requireDisjoint(spans)
	})
	s.run(t, "LargeAlignHonoured", func(f *fixture) {
		align := 16 * f.gran
		var spans []span
		for range 3 {
			// A reservation of one granule first, so the next free address
			// is unlikely to be aligned by chance.
			spans = append(spans, span{f.reserve(f.gran), f.gran})
			base, err := f.d.Reserve(2*f.gran, align, 0)
			require.NoError(f.t, err, "reserve aligned to %s", units.Bytes(align))
			require.Zerof(f.t, uint64(base)%align, "reservation at %s is not aligned to %s", base, units.Bytes(align))
			spans = append(spans, span{base, 2 * f.gran})
		}
		f.requireDisjoint(spans)
	})
	s.run(t, "HintMisaligned", func(f *fixture) {
		base := f.reserve(f.gran)
		for _, hint := range []driver.Addr{driver.Addr(f.gran / 2), at(base, f.gran/2)} {
			_, err := f.d.Reserve(f.gran, 0, hint)
			f.requireIs(err, driver.ErrMisaligned, units.Bytes(f.gran))
		}
		// The reservation at base is still whole: a chunk maps there.
		f.mapNew(base, 0, f.gran)
		f.requireNone(base)
	})
	s.run(t, "HintNeverOverlaps", func(f *fixture) {
		live := span{f.reserve(4 * f.gran), 4 * f.gran}
		spans := []span{live}
		// A hint inside a live reservation must be placed elsewhere.
		for _, hint := range []driver.Addr{live.base, at(live.base, f.gran)} {
			base, err := f.d.Reserve(2*f.gran, 0, hint)
			require.NoError(f.t, err, "reserve with hint %s", hint)
			require.Zero(f.t, uint64(base)%f.gran)
			spans = append(spans, span{base, 2 * f.gran})
		}
		// A hint at free space may be honoured or not, but the result is
		// aligned and apart from the rest.
		free := f.unreserved(2 * f.gran)
		base, err := f.d.Reserve(2*f.gran, 0, free)
		require.NoError(f.t, err, "reserve with hint %s", free)
		require.Zero(f.t, uint64(base)%f.gran)
		spans = append(spans, span{base, 2 * f.gran})
		f.requireDisjoint(spans)
	})
	s.run(t, "NoOverlap", func(f *fixture) {
		var spans []span
		for _, n := range []uint64{1, 2, 3, 1, 5, 2} {
			spans = append(spans, span{f.reserve(n * f.gran), n * f.gran})
		}
		// A freed hole is reused without overlapping its neighbours.
		require.NoError(f.t, f.d.Unreserve(spans[2].base, spans[2].size))
		spans = append(spans[:2], spans[3:]...)
		for _, n := range []uint64{1, 2, 3} {
			spans = append(spans, span{f.reserve(n * f.gran), n * f.gran})
		}
		f.requireDisjoint(spans)
	})
	s.run(t, "Large", func(f *fixture) {
		const size = units.TiB
		if size%f.gran != 0 {
			f.t.Skipf("granularity %s does not divide %s", units.Bytes(f.gran), units.Bytes(size))
		}
		base, err := f.d.Reserve(size, 0, 0)
		if errors.Is(err, driver.ErrOutOfMemory) {
			f.t.Skipf("%s cannot reserve %s here: %v", f.d.Name(), units.Bytes(size), err)
		}
		require.NoError(f.t, err, "reserve %s", units.Bytes(size))
		// Its far end is usable.
		last := at(base, size-f.gran)
		f.mapNew(last, 0, f.gran)
		f.requireNone(last)
		f.unmap(last, f.gran)
		require.NoError(f.t, f.d.Unreserve(base, size))
	})
}

// unreserve checks Unreserve: it takes exactly a range Reserve gave, and
// refuses while anything inside is mapped.
func (s suite) unreserve(t *testing.T) {
	s.run(t, "WrongBase", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		for _, a := range []driver.Addr{at(base, f.gran), at(base, f.gran/2)} {
			f.requireIs(f.d.Unreserve(a, f.gran), driver.ErrNotReserved)
			f.requireIs(f.d.Unreserve(a, 2*f.gran), driver.ErrNotReserved)
		}
		// Still reserved whole: both granules take a mapping.
		f.mapNew(base, 0, 2*f.gran)
		f.unmap(base, 2*f.gran)
		require.NoError(f.t, f.d.Unreserve(base, 2*f.gran))
	})
	s.run(t, "WrongSize", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		for _, size := range []uint64{f.gran, 3 * f.gran} {
			f.requireIs(f.d.Unreserve(base, size), driver.ErrNotReserved)
		}
		f.mapNew(base, 0, 2*f.gran)
		f.unmap(base, 2*f.gran)
		require.NoError(f.t, f.d.Unreserve(base, 2*f.gran))
	})
	s.run(t, "Twice", func(f *fixture) {
		base := f.reserve(f.gran)
		require.NoError(f.t, f.d.Unreserve(base, f.gran))
		f.requireIs(f.d.Unreserve(base, f.gran), driver.ErrNotReserved)
		// And the range really is gone.
		h := f.create(0, f.gran)
		f.requireIs(f.d.Map(base, h), driver.ErrNotReserved)
	})
	s.run(t, "WhileMappedIsBusy", func(f *fixture) {
		base := f.reserve(2 * f.gran)
		m := at(base, f.gran)
		f.mapNew(m, 0, f.gran)
		f.setAccess(m, f.gran, 0, driver.AccessReadWrite)
		data := pattern(probe, 1)
		if f.hostAccess() {
			f.write(m, data)
		}
		f.requireIs(f.d.Unreserve(base, 2*f.gran), driver.ErrBusy)
		// The mapping still works.
		f.requireOnly(m, 0, driver.AccessReadWrite)
		if f.hostAccess() {
			f.requireBytes(m, data)
		}
		f.setAccess(m, f.gran, 1, driver.AccessRead)
		f.requireAccess(m, 1, driver.AccessRead)
		f.unmap(m, f.gran)
		require.NoError(f.t, f.d.Unreserve(base, 2*f.gran))
	})
	s.run(t, "WhileReleasedChunkMappedIsBusy", func(f *fixture) {
		base := f.reserve(f.gran)
		h := f.mapNew(base, 0, f.gran)
		require.NoError(f.t, f.d.Release(h))
		f.requireIs(f.d.Unreserve(base, f.gran), driver.ErrBusy)
		f.requireNone(base)
		f.unmap(base, f.gran)
		require.NoError(f.t, f.d.Unreserve(base, f.gran))
	})
}
