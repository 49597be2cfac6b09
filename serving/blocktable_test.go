package serving

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// TestBlockTableByHand drives a block table of 8 blocks through
// admissions, shared prefixes, a refusal, eviction and a preemption, and
// checks every figure against the blocks worked out below (block ids in
// brackets; the free list is handed out from its head, ids 0 to 7 at
// first).
func TestBlockTableByHand(t *testing.T) {
	const K = units.KiB
	_, err := NewBlockTable(Config{Model: tinyModel, Budget: 128 * units.KiB, MaxContext: 129, MaxSeqs: 4})
	require.ErrorIs(t, err, driver.ErrInvalid, "Config.Check refuses it")
	tbl, err := NewBlockTable(tinyConfig)
	require.NoError(t, err)
	require.Equal(t, 8, tbl.Blocks())
	step := func(err error) {
		t.Helper()
		require.NoError(t, err)
		require.NoError(t, tbl.Check())
	}
	start := func(r *SimRequest, want int, resume bool) {
		t.Helper()
		require.True(t, tbl.CanAdmit(r))
		var held int
		var err error
		if resume {
			held, err = tbl.Resume(r)
		} else {
			held, err = tbl.Admit(r)
		}
		step(err)
		require.Equal(t, want, held)
	}

	// a: 40 tokens of its own, in [0 1 2], the last with 8.
	a := simReq(0, 40, 10)
	start(a, 0, false)
	step(tbl.Append(a, 40))
	require.Equal(t, Stats{InUse: 48 * K, Stored: 40 * K, Logical: 40 * K, Commits: 3, PrefixQueried: 32}, tbl.Stats())

	// b and c: the same 40 prompt tokens (hash id 7). b fills [3 4 5] and
	// caches its two full blocks; c finds them (32 tokens: not the last
	// block, which is partial) and takes [6] for the other 8.
	b, c := simReq(1, 40, 10, 7), simReq(2, 40, 10, 7)
	start(b, 0, false)
	step(tbl.Append(b, 40))
	start(c, 32, false)
	step(tbl.Append(c, 8))
	st := tbl.Stats()
	require.Equal(t, Stats{InUse: 112 * K, Stored: 88 * K, Logical: 120 * K, Commits: 7, PrefixQueried: 96, PrefixHit: 32}, st)
	require.Equal(t, 24*K, st.Waste())
	require.Equal(t, 32*K, st.Saved())

	// a's 41st token takes [7], the last free block; b's does not fit, and
	// no one else is admitted.
	step(tbl.Append(a, 9))
	before, beforeStr := tbl.Stats(), tbl.String()
	err = tbl.Append(b, 9)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.ErrorContains(t, err, "append 9 tokens to request 1 (40 held): needs 1 more blocks of 16 tokens, 0 of 8 are free")
	require.Equal(t, before, tbl.Stats())
	require.Equal(t, beforeStr, tbl.String())
	require.False(t, tbl.CanAdmit(simReq(3, 1, 1)))

	// a finishes: [7 2 1 0] go to the free list in that order, last block
	// first; its full blocks [0 1 2] stay cached. b's 9 more tokens fill
	// [5] and take [7], which held nothing cached.
	step(tbl.Finish(a))
	require.Equal(t, "paged: 8 blocks of 16 tokens: 4 in use (48 tokens stored), 4 free (3 cached), 2 sequences", tbl.String())
	step(tbl.Append(b, 9))
	require.Equal(t, int64(0), tbl.Stats().Evictions)

	// c is preempted: [6] is freed, b keeps [3 4]. c resumes from them and
	// takes the head of the free list, [2]: a's third block is evicted.
	recompute, err := tbl.Preempt(c)
	step(err)
	require.True(t, recompute)
	require.Equal(t, Stats{InUse: 64 * K, Stored: 49 * K, Logical: 49 * K, Cached: 48 * K, Commits: 9, PrefixQueried: 96, PrefixHit: 32}, tbl.Stats())
	start(c, 32, true)
	step(tbl.Append(c, 8))
	require.Equal(t, int64(1), tbl.Stats().Evictions)

	// a comes back (the same request, so the same tokens): its first two
	// blocks are still cached, [1 0], its third is gone; it takes [6].
	// Stored: b's 49 tokens, c's 8 past the 32 it shares, a's 40; the
	// sequences see 49 + 40 + 40.
	start(a, 32, false)
	step(tbl.Append(a, 8))
	require.Equal(t, Stats{InUse: 128 * K, Stored: 97 * K, Logical: 129 * K, Commits: 11, PrefixQueried: 160, PrefixHit: 96, Evictions: 1}, tbl.Stats())
	require.Equal(t, "paged: 8 blocks of 16 tokens: 8 in use (97 tokens stored), 0 free (0 cached), 3 sequences", tbl.String())

	for _, r := range []*SimRequest{b, c, a} {
		step(tbl.Finish(r))
	}
	st = tbl.Stats()
	require.Zero(t, st.InUse)
	require.Zero(t, st.Logical)
	require.Equal(t, "paged: 8 blocks of 16 tokens: 0 in use (0 tokens stored), 8 free (5 cached), 0 sequences", tbl.String(),
		"cached: b's full blocks [3 4 5] and a's [1 0]; b's [7], c's [2] and a's [6] are partial")
}

// TestBlockTableMisuse: each call in the wrong state, or with a bad
// argument, is driver.ErrInvalid and changes nothing.
func TestBlockTableMisuse(t *testing.T) {
	tbl, err := NewBlockTable(tinyConfig)
	require.NoError(t, err)
	a, b := simReq(0, 20, 5), simReq(1, 20, 5)
	_, err = tbl.Admit(a)
	require.NoError(t, err)
	require.NoError(t, tbl.Append(a, 20))
	before, beforeStr := tbl.Stats(), tbl.String()
	for _, tc := range []struct {
		name string
		call func() error
		says string
	}{
		{"admit running", func() error { _, err := tbl.Admit(a); return err }, "admit request 0: it is running already"},
		{"resume running", func() error { _, err := tbl.Resume(a); return err }, "resume request 0: it is running already"},
		{"append to waiting", func() error { return tbl.Append(b, 1) }, "append to request 1: it is not running"},
		{"append negative", func() error { return tbl.Append(a, -1) }, "append -1 tokens to request 0"},
		{"finish waiting", func() error { return tbl.Finish(b) }, "finish request 1: it is not running"},
		{"preempt waiting", func() error { _, err := tbl.Preempt(b); return err }, "preempt request 1: it is not running"},
		{"admit nil", func() error { _, err := tbl.Admit(nil); return err }, "admit: the request is nil"},
		{"append nil", func() error { return tbl.Append(nil, 1) }, "append: the request is nil"},
		{"finish nil", func() error { return tbl.Finish(nil) }, "finish: the request is nil"},
		{"preempt nil", func() error { _, err := tbl.Preempt(nil); return err }, "preempt: the request is nil"},
		{"resume nil", func() error { _, err := tbl.Resume(nil); return err }, "resume: the request is nil"},
	} {
		err := tc.call()
		require.ErrorIs(t, err, driver.ErrInvalid, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
		require.Equal(t, before, tbl.Stats(), tc.name)
		require.Equal(t, beforeStr, tbl.String(), tc.name)
		require.NoError(t, tbl.Check())
	}
	require.False(t, tbl.CanAdmit(nil))
	require.False(t, tbl.CanAdmit(a), "running already")
	require.NoError(t, tbl.Append(a, 0), "nothing to add")
	require.Equal(t, before, tbl.Stats())
}

// TestPagedBudgetPastMaxBlocks: a budget of more blocks than MaxBlocks (a
// large budget over a tiny token, in blocks of one token) is refused by
// both paged schemes, naming MaxBlocks, before a block is built; the
// plain table's pool was built whole (693 million blocks, 16 GiB of books,
// for 80 GiB over a 124-byte token) and a hostile config ran the process
// out of memory.
func TestPagedBudgetPastMaxBlocks(t *testing.T) {
	m := Model{Name: "tiny-token", Layers: 31, KVHeads: 2, HeadDim: 1, ElemBytes: 1, QueryHeads: 2, Params: 1 << 20}
	cfg := Config{Model: m, Budget: 80 * units.GiB, MaxContext: 256, MaxSeqs: 4, BlockTokens: 1}
	require.NoError(t, cfg.Check())
	_, err := NewBlockTable(cfg)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "more than MaxBlocks")
	_, err = NewHybridBlockTable(cfg)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "more than MaxBlocks")
	cfg.Budget = 1024 * m.TokenBytes()
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	require.Equal(t, 1024, tbl.Blocks())
}
