package sleep

import (
	"bytes"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// within waits for a call that must complete (what names it for a
// reader) and returns its error. It sets no clock: a deadlock is bounded
// by go test's -timeout, which prints every goroutine's stack.
func within(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	_ = what
	return <-ch
}

// parked holds a Sleep or Wake of one tag at the start of its work (the
// Manager's hook), with the tag claimed and the Manager's lock free,
// until released.
type parked struct {
	at      chan string // the op, once the call is held
	release chan struct{}
}

func park(m *Manager, tag string) *parked {
	p := &parked{at: make(chan string, 1), release: make(chan struct{})}
	m.hook = func(op, name string) {
		if name == tag {
			p.at <- op
			<-p.release
		}
	}
	return p
}

// TestOtherTagsGoOnDuringSleepAndWake: while a Sleep of "weights" is held
// in the middle of its work (a hook, not a timing), a Free, an Alloc and
// a write of tag "kv", Stats, Size and Check all complete; a Free of a
// "weights" allocation waits for the Sleep, then drops that
// allocation's backup. The same holds while the Wake is held, and the
// woken tag has its bytes.
func TestOtherTagsGoOnDuringSleepAndWake(t *testing.T) {
	for _, mode := range []Mode{Host, File} {
		t.Run(mode.String(), func(t *testing.T) {
			d := openHost(t, testCap)
			m := newManager(t, d)
			w1, err := m.Alloc("weights", 300*kib)
			require.NoError(t, err)
			w2, err := m.Alloc("weights", 2*mib)
			require.NoError(t, err)
			b2 := pattern(2, 2*mib)
			require.NoError(t, d.Write(w2, b2))
			kv, err := m.Alloc("kv", 64*kib)
			require.NoError(t, err)

			p := park(m, "weights")
			slept := make(chan error, 1)
			go func() { slept <- m.Sleep(mode, "weights") }()
			require.Equal(t, "sleep", <-p.at)

			others := make(chan error, 1)
			var kv2 driver.Addr
			go func() {
				err := m.Free(kv)
				if err == nil {
					kv2, err = m.Alloc("kv", 128*kib)
				}
				if err == nil {
					err = d.Write(kv2, pattern(9, 128*kib))
				}
				if err == nil {
					_, err = m.Size(w2)
				}
				if err == nil {
					m.Stats()
					err = m.Check()
				}
				others <- err
			}()
			require.NoError(t, within(t, "calls on tag kv during the sleep of weights", others))
			require.False(t, stats(t, m, "weights").Asleep, "the sleep is not recorded until it returns")

			freed := make(chan error, 1)
			go func() { freed <- m.Free(w1) }() // waits for the sleep
			close(p.release)
			require.NoError(t, within(t, "the sleep", slept))
			require.NoError(t, within(t, "the free in the slept tag", freed))
			s := stats(t, m, "weights")
			require.True(t, s.Asleep)
			require.Equal(t, 1, s.Live)
			require.Equal(t, 2*mib, s.BackupBytes, "the freed allocation's backup went")
			require.NoError(t, m.Check())

			p = park(m, "weights")
			woke := make(chan error, 1)
			go func() { woke <- m.Wake("weights") }()
			require.Equal(t, "wake", <-p.at)
			go func() {
				err := m.Free(kv2)
				if err == nil {
					err = m.Check()
				}
				others <- err
			}()
			require.NoError(t, within(t, "calls on tag kv during the wake of weights", others))
			closed := make(chan error, 1)
			go func() { closed <- m.Close() }() // waits for the wake, then refuses: w2 is live
			close(p.release)
			require.NoError(t, within(t, "the wake", woke))
			require.ErrorIs(t, within(t, "the close", closed), driver.ErrBusy)
			require.Equal(t, b2, read(t, d, w2, 2*mib))
			require.False(t, stats(t, m, "weights").Asleep)
			m.hook = nil
			closeAll(t, m)
		})
	}
}

// TestConcurrentTags: three goroutines cycle a tag each — allocating,
// writing, sleeping (Host and File in turn), waking, checking the bytes,
// freeing — while a fourth sleeps and wakes a tag of its own, a fifth
// runs Check and Stats, and a sixth takes tensors over the fourth's
// allocation and writes its bytes through them (each Tensor succeeds or
// finds the tag asleep, each access succeeds or finds the tensor
// revoked); under -race. Every call succeeds, the bytes survive, and the
// Manager checks clean at every point.
func TestConcurrentTags(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	held, err := m.Alloc("d", 100*kib)
	require.NoError(t, err)
	heldWant := pattern(99, 100*kib)
	require.NoError(t, d.Write(held, heldWant))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i, tag := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for round := range 8 {
					n := uint64(round%5+1) * 20 * kib
					p, err := m.Alloc(tag, n)
					if err != nil {
						return err
					}
					want := pattern(uint64(i*100+round), n)
					if err := d.Write(p, want); err != nil {
						return err
					}
					if err := m.Sleep(Mode(1+round%2), tag); err != nil {
						return err
					}
					if err := m.Wake(tag); err != nil {
						return err
					}
					got := make([]byte, n)
					if err := d.Read(p, got); err != nil {
						return err
					}
					if !bytes.Equal(want, got) {
						return errors.Newf("tag %q lost the bytes at %s in round %d", tag, p, round)
					}
					if err := m.Free(p); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Add(3)
	go func() {
		defer wg.Done()
		errs <- func() error {
			for range 40 {
				tt, err := m.Tensor(held)
				if errors.Is(err, driver.ErrBusy) {
					continue // asleep
				} else if err != nil {
					return err
				}
				err = tt.Access(true, func(b []byte) error {
					if !bytes.Equal(b, heldWant) {
						return errors.New("the tensor does not hold the allocation's bytes")
					}
					copy(b, heldWant)
					return nil
				})
				if err != nil && !errors.Is(err, driver.ErrClosed) {
					return err
				}
			}
			return nil
		}()
	}()
	go func() {
		defer wg.Done()
		errs <- func() error {
			for range 16 {
				if err := m.Sleep(Host, "d"); err != nil {
					return err
				}
				if err := m.Wake("d"); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	go func() {
		defer wg.Done()
		errs <- func() error {
			for range 40 {
				if err := m.Check(); err != nil {
					return err
				}
				m.Stats()
			}
			return nil
		}()
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, heldWant, read(t, d, held, 100*kib))
	require.NoError(t, m.Free(held))
	closeAll(t, m)
}
