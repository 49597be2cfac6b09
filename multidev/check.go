package multidev

import (
	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Check verifies the arena's invariants against its page table and the
// driver and returns every inconsistency: chunks contiguous from 0 and
// each where the table has it (Lookup per chunk), on the device recorded,
// live; the grant of every device at every granule the same in the arena,
// the table and the driver; and every grant over another device's memory
// reachable.
func (a *Arena) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	committed := a.committedLocked()
	if a.length > committed || committed > a.opts.Max {
		fail("multidev: len %d, committed %d, max %d out of order", a.length, committed, a.opts.Max)
	}
	if a.closed {
		if len(a.chunks) > 0 {
			fail("multidev: closed with %d chunks", len(a.chunks))
		}
		return errs
	}
	cs := a.opts.ChunkSize
	gran := a.drv.Granularity()
	nmaps := 0
	for m := range a.tab.Mappings() {
		nmaps++
		if m.Range.Size != cs {
			fail("multidev: the table maps %s, not one chunk of %d bytes", m.Range, cs)
		}
	}
	if nmaps != len(a.chunks) {
		fail("multidev: %d chunks recorded, the table has %d mappings", len(a.chunks), nmaps)
	}
	for i, ch := range a.chunks {
		at := a.at(i)
		e, err := a.tab.Lookup(at)
		if err != nil {
			fail("multidev: chunk %d at %s: %v", i, at, err)
			continue
		}
		if e.Chunk != ch.c || e.Mapping.Base != at || e.Mapping.Size != cs || ch.c.Size() != cs {
			fail("multidev: chunk %d at %s is %s, the table maps %s at %s", i, at, ch.c, e.Chunk, e.Mapping)
		}
		if ch.c.Released() {
			fail("multidev: chunk %d (%s) is released but still mapped by the arena", i, ch.c)
		}
		if len(ch.access) != len(a.devs) {
			fail("multidev: chunk %d records grants for %d devices, the driver has %d", i, len(ch.access), len(a.devs))
			continue
		}
		for d, acc := range ch.access {
			dev := driver.DeviceID(d)
			if acc != driver.AccessNone && dev != ch.dev() {
				if ok, err := a.reachableLocked(dev, ch.dev()); err != nil || !ok {
					fail("multidev: device %d holds %s access over chunk %d on device %d, which it cannot reach (%v)",
						d, acc, i, ch.dev(), err)
				}
			}
			for g := at; g < at+driver.Addr(cs); g += driver.Addr(gran) {
				got, err := a.drv.Access(g, dev)
				if err != nil {
					fail("multidev: the driver does not see chunk %d at %s: %v", i, g, err)
					break
				}
				if got != acc {
					fail("multidev: at %s device %d has %s in the driver, %s granted", g, d, got, acc)
				}
			}
			if e.Access[d] != acc {
				fail("multidev: at %s device %d has %s in the table, %s granted", at, d, e.Access[d], acc)
			}
		}
	}
	return errors.CombineErrors(errs, a.tab.Check())
}
