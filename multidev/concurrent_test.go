package multidev

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestMigrateUnderReaders: readers on every device check a known pattern
// in a loop, and a writer writes a counter and reads it back, while Migrate
// moves ranges back and forth between the devices. Every read sees the
// pattern, whole — never a range half moved — and no write is lost to a
// migration's copy. Run with -race.
func TestMigrateUnderReaders(t *testing.T) { onEveryDriver(t, migrateUnderReaders) }

func migrateUnderReaders(t *testing.T, d backend) {
	const chunks = 8
	e := d.env(t, 32*g, false)
	a := e.arena(t, Options{Max: 16 * g, ChunkSize: g, Placement: Striped(0, 1, 2, 3)})
	require.NoError(t, a.Grow(chunks*g))
	for d := driver.DeviceID(0); d < 4; d++ {
		require.NoError(t, a.Grant(d, 0, chunks*g, driver.AccessRead))
	}
	require.NoError(t, a.Grant(0, 0, chunks*g, driver.AccessReadWrite))
	// The pattern fills the first chunks-1 chunks; the writer owns the last.
	patterned := (chunks - 1) * g
	want := fill(0, int(patterned))
	require.NoError(t, a.Write(0, 0, want))
	counterAt := patterned + g/2

	var stop atomic.Bool
	var reads, writes atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
		stop.Store(true)
	}
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			buf := make([]byte, 3*g)
			for !stop.Load() {
				off := rng.Uint64N(patterned - 1)
				n := 1 + rng.Uint64N(min(uint64(len(buf)), patterned-off))
				dev := driver.DeviceID(rng.IntN(4))
				if err := a.Read(dev, off, buf[:n]); err != nil {
					report(err)
					return
				}
				if !bytes.Equal(buf[:n], want[off:off+n]) {
					report(errorf("device %d read %d bytes at %#x that differ from the pattern", dev, n, off))
					return
				}
				reads.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var word [8]byte
		for k := uint64(1); !stop.Load(); k++ {
			for i := range word {
				word[i] = byte(k >> (8 * i))
			}
			if err := a.Write(0, counterAt, word[:]); err != nil {
				report(err)
				return
			}
			var got [8]byte
			if err := a.Read(3, counterAt, got[:]); err != nil {
				report(err)
				return
			}
			if got != word {
				report(errorf("wrote counter %d, read back %v", k, got))
				return
			}
			writes.Add(1)
		}
	}()

	rng := rand.New(rand.NewPCG(42, 42))
	moves := 60
	if testing.Short() {
		moves = 30
	}
	for i := 0; i < moves && !stop.Load(); i++ {
		lo := rng.IntN(chunks)
		hi := lo + 1 + rng.IntN(chunks-lo)
		to := driver.DeviceID(rng.IntN(4))
		require.NoError(t, a.Migrate(uint64(lo)*g, uint64(hi-lo)*g, to))
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d migrations, %d reads, %d writes checked", moves, reads.Load(), writes.Load())
	require.NoError(t, a.Check())
	got := make([]byte, patterned)
	require.NoError(t, a.Read(2, 0, got))
	require.Equal(t, fill(0, int(patterned)), got)
	var total uint64
	for _, u := range e.used(t) {
		total += u
	}
	require.Equal(t, chunks*g, total, "every old chunk went back")
}
