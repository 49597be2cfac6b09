package drivertest

import (
	"bytes"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// close checks Close: it refuses while anything is mapped — memory a
// slice or tensor may still reach — changing nothing; otherwise it takes
// down whatever is left, and every later call is ErrClosed.
func (s suite) close(t *testing.T) {
	// live leaves every kind of state behind: a reservation with an
	// accessible mapping, a mapping of a released chunk, an unmapped chunk
	// and an empty reservation. It returns the two mappings' addresses.
	live := func(f *fixture) (base driver.Addr, mapped []driver.Addr) {
		base = f.reserve(4 * f.gran)
		f.mapNew(base, 0, f.gran)
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		if f.hostAccess() {
			f.write(base, pattern(probe, 1))
		}
		dead := f.mapNew(at(base, f.gran), f.beside(1), f.gran)
		require.NoError(f.t, f.d.Release(dead))
		f.create(1, f.gran)
		f.reserve(f.gran)
		return base, []driver.Addr{base, at(base, f.gran)}
	}
	// unmapped is live with both mappings removed: chunks and reservations,
	// nothing anyone can touch.
	unmapped := func(f *fixture) driver.Addr {
		base, mapped := live(f)
		for _, m := range mapped {
			f.unmap(m, f.gran)
		}
		return base
	}
	s.run(t, "Fresh", func(f *fixture) {
		require.NoError(f.t, f.d.Close())
	})
	s.run(t, "RefusedWhileMapped", func(f *fixture) {
		base, mapped := live(f)
		f.requireIs(f.d.Close(), driver.ErrBusy)
		// Nothing changed: the mapping is there, accessible, with its bytes.
		f.requireAccess(base, 0, driver.AccessReadWrite)
		if f.hostAccess() {
			f.requireBytes(base, pattern(probe, 1))
		}
		h := f.create(0, f.gran)
		require.NoError(f.t, f.d.Release(h), "the driver still works")
		for _, m := range mapped {
			f.unmap(m, f.gran)
		}
		require.NoError(f.t, f.d.Close(), "with nothing mapped, Close takes down the rest")
	})
	s.run(t, "WithLiveState", func(f *fixture) {
		unmapped(f)
		require.NoError(f.t, f.d.Close())
	})
	s.run(t, "EveryCallAfterIsClosed", func(f *fixture) {
		base := unmapped(f)
		spare := f.create(0, f.gran)
		require.NoError(f.t, f.d.Close())
		calls := []struct {
			name string
			call func() error
		}{
			{"Reserve", func() error { _, err := f.d.Reserve(f.gran, 0, 0); return err }},
			{"Unreserve", func() error { return f.d.Unreserve(base, 4*f.gran) }},
			{"Create", func() error { _, err := f.d.Create(0, f.gran, driver.ChunkOptions{}); return err }},
			{"Release", func() error { return f.d.Release(spare) }},
			{"Map", func() error { return f.d.Map(at(base, 2*f.gran), spare) }},
			{"Unmap", func() error { return f.d.Unmap(base, f.gran) }},
			{"SetAccess", func() error { return f.d.SetAccess(base, f.gran, 0, driver.AccessRead) }},
			{"Access", func() error { _, err := f.d.Access(base, 0); return err }},
			{"Read", func() error { return f.d.Read(base, make([]byte, probe)) }},
			{"Write", func() error { return f.d.Write(base, pattern(probe, 2)) }},
			{"Close", f.d.Close},
		}
		for _, c := range calls {
			f.t.Run(c.name, func(t *testing.T) { RequireIs(t, c.call(), driver.ErrClosed) })
		}
	})
	s.run(t, "SecondClose", func(f *fixture) {
		unmapped(f)
		require.NoError(f.t, f.d.Close())
		f.requireIs(f.d.Close(), driver.ErrClosed)
	})
}

// concurrency runs whole chunk lifetimes from 8 goroutines at once, each in
// a reservation of its own; run it with -race.
func (s suite) concurrency(t *testing.T) {
	const workers, rounds = 8, 50
	s.run(t, "Workers", func(f *fixture) {
		perDev := (workers + len(f.devs) - 1) / len(f.devs)
		for i, d := range f.devs {
			if d.Capacity/d.MinGranularity < uint64(2*perDev) {
				f.t.Skipf("device %d holds fewer than %d chunks of 2 × its granularity", i, perDev)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() { errs[w] = f.work(w, rounds) })
		}
		wg.Wait()
		for w, err := range errs {
			require.NoError(f.t, err, "worker %d", w)
		}
	})
}

// work is one worker of the concurrency test: rounds chunk lifetimes in a
// reservation of its own, on device w modulo the device count. It returns
// the first error rather than failing the test, since it runs off the test's
// goroutine.
func (f *fixture) work(w, rounds int) error {
	d := f.d
	dev := driver.DeviceID(w % len(f.devs))
	g := f.g(dev)
	size := 2 * g
	rsize := roundUp(size, f.gran)
	base, err := d.Reserve(rsize, 0, 0)
	if err != nil {
		return err
	}
	want := pattern(probe, byte(w))
	got := make([]byte, probe)
	for r := range rounds {
		h, err := d.Create(dev, size, driver.ChunkOptions{})
		if err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if err := d.Map(base, h); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if a, err := d.Access(at(base, g), dev); err != nil || a != driver.AccessNone {
			return errors.Newf("round %d: new mapping: access %s, error %v", r, a, err)
		}
		if err := d.SetAccess(base, size, dev, driver.AccessReadWrite); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if a, err := d.Access(at(base, g), dev); err != nil || a != driver.AccessReadWrite {
			return errors.Newf("round %d: after set access: access %s, error %v", r, a, err)
		}
		if f.hostAccess() {
			want[1] = byte(r)
			if err := d.Write(at(base, g), want); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
			if err := d.Read(at(base, g), got); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
			if !bytes.Equal(want, got) {
				return errors.Newf("round %d: read back % x, wrote % x", r, head(got), head(want))
			}
		}
		// Odd rounds release first, so the memory goes with the unmap.
		if r%2 == 1 {
			if err := d.Release(h); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
		}
		if err := d.Unmap(base, size); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if r%2 == 0 {
			if err := d.Release(h); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
		}
	}
	return d.Unreserve(base, rsize)
}
