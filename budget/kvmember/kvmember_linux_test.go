//go:build linux

package kvmember

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

const page = 64 << 10

// server is one member's cache on a sim driver of its own, as a process
// of its own would have.
type server struct {
	drv *sim.Driver
	mem *physical.Memory
	c   *kvcache.Cache
	k   *Member
}

// newCache makes a cache of the tiny preset (TokenMajor: 16 KiB a token,
// 4 tokens a 64 KiB page) on a sim driver of capacity bytes.
func newCache(t testing.TB, capacity uint64, maxSeqs int) *server {
	t.Helper()
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: page})
	require.NoError(t, err)
	cfg, err := kvcache.Preset("tiny")
	require.NoError(t, err)
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.Layout, cfg.MapAhead = 64, maxSeqs, page, kvcache.TokenMajor, -1
	mem := physical.New(drv)
	c, err := kvcache.New(vaspace.New(drv), mem, cfg)
	require.NoError(t, err)
	return &server{drv: drv, mem: mem, c: c}
}

func (s *server) close(t testing.TB) {
	t.Helper()
	if !s.c.Closed() {
		require.NoError(t, s.c.Close())
	}
	if s.k != nil {
		require.NoError(t, s.k.Close())
	}
	require.NoError(t, s.drv.Close())
}

func (s *server) used(t testing.TB) uint64 {
	u, err := s.mem.Usage(0)
	require.NoError(t, err)
	return u.Used
}

func openBook(t testing.TB, capacity uint64) *budget.Book {
	t.Helper()
	b, err := budget.Open(filepath.Join(t.TempDir(), "book"), budget.Options{Capacity: capacity})
	require.NoError(t, err)
	return b
}

// tokens makes n tokens no other prompt has.
func tokens(next *int, n int) []int {
	out := make([]int, n)
	for i := range out {
		*next++
		out[i] = *next
	}
	return out
}

// admit admits prompt and appends it.
func admit(k *Member, prompt []int, more int) (*kvcache.Seq, error) {
	q, err := k.Admit(prompt, 0, more)
	if err != nil {
		return nil, err
	}
	if _, err := q.Append(prompt[q.Len():]); err != nil {
		return nil, errors.CombineErrors(err, q.Free())
	}
	return q, nil
}

// TestModel runs random operations on two cache members of one book
// against a plain model of their sequences (which live, with how many
// tokens), checking after every step that no sequence was preempted or
// lost a token, that each cache's budget is its member's hold and its
// committed memory (the driver's own count) within it, and that the book
// is never over-committed.
func TestModel(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		const capPages = 48
		b := openBook(t, capPages*page)
		srv := [2]*server{newCache(t, capPages*page, 8), newCache(t, capPages*page, 8)}
		floors := [2]uint64{uint64(rng.IntN(8)) * page, uint64(rng.IntN(8)) * page}
		for i, s := range srv {
			k, err := Join(b, []string{"a", "b"}[i], floors[i], capPages*page, s.c)
			require.NoError(t, err)
			s.k = k
		}
		model := [2]map[*kvcache.Seq]int{{}, {}}
		next := 0
		pick := func(i int) *kvcache.Seq {
			for s := range model[i] {
				return s
			}
			return nil
		}
		for step := 0; step < 300; step++ {
			i := rng.IntN(2)
			s := srv[i]
			switch op := rng.IntN(10); {
			case op < 4: // admit, and hold the tokens at once
				n, more := 1+rng.IntN(24), rng.IntN(24)
				q, err := admit(s.k, tokens(&next, n), more)
				if err != nil {
					require.True(t, errors.Is(err, driver.ErrOutOfMemory) || errors.Is(err, driver.ErrBusy), "seed %d step %d: %v", seed, step, err)
					break
				}
				model[i][q] = n
			case op < 6: // append
				q := pick(i)
				if q == nil {
					break
				}
				n := min(1+rng.IntN(8), 64-model[i][q])
				if n == 0 {
					break
				}
				if _, err := q.Append(tokens(&next, n)); err != nil {
					require.True(t, errors.Is(err, driver.ErrOutOfMemory), "seed %d step %d: %v", seed, step, err)
					break
				}
				model[i][q] += n
			case op < 8: // free: its pages stay cached or idle
				if q := pick(i); q != nil {
					require.NoError(t, q.Free())
					delete(model[i], q)
				}
			case op < 9: // grow
				if err := s.k.Grow(uint64(1+rng.IntN(6)) * page); err != nil {
					require.True(t, errors.Is(err, driver.ErrOutOfMemory), "seed %d step %d: %v", seed, step, err)
				}
			default:
				require.NoError(t, s.k.Sync())
			}
			in, err := b.Members()
			require.NoError(t, err)
			var reserved uint64
			for _, m := range in {
				reserved += max(m.Committed, m.Floor)
				require.LessOrEqual(t, m.Committed, m.Ceiling)
			}
			require.LessOrEqual(t, reserved, uint64(capPages*page), "seed %d step %d: over-committed", seed, step)
			for j, s := range srv {
				st := s.k.Stats()
				require.Equal(t, st.Hold, st.Budget, "seed %d step %d: member %d's budget is its hold", seed, step, j)
				require.LessOrEqual(t, s.used(t), st.Hold, "seed %d step %d: member %d commits over its hold", seed, step, j)
				require.NoError(t, s.k.Check())
				cs := s.c.Stats()
				require.Zero(t, cs.Preempted, "never a preemption")
				require.Equal(t, len(model[j]), cs.Running)
				for q, n := range model[j] {
					require.Equal(t, n, q.Len())
				}
			}
		}
		for _, s := range srv {
			s.close(t)
		}
		in, err := b.Members()
		require.NoError(t, err)
		require.Empty(t, in)
		require.NoError(t, b.Close())
	}
}

// TestGiveBack: a member whose cache holds only cached and idle pages
// gives them back when the other grows, down to its floor and never
// below the pages of its running sequences.
func TestGiveBack(t *testing.T) {
	b := openBook(t, 32*page)
	defer b.Close()
	a, c := newCache(t, 32*page, 8), newCache(t, 32*page, 8)
	var err error
	a.k, err = Join(b, "a", 4*page, 32*page, a.c)
	require.NoError(t, err)
	c.k, err = Join(b, "c", 4*page, 32*page, c.c)
	require.NoError(t, err)
	next := 0
	// a runs five sequences of 16 tokens (4 pages each), growing for
	// them, then frees four: one runs, 16 pages are cached or idle.
	run, err := admit(a.k, tokens(&next, 16), 0)
	require.NoError(t, err)
	var done []*kvcache.Seq
	for range 4 {
		q, err := admit(a.k, tokens(&next, 16), 0)
		require.NoError(t, err)
		done = append(done, q)
	}
	for _, q := range done {
		require.NoError(t, q.Free())
	}
	require.NoError(t, a.k.Sync())
	require.Equal(t, uint64(20*page), a.k.Stats().Hold)
	// c needs 24 pages: the book has 32-20-4 free (c holds its floor),
	// the rest comes from a's cached pages.
	require.NoError(t, c.k.Grow(20*page))
	st := a.k.Stats()
	require.Equal(t, uint64(8*page), st.Hold, "a gave back 12 of its 16 spare pages")
	require.Equal(t, 1, st.Asked)
	require.Equal(t, uint64(12*page), st.GivenBack)
	require.Equal(t, 16, run.Len())
	require.LessOrEqual(t, a.used(t), st.Hold)
	// Past what a can spare above its running pages and floor: refused,
	// nothing changed.
	before := c.k.Stats()
	err = c.k.Grow(8 * page)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Contains(t, err.Error(), "a (pid")
	require.Equal(t, before.Hold, c.k.Stats().Hold)
	require.Equal(t, before.Budget, c.k.Stats().Budget)
	require.Equal(t, 16, run.Len())
	require.NoError(t, run.Free())
	a.close(t)
	c.close(t)
}

// TestBadInput: what Join, Grow and Close refuse, with the cache and the
// book as they were.
func TestBadInput(t *testing.T) {
	b := openBook(t, 16*page)
	defer b.Close()
	s := newCache(t, 16*page, 4)
	defer s.close(t)
	budgetBefore := s.c.Stats().Budget
	for _, c := range []struct {
		name           string
		b              *budget.Book
		floor, ceiling uint64
		c              *kvcache.Cache
		is             error
	}{
		{"nil book", nil, 0, 4 * page, s.c, driver.ErrInvalid},
		{"nil cache", b, 0, 4 * page, nil, driver.ErrInvalid},
		{"under a page", b, 0, page - 1, s.c, driver.ErrInvalid},
		{"floor over ceiling", b, 8 * page, 4 * page, s.c, driver.ErrInvalid},
		{"ceiling over capacity", b, 0, 17 * page, s.c, driver.ErrInvalid},
		{"bad name", b, 0, 4 * page, s.c, driver.ErrInvalid},
	} {
		name := "m"
		if c.name == "bad name" {
			name = ""
		}
		_, err := Join(c.b, name, c.floor, c.ceiling, c.c)
		require.True(t, errors.Is(err, c.is), "%s: %v", c.name, err)
		require.Equal(t, budgetBefore, s.c.Stats().Budget, c.name)
		in, err := b.Members()
		require.NoError(t, err)
		require.Empty(t, in, c.name)
	}
	k, err := Join(b, "m", 2*page, 8*page, s.c)
	require.NoError(t, err)
	s.k = k
	before := k.Stats()
	require.Equal(t, uint64(2*page), before.Hold, "the hold starts at the floor")
	require.True(t, errors.Is(k.Grow(0), driver.ErrInvalid))
	require.True(t, errors.Is(k.Grow(7*page), driver.ErrOutOfMemory), "past the ceiling")
	_, err = k.Admit(nil, 0, 0)
	require.True(t, errors.Is(err, driver.ErrInvalid))
	require.Equal(t, before, k.Stats())
	require.True(t, errors.Is(k.Close(), driver.ErrBusy), "the cache is open")
	var nilk *Member
	require.True(t, errors.Is(nilk.Grow(page), driver.ErrInvalid))
	require.True(t, errors.Is(nilk.Sync(), driver.ErrInvalid))
	require.True(t, errors.Is(nilk.Check(), driver.ErrInvalid))
	require.True(t, errors.Is((&Member{}).Close(), driver.ErrInvalid))
	require.Equal(t, Stats{}, nilk.Stats())
	require.Equal(t, before, k.Stats())
}

// TestNoLeaks: a member joined, grown, asked and closed with its cache
// leaves no descriptor, mapping or goroutine behind, and the driver
// holds nothing.
func TestNoLeaks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "book")
	work := func() {
		b, err := budget.Open(path, budget.Options{Capacity: 16 * page})
		require.NoError(t, err)
		a, c := newCache(t, 16*page, 4), newCache(t, 16*page, 4)
		a.k, err = Join(b, "a", 0, 16*page, a.c)
		require.NoError(t, err)
		c.k, err = Join(b, "c", 0, 16*page, c.c)
		require.NoError(t, err)
		next := 0
		q, err := admit(a.k, tokens(&next, 40), 0)
		require.NoError(t, err)
		require.NoError(t, q.Free())
		require.NoError(t, a.k.Sync())
		require.NoError(t, c.k.Grow(12*page))
		require.NoError(t, a.c.Close())
		require.Zero(t, a.used(t))
		a.close(t)
		c.close(t)
		require.NoError(t, b.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %v, after %v", before, after)
}

// TestAdmitKeepsItsGrowth: another member asks for memory back between
// an admission's growth and the cache's Admit (beforeAdmit): the
// give-back takes nothing the admission will take, and it succeeds; after
// it, what the freed sequence held is spare again and a later give-back
// takes it.
func TestAdmitKeepsItsGrowth(t *testing.T) {
	b := openBook(t, 32*page)
	defer b.Close()
	a, c := newCache(t, 32*page, 8), newCache(t, 32*page, 8)
	var err error
	a.k, err = Join(b, "a", page, 32*page, a.c)
	require.NoError(t, err)
	c.k, err = Join(b, "c", page, 32*page, c.c)
	require.NoError(t, err)
	free := func() uint64 {
		in, err := b.Members()
		require.NoError(t, err)
		n := uint64(32 * page)
		for _, m := range in {
			n -= m.Committed
		}
		return n
	}
	next := 0
	var asked error
	beforeAdmit = func() {
		// c wants a page more than the book has free: a is asked.
		asked = c.k.Grow(free() + page)
		beforeAdmit = func() {}
	}
	t.Cleanup(func() { beforeAdmit = func() {} })
	q, err := admit(a.k, tokens(&next, 16), 0)
	require.NoError(t, err, "the growth stayed for the admission")
	require.ErrorIs(t, asked, driver.ErrOutOfMemory, "a gave back nothing the admission takes")
	require.Positive(t, a.k.Stats().Asked)
	require.Equal(t, 16, q.Len())
	require.NoError(t, a.k.Check())
	require.NoError(t, c.k.Check())
	require.NoError(t, q.Free())
	require.NoError(t, a.k.Sync())
	before := a.k.Stats()
	require.NoError(t, c.k.Grow(free()+page), "a's freed pages are spare again")
	require.Less(t, a.k.Stats().Hold, before.Hold)
	a.close(t)
	c.close(t)
}

// lockingMem is a member's memory whose GiveBack, once it has given
// back, runs then: something that is not a member taking the book's lock
// as the member is about to release what its cache gave up.
type lockingMem struct {
	memory
	then func()
}

func (m lockingMem) GiveBack(want uint64) (uint64, error) {
	got, err := m.memory.GiveBack(want)
	m.then()
	return got, err
}

// TestGiveBackRefusedByTheBook: a give-back whose release the book
// refuses (its lock held by something that is not a member) leaves the
// cache's budget lowered and the bytes owed; once the lock is free, the
// next call that reaches the book (Sync) releases them, and the hold is
// again the cache's budget.
func TestGiveBackRefusedByTheBook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "book")
	b, err := budget.Open(path, budget.Options{Capacity: 32 * page})
	require.NoError(t, err)
	defer b.Close()
	a := newCache(t, 32*page, 8)
	a.k, err = Join(b, "a", 4*page, 32*page, a.c)
	require.NoError(t, err)
	next := 0
	require.NoError(t, a.k.Grow(12*page))
	q, err := admit(a.k, tokens(&next, 16), 0)
	require.NoError(t, err)
	require.NoError(t, q.Free())
	require.NoError(t, a.k.Sync())
	before := a.k.Stats()
	require.Equal(t, before.Hold, before.Budget)

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 1}
	a.k.c = lockingMem{memory: a.k.c, then: func() { require.NoError(t, unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)) }}
	a.k.giveBack(8 * page) // the book's lock is held from the cache's give-back on: ErrBusy after the book's wait
	lk.Type = unix.F_UNLCK
	require.NoError(t, unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk))
	st := a.k.Stats()
	require.Less(t, st.Budget, before.Budget, "the cache gave back")

	require.NoError(t, a.k.Sync())
	st = a.k.Stats()
	require.Equal(t, st.Budget, st.Hold, "the hold is the cache's budget again")
	require.NoError(t, a.k.Check())
	a.close(t)
}
