package kvcache

import (
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// waitMappersIdle waits until no group's mapping-ahead goroutine has
// anything to do within the one budget (tests: bound the wait).
func (h *Hybrid) waitMappersIdle() {
	for {
		busy := false
		h.mu.Lock()
		for _, g := range h.groups {
			c := g.c
			if c == nil || c.cfg.MapAhead <= 0 {
				continue
			}
			c.shareGrant(h.freeLocked())
			c.mu.Lock()
			_, pending := c.findJobLocked()
			pending = pending || c.inflight > 0
			c.mu.Unlock()
			c.shareGrant(0)
			if pending {
				busy = true
				c.wakeMapper()
			}
		}
		h.mu.Unlock()
		if !busy {
			return
		}
		runtime.Gosched()
	}
}

// mapperCommits and appendCommits are the attention groups' commits by
// the mapping-ahead goroutines and by the calls.
func mapperCommits(h *Hybrid) (mapper, calls int) {
	for _, g := range h.Stats().Groups {
		mapper += g.MapperCommits
		calls += g.Commits - g.MapperCommits
	}
	return mapper, calls
}

// TestHybridMapAhead: with mapping ahead, every attention group's
// goroutine commits a decoding sequence's next unit between the calls,
// so that the decodes that cross units commit nothing themselves; the
// rows and the recurrent state are what they are without it.
func TestHybridMapAhead(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyHybrid(256, 4, 24*units.MiB)
	cfg.Groups[1].Window = 48
	cfg.MapAhead = 8
	h := e.hybrid(t, cfg)
	m := &hybridModel{t: t, h: h, bytes: true}
	prompt := seqTokens(40, 0, 1)
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	q := &hmSeq{s: s, prompt: slices.Clip(prompt), running: true}
	m.seqs = append(m.seqs, q)
	m.prefill(q, HybridStep{})
	m.compare()
	_, before := mapperCommits(h)
	for i := range 100 {
		bounded(t, "waiting for the mappers", func() struct{} { h.waitMappersIdle(); return struct{}{} })
		q.tokens = append(q.tokens, 7000+i)
		step, err := q.s.Append(q.tokens[len(q.tokens)-1:])
		require.NoError(t, err)
		m.write(q, step)
	}
	m.compare()
	mapper, after := mapperCommits(h)
	require.Positive(t, mapper)
	require.Equal(t, before, after, "the decodes found their units committed")
	for i, g := range h.Stats().Groups {
		if h.groups[i].c != nil {
			require.Positive(t, g.MapperCommits, "group %d maps ahead", i)
		}
	}
	require.NoError(t, h.Check())
	require.NoError(t, q.s.Free())
}

// TestHybridMapAheadStaysInBudget: the goroutines commit ahead within
// the one budget's free memory only, never past it and never by taking
// another group's pages; the Append then commits what is left itself.
func TestHybridMapAheadStaysInBudget(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyHybrid(256, 4, 24*units.MiB)
	cfg.MapAhead = 64
	h := e.hybrid(t, cfg)
	s := hybridPrefill(t, h, seqTokens(40, 0, 1))
	bounded(t, "waiting for the mappers", func() struct{} { h.waitMappersIdle(); return struct{}{} })
	st := h.Stats()
	_, err := h.SetBudget(st.Committed+page, Drop)
	require.NoError(t, err)
	mapper, _ := mapperCommits(h)
	for range 60 {
		_, err := s.Append([]int{9})
		require.NoError(t, err)
		bounded(t, "waiting for the mappers", func() struct{} { h.waitMappersIdle(); return struct{}{} })
		st := h.Stats()
		require.LessOrEqual(t, st.Committed, st.Budget)
	}
	after, _ := mapperCommits(h)
	require.LessOrEqual(t, after-mapper, 2, "a page of free memory: a unit ahead at most, per region")
	require.NoError(t, h.Check())
	require.NoError(t, s.Free())
}

// TestHybridMapAheadRace: sequences appended, forked, preempted and
// freed from several goroutines while every group's goroutine maps
// ahead; then Close with sequences live stops the goroutines (run it
// under -race).
func TestHybridMapAheadRace(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyHybrid(256, 8, 24*units.MiB)
	cfg.Groups[1].Window = 48
	cfg.MapAhead = 16
	h, err := NewHybrid(e.space, e.mem, cfg)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := hybridPrefill(t, h, seqTokens(30+w, 0, w+1))
			for i := range 80 {
				if _, err := s.Append([]int{100*w + i}); err != nil {
					t.Errorf("append: %v", err)
					return
				}
				if err := s.MarkWritten(s.Len()); err != nil {
					t.Errorf("mark written: %v", err)
					return
				}
				switch i {
				case 20:
					f, err := s.Fork()
					if err == nil {
						if _, err = f.Append([]int{1}); err == nil {
							err = f.MarkWritten(f.Len())
						}
						if err == nil {
							err = f.Free()
						}
					}
					if err != nil {
						t.Errorf("fork: %v", err)
						return
					}
				case 40:
					if err := s.Preempt(Drop); err != nil {
						t.Errorf("preempt: %v", err)
						return
					}
					step, err := s.Resume()
					if err == nil && step.N > 0 {
						err = s.MarkWritten(step.Pos + step.N)
					}
					if err != nil {
						t.Errorf("resume: %v", err)
						return
					}
				}
			}
			if w%2 == 0 {
				if err := s.Free(); err != nil {
					t.Errorf("free: %v", err)
				}
			} // the others stay live for Close
		}()
	}
	wg.Wait()
	require.NoError(t, h.Check())
	require.NoError(t, h.Close())
	require.Zero(t, e.used(t))
}

// TestHybridMapAheadNoLeaks: a hybrid cache mapping ahead leaves the
// process's goroutines, descriptors and mappings as they were once
// closed.
func TestHybridMapAheadNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		cfg := tinyHybrid(256, 4, 24*units.MiB)
		cfg.MapAhead = 8
		h, err := NewHybrid(space, mem, cfg)
		require.NoError(t, err)
		s := hybridPrefill(t, h, seqTokens(40, 0, 1))
		for i := range 30 {
			_, err := s.Append([]int{i})
			require.NoError(t, err)
		}
		require.NoError(t, h.Close())
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}
