package kvcache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// eventIndex is a router's view of a cache, built from its KV events
// alone, as llm-d's indexer builds one: the blocks stored and not removed
// since. apply records what is wrong rather than failing (it runs inside
// the cache's delivery); check compares it with the prefix index.
type eventIndex struct {
	live    map[uint64]storedBlock
	ever    map[uint64]bool
	batches int
	errs    error
}

// storedBlock is what a BlockStored said of one block.
type storedBlock struct {
	parent    *uint64
	tokens    []int
	blockSize int
}

func newEventIndex() *eventIndex {
	return &eventIndex{live: map[uint64]storedBlock{}, ever: map[uint64]bool{}}
}

func (x *eventIndex) fail(format string, args ...any) {
	x.errs = errors.CombineErrors(x.errs, errors.Newf(format, args...))
}

func (x *eventIndex) apply(b EventBatch) {
	x.batches++
	if b.TS.IsZero() || len(b.Events) == 0 {
		x.fail("batch %d: ts %v, %d events", x.batches, b.TS, len(b.Events))
	}
	for _, e := range b.Events {
		switch e := e.(type) {
		case *BlockStored:
			n := len(e.BlockHashes)
			if n == 0 || e.BlockSize <= 0 || len(e.TokenIDs) != n*e.BlockSize || e.LoRAID != nil || e.Medium != EventMedium {
				x.fail("batch %d: a malformed BlockStored %+v", x.batches, e)
				continue
			}
			if e.ParentBlockHash != nil && !x.ever[*e.ParentBlockHash] {
				x.fail("batch %d: block %#x follows %#x, never stored", x.batches, e.BlockHashes[0], *e.ParentBlockHash)
			}
			parent := e.ParentBlockHash
			for i, h := range e.BlockHashes {
				if _, ok := x.live[h]; ok {
					x.fail("batch %d: block %#x stored twice", x.batches, h)
				}
				x.live[h] = storedBlock{parent: parent, tokens: e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize], blockSize: e.BlockSize}
				x.ever[h] = true
				parent = &e.BlockHashes[i]
			}
		case *BlockRemoved:
			if len(e.BlockHashes) == 0 || e.Medium != EventMedium {
				x.fail("batch %d: a malformed BlockRemoved %+v", x.batches, e)
			}
			for _, h := range e.BlockHashes {
				if _, ok := x.live[h]; !ok {
					x.fail("batch %d: block %#x removed, not stored", x.batches, h)
				}
				delete(x.live, h)
			}
		case *AllBlocksCleared:
			clear(x.live)
		default:
			x.fail("batch %d: an event %T", x.batches, e)
		}
	}
}

// check requires the events so far to describe c's prefix index: the
// same hashes, each with its unit's tokens and parent (none for unit 0);
// and nothing left queued between calls.
func (x *eventIndex) check(t testing.TB, c *Cache, step string) {
	t.Helper()
	if x == nil {
		return
	}
	require.NoError(t, x.errs, step)
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Zero(t, c.ev.queued, step)
	require.Empty(t, c.ev.queue, step)
	require.False(t, c.ev.resync, step)
	want := map[uint64]*storeUnit{}
	if !c.closed {
		want = c.ps.byKey
	}
	require.Len(t, x.live, len(want), step)
	for h, su := range want {
		b, ok := x.live[h]
		require.True(t, ok, "%s: unit %d (%#x) is listed, never told", step, su.u, h)
		require.Equal(t, su.tokens, b.tokens, step)
		require.Equal(t, len(su.tokens), b.blockSize, step)
		if su.u == 0 {
			require.Nil(t, b.parent, step)
		} else {
			require.NotNil(t, b.parent, step)
			require.Equal(t, su.parent, *b.parent, step)
		}
	}
}

// closeChecked requires c's books whole, closes it, and requires the
// events to leave the consumer's index empty (AllBlocksCleared).
func (x *eventIndex) closeChecked(t testing.TB, c *Cache) {
	t.Helper()
	require.NoError(t, c.Check())
	require.NoError(t, c.Close())
	x.check(t, c, "close")
}

// eventOps runs Admit, Append, MarkWritten, Free, Preempt, Resume and
// SetBudget over prompts of two families that share prefixes, under a
// budget small enough to evict.
func eventOps(t testing.TB, c *Cache, after func(step string)) {
	t.Helper()
	for i := range 12 {
		prompt := seqTokens(600+64*(i%3), 300+100*(i%2), 5000*(i+1))
		s := prefill(t, c, prompt, uint64(i%2))
		after(fmt.Sprint("prefill ", i))
		_, err := s.Append([]int{1, 2, 3})
		require.NoError(t, err)
		after(fmt.Sprint("decode ", i))
		if i%4 == 1 {
			require.NoError(t, s.Preempt(Drop))
			after(fmt.Sprint("preempt ", i))
			_, err := s.Resume()
			require.NoError(t, err)
			after(fmt.Sprint("resume ", i))
		}
		require.NoError(t, s.Free())
		after(fmt.Sprint("free ", i))
		if i%5 == 4 {
			_, err := c.SetBudget(c.Stats().Budget/2, Drop)
			require.NoError(t, err)
			after(fmt.Sprint("shrink ", i))
			_, err = c.SetBudget(c.Stats().Budget*2, Drop)
			require.NoError(t, err)
		}
	}
}

// eventsConfig is microConfig with TokenMajor units of 256 tokens (blocks
// of 16) and a budget of 10 pages: prompts of 600 tokens and more publish
// two units each, and a dozen of them evict.
func eventsConfig() Config {
	cfg := microConfig(TokenMajor, 1024, 2)
	cfg.Budget = 10 * page
	return cfg
}

// TestEventsDescribeTheIndex: the events told, applied in order, are the
// prefix index after every call, and AllBlocksCleared empties it at
// Close; units are stored, evicted (for room and by SetBudget), and
// stored again.
func TestEventsDescribeTheIndex(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	cfg := eventsConfig()
	cfg.Events = x.apply
	c := e.cache(t, cfg)
	eventOps(t, c, func(step string) { x.check(t, c, step) })
	st := c.Stats()
	require.Positive(t, st.Evictions, "the budget is small enough to evict")
	require.Zero(t, st.EventPanics)
	require.Zero(t, st.EventsDropped)
	x.closeChecked(t, c)
	require.Greater(t, len(x.ever), 4)
}

// TestEventsPanickingCallback: a callback that takes part of a batch and
// panics, every other batch, is recovered and counted; the cache's books
// stay whole, and the resync sent next leaves the consumer's index right.
// One that always panics costs one try a call, and the cache works on.
func TestEventsPanickingCallback(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	calls := 0
	cfg := eventsConfig()
	cfg.Events = func(b EventBatch) {
		calls++
		if calls%2 == 1 {
			if len(b.Events) > 1 {
				x.apply(EventBatch{TS: b.TS, Events: b.Events[:1]})
			}
			panic("a consumer's bug") // the batch lost, or part of it
		}
		x.apply(b)
	}
	c := e.cache(t, cfg)
	eventOps(t, c, func(step string) {
		require.NoError(t, c.Check(), step)
		x.check(t, c, step)
	})
	st := c.Stats()
	require.Greater(t, calls, 4)
	require.Equal(t, (calls+1)/2, st.EventPanics)
	x.closeChecked(t, c)
	require.NoError(t, c.Check())

	e = hostEnv(t, 64*units.MiB)
	calls = 0
	cfg.Events = func(EventBatch) {
		calls++
		panic("always")
	}
	c = e.cache(t, cfg)
	eventOps(t, c, func(step string) { require.NoError(t, c.Check(), step) })
	require.Equal(t, calls, c.Stats().EventPanics)
	require.Positive(t, calls)
	require.NoError(t, c.Close())
	require.NoError(t, c.Check())
}

// TestEventsReentrantAndDropped: a callback may call the cache (its calls'
// events come after, in order); a queue that overflows while a callback
// runs is dropped, counted, and replaced by a resync that leaves the
// consumer's index right.
func TestEventsReentrantAndDropped(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	var c *Cache
	reentered := false
	cfg := eventsConfig()
	cfg.Events = func(b EventBatch) {
		x.apply(b)
		if !reentered {
			// Inside the callback, calls with events of their own to
			// tell: queued meanwhile, past the queue's bound.
			reentered = true
			for i := range 4 {
				require.NoError(t, prefill(t, c, seqTokens(700, 0, 90000+1000*i), 7).Free())
			}
		}
	}
	c = e.cache(t, cfg)
	c.mu.Lock()
	c.ev.max = 3 // calls queue more than that while the reentrant one runs
	c.mu.Unlock()
	eventOps(t, c, func(step string) { x.check(t, c, step) })
	require.True(t, reentered)
	require.Positive(t, c.Stats().EventsDropped)
	x.closeChecked(t, c)
}

// TestEventsConcurrent: calls from several goroutines, the mapper on:
// the callback is never run by two at once (the race detector watches
// eventIndex, which has no lock), and the events, in the order told,
// still describe the index.
func TestEventsConcurrent(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	cfg := microConfig(TokenMajor, 1024, 4)
	cfg.Budget, cfg.MapAhead = 16*page, 0
	cfg.Events = x.apply
	c := e.cache(t, cfg)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				prompt := seqTokens(520+40*i, 300, 10000*(g+1)+1000*i)
				s, err := c.Admit(prompt, 0)
				if errors.Is(err, driver.ErrBusy) {
					continue
				}
				require.NoError(t, err)
				if _, err := s.Append(prompt[s.Len():]); err == nil {
					require.NoError(t, s.MarkWritten(s.Len()))
				} else {
					require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
				}
				require.NoError(t, s.Free())
			}
		}()
	}
	wg.Wait()
	x.check(t, c, "after the goroutines")
	x.closeChecked(t, c)
	require.Greater(t, len(x.ever), 8)
}

// TestEventsResync: events dropped (the queue full) are replaced by
// AllBlocksCleared and the index as it is then.
func TestEventsResync(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	cfg := eventsConfig()
	cfg.Events = x.apply
	c := e.cache(t, cfg)
	s := prefill(t, c, seqTokens(800, 0, 100), 0)
	require.NoError(t, s.Free())
	require.NotEmpty(t, c.ps.byKey)
	// As if a slow callback had let the queue fill: the next call
	// delivers a resync, whatever it queued.
	c.mu.Lock()
	c.ev.max = 0
	c.mu.Unlock()
	s = prefill(t, c, seqTokens(800, 0, 200), 1)
	c.mu.Lock()
	c.ev.max = maxQueuedEvents
	c.mu.Unlock()
	x.check(t, c, "after a resync")
	require.Positive(t, c.Stats().EventsDropped)
	require.NoError(t, s.Free())
	require.NoError(t, c.Check())
}

// TestEventsNoListener: with no callback nothing is queued, and Append
// allocates no more than with one (in a decode step that tells nothing).
func TestEventsNoListener(t *testing.T) {
	allocs := func(events func(EventBatch)) float64 {
		e := hostEnv(t, 64*units.MiB)
		cfg := eventsConfig()
		cfg.Events = events
		c := e.cache(t, cfg)
		eventOps(t, c, func(string) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if events == nil {
				require.Nil(t, c.ev.queue)
				require.Zero(t, c.ev.queued)
			}
		})
		s := prefill(t, c, seqTokens(600, 0, 300), 0)
		n := testing.AllocsPerRun(50, func() {
			_, err := s.Append([]int{1})
			require.NoError(t, err)
		})
		require.NoError(t, s.Free())
		require.NoError(t, c.Close())
		return n
	}
	without := allocs(nil)
	with := allocs(func(EventBatch) {})
	require.Equal(t, with, without, "a decode step with and without a listener")
}

// TestEventsJSONLines: EventWriter's lines, against a golden file
// (testdata/events.jsonl, written by this test with
// VMARENA_WRITE_GOLDEN=1).
func TestEventsJSONLines(t *testing.T) {
	parent := uint64(0xfedcba9876543210)
	rank := 1
	ts := time.Unix(1764219600, 123456000)
	batches := []EventBatch{
		{TS: ts, Events: []Event{
			&BlockStored{BlockHashes: []uint64{11, 12}, TokenIDs: []int{1, 2, 3, 4}, BlockSize: 2, Medium: EventMedium},
			&BlockStored{BlockHashes: []uint64{13}, ParentBlockHash: &parent, TokenIDs: []int{5, 6}, BlockSize: 2, Medium: EventMedium},
		}},
		{TS: ts.Add(time.Second), Events: []Event{&BlockRemoved{BlockHashes: []uint64{13, 12}, Medium: EventMedium}, &AllBlocksCleared{}}},
	}
	var buf bytes.Buffer
	w := &EventWriter{W: &buf}
	w.Write(batches[0])
	w.Rank = &rank
	w.Write(batches[1])
	require.NoError(t, w.Err)
	golden := filepath.Join("testdata", "events.jsonl")
	if os.Getenv("VMARENA_WRITE_GOLDEN") == "1" {
		require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), buf.String())
	// Each line is one JSON object; hashes decode whole as integers.
	for _, line := range bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n")) {
		var v struct {
			Events []struct {
				Type            string   `json:"type"`
				ParentBlockHash *uint64  `json:"parent_block_hash"`
				BlockHashes     []uint64 `json:"block_hashes"`
			} `json:"events"`
		}
		require.NoError(t, json.Unmarshal(line, &v))
		require.NotEmpty(t, v.Events)
	}

	// Refused: an event of another type, a nil one; nothing written.
	type other struct{ Event }
	for _, bad := range []Event{other{}, (*BlockStored)(nil)} {
		_, err := MarshalEventBatch(EventBatch{Events: []Event{bad}}, nil)
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	}
	buf.Reset()
	w.Write(EventBatch{Events: []Event{other{}}})
	require.True(t, errors.Is(w.Err, driver.ErrInvalid))
	require.Zero(t, buf.Len())
	w.Write(batches[0])
	require.Zero(t, buf.Len(), "nothing once a write failed")
	var nilW *EventWriter
	nilW.Write(batches[0])

	// A writer that fails: its error is kept, and nothing is written after.
	fw := &failingWriter{}
	w = &EventWriter{W: fw}
	w.Write(batches[0])
	require.ErrorIs(t, w.Err, errDiskFull)
	w.Write(batches[1])
	require.Equal(t, 1, fw.calls, "nothing is written once a write failed")
}

var errDiskFull = errors.New("disk full")

// failingWriter refuses every write, counting them.
type failingWriter struct{ calls int }

func (f *failingWriter) Write([]byte) (int, error) {
	f.calls++
	return 0, errDiskFull
}

// BenchmarkEvents: a prefill cycle (Admit, Append of the prompt,
// MarkWritten, Free: two units published, and as many evicted once the
// budget is full) on the sim driver, with no listener (the baseline), a
// callback that does nothing, and EventWriter encoding JSON lines to
// io.Discard, in one run. Reports each's ns a cycle and the ratios to the
// baseline (noop/none, json/none). Never asserted.
func BenchmarkEvents(b *testing.B) {
	kinds := []struct {
		name   string
		events func(EventBatch)
	}{
		{"none", nil},
		{"noop", func(EventBatch) {}},
		{"json", (&EventWriter{W: io.Discard}).Write},
	}
	caches := make([]*Cache, len(kinds))
	for i, k := range kinds {
		e := simEnv(b, 64*units.MiB, page)
		cfg := eventsConfig()
		cfg.Events = k.events
		caches[i] = e.cache(b, cfg)
	}
	prompts := make([][]int, 64)
	for i := range prompts {
		prompts[i] = seqTokens(600, 300, 1000*(i+1))
	}
	cycle := func(c *Cache, prompt []int) {
		s, err := c.Admit(prompt, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Append(prompt[s.Len():]); err != nil {
			b.Fatal(err)
		}
		if err := s.MarkWritten(s.Len()); err != nil {
			b.Fatal(err)
		}
		if err := s.Free(); err != nil {
			b.Fatal(err)
		}
	}
	spent := make([]time.Duration, len(kinds))
	n := 0
	for b.Loop() {
		p := prompts[n%len(prompts)]
		for i, c := range caches {
			t0 := time.Now()
			cycle(c, p)
			spent[i] += time.Since(t0)
		}
		n++
	}
	for i, k := range kinds {
		b.ReportMetric(float64(spent[i].Nanoseconds())/float64(n), k.name+"-ns")
		require.NoError(b, caches[i].Close())
	}
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "noop/none")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "json/none")
	b.ReportMetric(0, "ns/op")
}
