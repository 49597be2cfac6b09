package bench

import (
	"bytes"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/sleep"
)

// SleepWakeTimes are the times of N rounds of a tag of one allocation
// put to sleep in Host mode and woken (SleepWake, the sum of Sleep and
// Wake), and of the baseline in the same rounds (Copy): what a user would
// do without sleep — copy the same bytes out of device memory to a pinned
// host buffer and back into the memory, which stays committed
// (HostAlloc, Read, Write, HostFree).
type SleepWakeTimes struct {
	N                            int
	SleepWake, Sleep, Wake, Copy time.Duration
}

// sleepPiece is the size of each write that fills the tag.
const sleepPiece = 64 * units.MiB

// SleepWake times Sleep(Host) then Wake of a tag holding one allocation of
// size bytes against the plain copy out and back (SleepWakeTimes), both
// in each round, sleep first. The bytes are written once before the
// rounds and checked after them. The copies are the same on both sides
// (the backup is a HostAlloc buffer of the same size); the rest of
// SleepWake is giving the memory back at sleep and committing, mapping
// and granting it again at wake. Host driver, default capacity:
// ErrTooLarge when it cannot hold the tag, its backup and the baseline's
// buffer (the driver checks host buffers against the same memory).
func SleepWake(more func() bool, size uint64) (t SleepWakeTimes, err error) {
	if size == 0 {
		return t, errors.New("bench: sleep and wake of zero bytes")
	}
	d, err := host.New(host.Options{Devices: 1})
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, d.Close()) }()
	if c := d.Devices()[0].Capacity; c < 3*size {
		return t, errors.Wrapf(ErrTooLarge, "bench: sleep and wake of %s needs %s (the tag, its backup, the baseline's buffer), the host driver's default device has %s (half of MemAvailable)",
			units.Bytes(size), units.Bytes(3*size), units.Bytes(c))
	}
	gran := d.Devices()[0].RecommendedGranularity
	m, err := sleep.New(d, sleep.Options{TagMax: (size + gran - 1) / gran * gran})
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, m.Close()) }()
	p, err := m.Alloc("weights", size)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.CombineErrors(err, m.Free(p)) }()
	piece := sleepPattern(min(size, sleepPiece))
	for off := uint64(0); off < size; off += uint64(len(piece)) {
		if err := d.Write(p+driver.Addr(off), piece[:min(uint64(len(piece)), size-off)]); err != nil {
			return t, err
		}
	}
	for more() {
		t0 := time.Now()
		if err := m.Sleep(sleep.Host); err != nil {
			return t, err
		}
		ts := time.Now()
		if err := m.Wake(); err != nil {
			return t, err
		}
		t1 := time.Now()
		buf, err := d.HostAlloc(size)
		if err != nil {
			return t, err
		}
		err = errors.CombineErrors(d.Read(p, buf), d.Write(p, buf))
		if err = errors.CombineErrors(err, d.HostFree(buf)); err != nil {
			return t, err
		}
		t.SleepWake += t1.Sub(t0)
		t.Sleep += ts.Sub(t0)
		t.Wake += t1.Sub(ts)
		t.Copy += time.Since(t1)
		t.N++
	}
	last := size - uint64(len(piece))
	got := make([]byte, len(piece))
	if err := d.Read(p+driver.Addr(last), got); err != nil {
		return t, err
	}
	if off := last % uint64(len(piece)); !bytes.Equal(got, append(piece[off:], piece[:off]...)) {
		return t, errors.AssertionFailedf("bench: the woken tag's last %s are not what was written", units.Bytes(uint64(len(piece))))
	}
	return t, nil
}

// sleepPattern is n bytes that are not all alike.
func sleepPattern(n uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	return b
}

// SleepCycleGrowth is the growth over Cycles sleep/wake cycles, measured
// once per round of cycles and summed: Bytes of the device's used bytes,
// Backup of the backup bytes a woken tag still holds, FDs of the process's
// file descriptors and Maps of its mappings (leakcheck). Took is the
// time of the cycles alone.
type SleepCycleGrowth struct {
	Cycles                   int
	Bytes, Backup, FDs, Maps int64
	Took                     time.Duration
}

// sleepCycleSizes are the cycled tag's allocations: 120 KiB in three, each
// in a 64 KiB-chunk tag, as a model's small tensors are.
var sleepCycleSizes = []uint64{20 * units.KiB, 40 * units.KiB, 60 * units.KiB}

// SleepCycles runs rounds of cycles Host-mode sleep/wake cycles of a small
// tag (sleepCycleSizes) on a 64 MiB host device, after warmUp cycles that
// let the Go heap grow to what the cycles need, and returns the growth of
// each round summed (SleepCycleGrowth); every cycle checks that sleep gave
// back all the device held and wake took back the same, and the last
// checks the bytes.
func SleepCycles(more func() bool, cycles, warmUp int) (g SleepCycleGrowth, err error) {
	d, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: 4 * units.KiB})
	if err != nil {
		return g, err
	}
	defer func() { err = errors.CombineErrors(err, d.Close()) }()
	m, err := sleep.New(d, sleep.Options{TagMax: 16 * units.MiB, ChunkSize: 64 * units.KiB})
	if err != nil {
		return g, err
	}
	defer func() { err = errors.CombineErrors(err, m.Close()) }()
	want := map[driver.Addr][]byte{}
	for i, n := range sleepCycleSizes {
		p, err := m.Alloc("weights", n)
		if err != nil {
			return g, err
		}
		defer func() { err = errors.CombineErrors(err, m.Free(p)) }()
		want[p] = sleepPattern(n)[i:]
		if err := d.Write(p, want[p]); err != nil {
			return g, err
		}
	}
	if err := m.Sleep(sleep.Host); err != nil { // the first sleep trims the tag's free chunks
		return g, err
	}
	if err := m.Wake(); err != nil {
		return g, err
	}
	used := d.Used(0)
	cycle := func() error {
		if err := m.Sleep(sleep.Host); err != nil {
			return err
		}
		if u := d.Used(0); u != 0 {
			return errors.AssertionFailedf("bench: asleep, the device holds %d bytes", u)
		}
		if err := m.Wake(); err != nil {
			return err
		}
		if u := d.Used(0); u != used {
			return errors.AssertionFailedf("bench: awake, the device holds %d bytes, %d before", u, used)
		}
		return nil
	}
	for range warmUp {
		if err := cycle(); err != nil {
			return g, err
		}
	}
	for more() {
		before, err := leakcheck.Take()
		if err != nil {
			return g, err
		}
		t0 := time.Now()
		for range cycles {
			if err := cycle(); err != nil {
				return g, err
			}
		}
		g.Took += time.Since(t0)
		after, err := leakcheck.Take()
		if err != nil {
			return g, err
		}
		g.Cycles += cycles
		g.Bytes += int64(d.Used(0)) - int64(used)
		for _, s := range m.Stats() {
			g.Backup += int64(s.BackupBytes)
		}
		g.FDs += int64(after.FDs - before.FDs)
		g.Maps += int64(after.Maps - before.Maps)
	}
	for p, b := range want {
		got := make([]byte, len(b))
		if err := d.Read(p, got); err != nil {
			return g, err
		}
		if !bytes.Equal(got, b) {
			return g, errors.AssertionFailedf("bench: the allocation at %s lost its bytes over the cycles", p)
		}
	}
	return g, nil
}
