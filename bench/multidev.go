package bench

import (
	"bytes"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Migrate times moving size bytes between the two devices of a host
// driver, back and forth, alternating which goes first. Lib is
// multidev.Arena.Migrate of the whole arena: new chunks on the target, the
// bytes copied, the new chunks mapped at the same addresses with the same
// grants, the old ones released. Bare is what a program without it does to
// move a tensor: a fresh arena.Arena on the target (New + Grow), the bytes
// copied into it (copy between the two arenas' host bytes), and the old
// arena closed. Both start from the same bytes on device 0 and are
// compared at the end (not timed). Chunks are ChunkSize, so both commit and map the
// same chunks. Host driver, default capacity: ErrTooLarge when a device
// cannot hold 2×size (the migrated arena and the copied one, both on one
// device after an odd round).
func Migrate(more func() bool, size uint64) (p Pair, err error) {
	if size == 0 || size%ChunkSize != 0 {
		return p, errors.Newf("bench: migrate %s: a multiple of %s is needed", units.Bytes(size), units.Bytes(ChunkSize))
	}
	drv, err := host.New(host.Options{Devices: 2})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	if c := drv.Devices()[0].Capacity; c < 2*size {
		return p, errors.Wrapf(ErrTooLarge, "bench: migrating %s needs %s a device, the host driver's default device has %s (half of MemAvailable, split between 2 devices)",
			units.Bytes(size), units.Bytes(2*size), units.Bytes(c))
	}
	space, mem := vaspace.New(drv), physical.New(drv)

	// The migrated arena: every chunk on device 0 to begin with, device 0
	// and 1 granted read-write (so either reads it wherever it lies).
	md, err := multidev.New(space, mem, multidev.Options{Max: size, ChunkSize: ChunkSize, Placement: multidev.Striped(0)})
	if err != nil {
		return p, err
	}
	defer func() { err = errors.CombineErrors(err, md.Close()) }()
	if err := md.Grow(size); err != nil {
		return p, err
	}
	for dev := driver.DeviceID(0); dev < 2; dev++ {
		if err := md.Grant(dev, 0, size, driver.AccessReadWrite); err != nil {
			return p, err
		}
	}
	// The copied arena, with the same bytes.
	cp, err := newCopiedArena(space, mem, 0, size)
	if err != nil {
		return p, err
	}
	defer func() {
		if cp != nil {
			err = errors.CombineErrors(err, cp.close())
		}
	}()
	pattern := make([]byte, ChunkSize)
	for off := uint64(0); off < size; off += ChunkSize {
		for i := range pattern {
			pattern[i] = byte(off/ChunkSize) ^ byte(i) ^ byte(i>>8)
		}
		if err := md.Write(0, off, pattern); err != nil {
			return p, err
		}
		copy(cp.bytes[off:], pattern)
	}

	to := driver.DeviceID(1)
	viaMigrate := func(into *time.Duration) error {
		t0 := time.Now()
		err := md.Migrate(0, size, to)
		*into += time.Since(t0)
		return err
	}
	viaCopy := func(into *time.Duration) error {
		t0 := time.Now()
		next, err := newCopiedArena(space, mem, to, size)
		if err != nil {
			return err
		}
		copy(next.bytes, cp.bytes)
		err = cp.close()
		cp = next
		*into += time.Since(t0)
		return err
	}
	// One untimed round each first: the first migration's and the first
	// copy's new chunks land on memory this VM has never touched, whose
	// first-touch cost (about 10 ms per 2 MiB here) would otherwise be
	// charged to whichever side met it first.
	var warm time.Duration
	if err := viaMigrate(&warm); err != nil {
		return p, err
	}
	to = 1 - to
	if err := viaCopy(&warm); err != nil {
		return p, err
	}
	p, err = alternate(more, 1, viaMigrate, viaCopy, func() error { to = 1 - to; return nil })
	if err != nil {
		return p, err
	}

	if dev, err := md.DeviceAt(0); err != nil || dev != cp.a.Device() {
		return p, errors.CombineErrors(err, errors.AssertionFailedf("bench: the migrated arena is on device %d, the copied one on %d", dev, cp.a.Device()))
	}
	got := make([]byte, ChunkSize)
	for off := uint64(0); off < size; off += ChunkSize {
		if err := md.Read(0, off, got); err != nil {
			return p, err
		}
		if !bytes.Equal(got, cp.bytes[off:off+ChunkSize]) {
			return p, errors.AssertionFailedf("bench: after %d migrations the bytes at %#x differ from the copied arena's", p.N, off)
		}
	}
	return p, md.Check()
}

// copiedArena is the baseline's tensor: an arena on one device and a view
// of all of it.
type copiedArena struct {
	a     *arena.Arena
	v     *arena.View
	bytes []byte
}

// newCopiedArena returns an arena of size bytes, committed on dev in
// ChunkSize chunks, and its bytes.
func newCopiedArena(space *vaspace.Space, mem *physical.Memory, dev driver.DeviceID, size uint64) (*copiedArena, error) {
	a, err := arena.New(space, mem, arena.Options{Device: dev, Max: size, ChunkSize: ChunkSize, MaxChunk: ChunkSize})
	if err != nil {
		return nil, err
	}
	c := &copiedArena{a: a}
	if err := a.Grow(size); err != nil {
		return nil, errors.CombineErrors(err, c.close())
	}
	if c.v, err = a.View(0, size); err != nil {
		return nil, errors.CombineErrors(err, c.close())
	}
	if c.bytes, err = c.v.Bytes(); err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "bench: bytes of the copied arena"), c.close())
	}
	return c, nil
}

func (c *copiedArena) close() error {
	var err error
	if c.v != nil {
		err = c.v.Release()
	}
	c.bytes = nil
	return errors.CombineErrors(err, c.a.Close())
}
