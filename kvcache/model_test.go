package kvcache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// The model-based test: random sequences of operations run against the
// cache and against a plain model of its slots, compared after every
// step. The operations are decoded from bytes, so `go test -fuzz
// FuzzCacheModel` explores them; the seed corpus is in
// testdata/fuzz/FuzzCacheModel (VMARENA_WRITE_CORPUS=1 go test -run
// TestSeedCorpus ./kvcache writes it afresh).

// opKind is what one step does.
type opKind uint8

const (
	opAdmit opKind = iota
	opAppend
	opAppendMore
	opFree
	opVerify
	opPreempt
	opResume
	opSetBudget
	opStep
	opFork
	opReserve
	opWarm
	numOpKinds
)

// op is one decoded step. seq picks a live sequence (modulo their
// number); n is a size whose meaning depends on the kind; family and
// extra shape an admitted prompt.
type op struct {
	kind   opKind
	seq    int
	n      int
	family int
	extra  uint64
}

// opBytes is the encoded size of one op; the first byte of the input
// configures the run.
const opBytes = 4

// decode reads the config byte and the ops of data; trailing bytes that
// make no whole op are ignored.
func decode(data []byte) (cfg byte, ops []op) {
	if len(data) == 0 {
		return 0, nil
	}
	cfg, data = data[0], data[1:]
	for i := 0; i+opBytes <= len(data); i += opBytes {
		b := data[i : i+opBytes]
		ops = append(ops, op{kind: opKind(b[0] % byte(numOpKinds)), seq: int(b[1]), n: int(b[2]), family: int(b[3] % 4), extra: uint64(b[3] / 4 % 2)})
	}
	return cfg, ops
}

// encode is decode's inverse (for ops decode could have made).
func encode(cfg byte, ops []op) []byte {
	out := []byte{cfg}
	for _, o := range ops {
		out = append(out, byte(o.kind), byte(o.seq), byte(o.n), byte(o.family)+4*byte(o.extra))
	}
	return out
}

func randomInput(rng *rand.Rand, n int) []byte {
	b := make([]byte, 1+opBytes*n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	// Admit, and fork, more often than the bytes alone would.
	for i := 1; i < len(b); i += opBytes {
		switch rng.UintN(12) {
		case 0, 1, 2:
			b[i] = byte(opAdmit)
		case 3:
			b[i] = byte(opFork)
		}
	}
	return b
}

// mslot, mseq and munit are the model's slot, sequence and prefix store
// unit.
type mslot struct {
	owned    []bool
	borrowed []*munit
	// kept are the store units left mapped by the slot's last sequence
	// (kept.go), by unit.
	kept    []*munit
	seq     *mseq
	freedAt int
	// cleared is the cache's slot.cleared: clearKept walked the slot
	// since its last sequence left, or a match first borrowed a unit it
	// keeps.
	cleared bool
}

type mseq struct {
	real      *Seq
	slot      int
	prompt    []int
	tokens    []int
	extra     uint64
	admitted  int
	preempted PreemptMode // 0 while running
	matched   int
	// forked says the slot's shared units are a fork's (forkShared of
	// them: fork_test.go) rather than what its match found.
	forked     bool
	forkShared int
}

type munit struct {
	u                 int
	key, parent       string
	tokens            []int
	refs              int
	owner             *mseq
	published, listed bool
	private           bool // a fork's: never listed, freed when let go
	// hits counts the admissions and resumes whose match borrowed it.
	hits int
}

type model struct {
	g      *geometry
	slots  []*mslot
	seqs   []*mseq
	pages  int
	budget int // pages
	// pooled is the page pool: pages decommitted and kept for the next
	// commits, within the budget beside pages; created counts the pages
	// commits created (what the pool did not hold).
	pooled, created int
	tick            int
	// The prefix store: listed units by key and in listing order, cached
	// units in LRU order (least recently used first).
	sharing bool
	byKey   map[string]*munit
	listed  []*munit
	lru     []*munit
	copies  int
	// forks and cowCopies count Seq.Fork's children and copies on write;
	// replaced the cached units a written one took the place of.
	forks, cowCopies, replaced int
	// keptReused and keptDropped count kept mappings borrowed again and
	// unmapped.
	keptReused, keptDropped int
}

// keyOf is the model's exact key of a prefix.
func keyOf(extra uint64, tokens []int) string { return fmt.Sprint(extra, tokens) }

func (m *model) up() int { return m.g.unitPages() }

func (m *model) free() int { return m.budget - m.pages }

// release gives n pages back: to the pool, up to the budget.
func (m *model) release(n int) {
	m.pages -= n
	m.pooled += n
}

// take commits n pages: from the pool first.
func (m *model) take(n int) {
	m.created += max(n-m.pooled, 0)
	m.pages += n
	m.pooled -= min(m.pooled, n)
}

// trim is SetBudget's: the pool fits beside the pages in use.
func (m *model) trim() { m.pooled = min(m.pooled, max(m.budget-m.pages, 0)) }

// pickSlot is the cache's pickSlotLocked for a match of units: of the
// lowest free slot keeping the deepest of units the probes (the last,
// then halfway down, to the first) find, and the free slot with the
// fewest units kept mapped, then the most pages kept (the lowest of
// those), the one whose unmaps (unmapMaps maps each) and maps cost less,
// the kept slot on a tie; or -1.
func (m *model) pickSlot(units []*munit) int {
	kept := -1
probes:
	for i := len(units) - 1; i >= 0; i /= 2 {
		for k, sl := range m.slots {
			if sl.seq == nil && sl.kept[i] == units[i] {
				kept = k
				break probes
			}
		}
		if i == 0 {
			break
		}
	}
	pick := m.fewestKept()
	if kept < 0 || kept == pick {
		return pick
	}
	reused := 0
	for u, mu := range units {
		reused += b2i(m.slots[kept].kept[u] == mu)
	}
	if (m.keptIn(m.slots[kept])-reused)*unmapMaps <= m.keptIn(m.slots[pick])*unmapMaps+reused {
		return kept
	}
	return pick
}

// fewestKept is the cache's fewestKeptFreeLocked: the free slot keeping
// the fewest units mapped, then the most pages kept, the lowest of
// those; -1 when none is free.
func (m *model) fewestKept() int {
	pick := -1
	for k, sl := range m.slots {
		if sl.seq != nil {
			continue
		}
		if pick < 0 {
			pick = k
			continue
		}
		o, po := m.ownedFrom(sl, 0), m.ownedFrom(m.slots[pick], 0)
		if n, pn := m.keptIn(sl), m.keptIn(m.slots[pick]); n < pn || (n == pn && o > po) {
			pick = k
		}
	}
	return pick
}

// keptIn counts the units sl keeps mapped.
func (m *model) keptIn(sl *mslot) (n int) {
	for _, mu := range sl.kept {
		n += b2i(mu != nil)
	}
	return n
}

// leave is Free's (keepOwned) and Preempt's give-back of sl: from its
// last unit down, a borrowed listed unit is kept mapped, any other
// borrowed unit given back, an owned one decommitted unless keepOwned.
func (m *model) leave(sl *mslot, keepOwned bool) {
	sl.cleared = false
	for u := len(sl.owned) - 1; u >= 0; u-- {
		if mu := sl.borrowed[u]; mu != nil && mu.listed {
			sl.borrowed[u] = nil
			sl.kept[u] = mu
			mu.refs--
			if mu.refs == 0 {
				m.lru = append(m.lru, mu)
			}
			continue
		}
		if sl.borrowed[u] != nil || (sl.owned[u] && !keepOwned) {
			m.drop(sl, u)
		}
	}
}

// takeKept is the cache's takeKeptLocked: sl's kept units that hold
// units' at their place are borrowed again (apply books the borrow),
// the rest unmapped.
func (m *model) takeKept(sl *mslot, units []*munit) {
	for u, mu := range sl.kept {
		if mu == nil {
			continue
		}
		sl.kept[u] = nil
		if u < len(units) && units[u] == mu {
			m.keptReused++
		} else {
			m.keptDropped++
		}
	}
}

// ownedFrom counts the units of sl from u on that it owns.
func (m *model) ownedFrom(sl *mslot, u int) (n int) {
	for _, o := range sl.owned[u:] {
		if o {
			n++
		}
	}
	return n
}

// drop gives back unit u of sl: decommitted if owned, given back to the
// store if borrowed.
func (m *model) drop(sl *mslot, u int) {
	switch {
	case sl.owned[u]:
		sl.owned[u] = false
		m.release(m.up())
	case sl.borrowed[u] != nil:
		mu := sl.borrowed[u]
		sl.borrowed[u] = nil
		mu.refs--
		mu.owner = nil
		if mu.refs == 0 {
			if mu.listed {
				m.lru = append(m.lru, mu)
			} else {
				m.release(m.up())
			}
		}
	}
}

// reclaimFrom is the cache's page-aware reclaim of one slot, from unit
// from on: whole, or unit by unit from its end.
func (m *model) reclaimFrom(sl *mslot, from, need int) {
	owned := m.ownedFrom(sl, from)
	if owned == 0 {
		return
	}
	if m.free()+owned*m.up() <= need {
		for u := from; u < len(sl.owned); u++ {
			m.drop(sl, u)
		}
		return
	}
	for u := len(sl.owned) - 1; u >= from && m.free() < need; u-- {
		if sl.owned[u] {
			m.drop(sl, u)
		}
	}
}

// surplusFrom is the first unit of sl past its sequence's tokens.
func (m *model) surplusFrom(sl *mslot, keep *mslot, keepUnits int) int {
	from := m.g.unitsFor(len(sl.seq.tokens))
	if sl == keep {
		from = max(from, keepUnits)
	}
	return min(from, len(sl.owned))
}

// makeRoom is the cache's: false (and nothing changed) when idle, cached
// and surplus pages together are not enough.
func (m *model) makeRoom(need int, keep *mslot, keepUnits int) bool {
	if need <= m.free() {
		return true
	}
	if m.room(keep, keepUnits) < need {
		return false
	}
	m.reclaim(need, keep, keepUnits)
	return true
}

// room is what makeRoom can give: free, idle, cached and surplus pages,
// keep's below keepUnits aside.
func (m *model) room(keep *mslot, keepUnits int) int {
	idle, surplus := 0, 0
	for _, sl := range m.slots {
		if sl.seq == nil {
			if sl != keep {
				idle += m.ownedFrom(sl, 0) * m.up()
			}
			continue
		}
		surplus += m.ownedFrom(sl, m.surplusFrom(sl, keep, keepUnits)) * m.up()
	}
	return m.free() + idle + len(m.lru)*m.up() + surplus
}

// reclaim gives back idle slots' pages (longest idle first), cached units
// (least recently used first), then surplus pages, until need more fit.
func (m *model) reclaim(need int, keep *mslot, keepUnits int) {
	m.reclaimIdle(need, keep)
	m.evict(need)
	for _, sl := range m.slots {
		if m.free() >= need {
			break
		}
		if sl.seq != nil {
			m.reclaimFrom(sl, m.surplusFrom(sl, keep, keepUnits), need)
		}
	}
}

// reclaimIdle gives back idle slots' pages, longest idle first, until
// need more fit.
func (m *model) reclaimIdle(need int, keep *mslot) {
	var idles []*mslot
	for _, sl := range m.slots {
		if sl.seq == nil && sl != keep && m.ownedFrom(sl, 0) > 0 {
			idles = append(idles, sl)
		}
	}
	slices.SortFunc(idles, func(a, b *mslot) int { return a.freedAt - b.freedAt })
	for _, sl := range idles {
		if m.free() >= need {
			break
		}
		m.reclaimFrom(sl, 0, need)
	}
}

// evict evicts cached units, least recently used first, until need fit.
func (m *model) evict(need int) {
	for m.free() < need && len(m.lru) > 0 {
		mu := m.lru[0]
		m.lru = m.lru[1:]
		m.dropCached(mu)
	}
}

// dropCached frees mu, a cached unit out of the LRU list: unlisted, its
// kept mappings unmapped, its pages back.
func (m *model) dropCached(mu *munit) {
	m.unlist(mu)
	for _, sl := range m.slots {
		if sl.kept[mu.u] == mu {
			sl.kept[mu.u] = nil
			m.keptDropped++
		}
	}
	m.release(m.up())
}

func (m *model) unlist(mu *munit) {
	if mu.listed {
		mu.listed = false
		delete(m.byKey, mu.key)
		m.listed = slices.DeleteFunc(m.listed, func(x *munit) bool { return x == mu })
	}
}

// storeBound reports whether unit u of s goes to the store.
func (m *model) storeBound(s *mseq, u int) bool {
	_, end := m.g.unitTokens(u)
	return m.sharing && end <= len(s.prompt)
}

// back is the cache's backLocked: every empty unit below need becomes a
// store unit (a whole prompt unit) or the slot's own, and so does every
// page the slot kept from its last sequence (owned, past s's tokens)
// under a whole prompt unit: given back, its memory the room for the
// store unit's. It returns the units it backed, or false when the budget
// cannot hold the empty ones.
func (m *model) back(s *mseq, need int) ([]int, bool) {
	sl := m.slots[s.slot]
	var todo []int
	empty := 0
	for u := 0; u < need; u++ {
		switch {
		case !sl.owned[u] && sl.borrowed[u] == nil:
			todo = append(todo, u)
			empty++
		case sl.owned[u] && u >= m.g.unitsFor(len(s.tokens)) && m.storeBound(s, u):
			todo = append(todo, u)
		}
	}
	if len(todo) == 0 {
		return nil, true
	}
	if !m.makeRoom(empty*m.up(), sl, need) {
		return nil, false
	}
	for _, u := range todo {
		m.drop(sl, u) // a kept page; nothing for an empty unit
		if m.storeBound(s, u) {
			start, end := m.g.keyTokens(u)
			sl.borrowed[u] = &munit{u: u, key: keyOf(s.extra, s.prompt[:end]), parent: keyOf(s.extra, s.prompt[:start]),
				tokens: slices.Clone(s.prompt[start:end]), refs: 1, owner: s}
		} else {
			sl.owned[u] = true
		}
		m.take(m.up())
	}
	return todo, true
}

// next is the cnt tokens of s after its first have: its prompt's, then
// fresh ones.
func (s *mseq) next(have, cnt int, fresh *int) []int {
	more := make([]int, cnt)
	for j := range more {
		if p := have + j; p < len(s.prompt) {
			more[j] = s.prompt[p]
		} else {
			more[j] = *fresh
			*fresh++
		}
	}
	return more
}

// reserve is the cache's Reserve: the units past s's tokens, up to those
// n more tokens reach, that fit in the free budget, idle slots' pages
// and cached units' are backed as back backs them (the room made
// without another sequence's surplus); it returns how many of the n
// tokens have their pages then.
func (m *model) reserve(s *mseq, n int) int {
	sl := m.slots[s.slot]
	have := len(s.tokens)
	from, need := m.g.unitsFor(have), m.g.unitsFor(have+n)
	// The free budget, idle slots' pages and cached units': what
	// makeRoom gives without another sequence's surplus.
	idle := 0
	for _, o := range m.slots {
		if o.seq == nil {
			idle += m.ownedFrom(o, 0) * m.up()
		}
	}
	free, k := m.free()+idle+len(m.lru)*m.up(), from
	for ; k < need; k++ {
		if !sl.owned[k] && sl.borrowed[k] == nil {
			if free < m.up() {
				break
			}
			free -= m.up()
		}
	}
	if k > from {
		if _, ok := m.back(s, k); !ok {
			panic("model: a reservation that fits does not")
		}
	}
	j := from
	for j < len(sl.owned) && (sl.borrowed[j] != nil || (sl.owned[j] && !m.storeBound(s, j))) {
		j++
	}
	if j == len(sl.owned) {
		return n
	}
	return min(max(m.g.roomIn(j)-have, 0), n)
}

// publish makes s's written store units matchable.
func (m *model) publish(s *mseq, upTo int) {
	sl := m.slots[s.slot]
	for u, mu := range sl.borrowed {
		if mu == nil || mu.owner != s {
			continue
		}
		if _, end := m.g.unitTokens(u); end > upTo {
			continue
		}
		mu.owner, mu.published = nil, true
		old := m.byKey[mu.key]
		if old != nil && (old.refs > 0 || old.u != mu.u || !slices.Equal(old.tokens, mu.tokens)) {
			continue
		}
		if old != nil {
			m.replaced++
			// A cached unit of the same tokens no one maps: mu takes
			// its place, old's pages go back (replaceListedLocked).
			m.lru = slices.DeleteFunc(m.lru, func(x *munit) bool { return x == old })
			m.dropCached(old)
		}
		mu.listed = true
		m.byKey[mu.key] = mu
		m.listed = append(m.listed, mu)
	}
}

// markWritten, when mark and s runs, marks s's tokens written (all were:
// writeStep) and publishes them; otherwise s ends, or is preempted, with
// its last Append's rows unmarked, and they are never published.
func (m *model) markWritten(t *testing.T, s *mseq, mark bool, step string) {
	if !mark || s.preempted != 0 {
		return
	}
	require.NoError(t, s.real.MarkWritten(len(s.tokens)), step)
	m.publish(s, len(s.tokens))
}

// mmatch is what find finds.
type mmatch struct {
	units   []*munit
	tokens  int
	partial *munit
}

// find is the cache's findFromLocked, on exact keys.
func (m *model) find(tokens, prompt []int, extra uint64, limit int) mmatch {
	var r mmatch
	if !m.sharing || limit <= 0 {
		return r
	}
	g := m.g
	u := 0
	for ; u < g.units; u++ {
		_, end := g.unitTokens(u)
		if end > limit || end > len(prompt) {
			break
		}
		mu := m.byKey[keyOf(extra, prompt[:end])]
		if mu == nil || mu.u != u {
			break
		}
		r.units = append(r.units, mu)
	}
	if b, copyNext, tokens := g.cut(u); b != u || copyNext {
		if copyNext {
			r.partial = r.units[b]
		}
		r.units, r.tokens = r.units[:b], tokens
		return r
	}
	start, _ := g.unitTokens(u)
	r.tokens = start
	if u == g.units || start >= len(prompt) {
		return r
	}
	whole := g.roomIn(u + 1)
	parent, best := keyOf(extra, prompt[:start]), 0
	for _, mu := range m.listed {
		if mu.parent != parent || mu.u != u {
			continue
		}
		n := 0
		for n < len(mu.tokens) && start+n < whole && start+n < limit && start+n < len(prompt) && mu.tokens[n] == tokens[start+n] {
			n++
		}
		if (start+n)/g.block*g.block > start+best {
			best, r.partial = (start+n)/g.block*g.block-start, mu
		}
	}
	if r.partial != nil {
		r.tokens = start + best
	}
	return r
}

// apply is the cache's applyMatchLocked.
func (m *model) apply(s *mseq, r mmatch, copy bool) []int {
	sl := m.slots[s.slot]
	k := len(r.units)
	s.matched = 0
	if !copy {
		r.partial = nil
	}
	m.takeKept(sl, r.units)
	if k == 0 && r.partial == nil {
		return nil
	}
	for u := 0; u < k; u++ {
		if sl.owned[u] {
			m.drop(sl, u)
		}
	}
	var backed []int
	for u, mu := range r.units {
		if mu.refs == 0 {
			m.lru = slices.DeleteFunc(m.lru, func(x *munit) bool { return x == mu })
		}
		mu.refs++
		sl.borrowed[u] = mu
		backed = append(backed, u)
	}
	if p := r.partial; p != nil {
		if p.refs == 0 {
			m.lru = slices.DeleteFunc(m.lru, func(x *munit) bool { return x == p })
		}
		p.refs++
		bound := m.storeBound(s, k)
		owned, empty := sl.owned[k], !sl.owned[k] && sl.borrowed[k] == nil
		ok := true
		if empty || (owned && bound) {
			ok = m.makeRoom(m.up(), sl, k+1)
		}
		if ok {
			if owned && bound {
				m.drop(sl, k)
			}
			if !sl.owned[k] && sl.borrowed[k] == nil {
				b, _ := m.back(s, k+1)
				backed = append(backed, b...)
			}
			m.copies++
		} else {
			r.partial = nil
		}
		p.refs--
		if p.refs == 0 {
			m.lru = append(m.lru, p)
		}
		if a := m.g.cleanBelow(k); !ok && a < k {
			for u := k - 1; u >= a; u-- {
				m.drop(sl, u)
			}
			backed, k = backed[:a], a
		}
	}
	if r.partial == nil {
		r.tokens, _ = m.g.unitTokens(k)
	}
	s.matched = r.tokens
	for _, mu := range r.units[:k] {
		if mu.hits == 0 {
			for _, x := range m.slots {
				if x.kept[mu.u] == mu {
					x.cleared = false
				}
			}
		}
		mu.hits++
	}
	return backed
}

// clearKept is the cache's ClearKept: of the free slots keeping units it
// has not walked, oldest free first (the lowest of those), each loses
// the kept units above the last one a match borrowed — none where it
// keeps no such unit — from its last down, until pages pages' units are
// gone. It returns the pages unmapped.
func (m *model) clearKept(pages int) int {
	most, n := pages/m.up(), 0
	for {
		pick := -1
		for k, sl := range m.slots {
			if sl.seq == nil && !sl.cleared && m.keptIn(sl) > 0 && (pick < 0 || sl.freedAt < m.slots[pick].freedAt) {
				pick = k
			}
		}
		if pick < 0 {
			return n * m.up()
		}
		sl := m.slots[pick]
		shared := len(sl.kept) - 1
		for shared >= 0 && (sl.kept[shared] == nil || sl.kept[shared].hits == 0) {
			shared--
		}
		for u := len(sl.kept) - 1; u > shared && shared >= 0; u-- {
			if sl.kept[u] == nil {
				continue
			}
			if n == most {
				return n * m.up()
			}
			sl.kept[u] = nil
			m.keptDropped++
			n++
		}
		sl.cleared = true
	}
}

// canAdmit is the cache's CanAdmit: the slot Admit would take, and
// whether the pages the prompt and out more tokens need there — less
// those it would borrow and those the slot keeps — fit once idle, cached
// and surplus pages are given back, the slot's own pages under the
// borrowed ones and past the tokens' units with them.
func (m *model) canAdmit(prompt []int, extra uint64, out, maxCtx int) bool {
	if len(prompt) > maxCtx {
		return false
	}
	shared := m.find(prompt, prompt, extra, len(prompt)-1).units
	pick := m.pickSlot(shared)
	if pick < 0 {
		return false
	}
	sl := m.slots[pick]
	total := min(len(prompt)+out, maxCtx)
	need, room := 0, m.free()
	for u := range shared {
		if sl.owned[u] {
			room += m.up()
		}
	}
	for u := len(shared); u < m.g.unitsFor(total); u++ {
		if !sl.owned[u] {
			need += m.up()
		}
	}
	room += m.ownedFrom(sl, m.g.unitsFor(total)) * m.up()
	room += len(m.lru) * m.up()
	for _, mu := range shared {
		if mu.refs == 0 {
			room -= m.up()
		}
	}
	for _, x := range m.slots {
		switch {
		case x == sl:
		case x.seq == nil:
			room += m.ownedFrom(x, 0) * m.up()
		default:
			room += m.ownedFrom(x, m.surplusFrom(x, sl, len(sl.owned))) * m.up()
		}
	}
	return need <= room
}

// canResume is the cache's plan of a Resume of s (preempted) and an
// Append of more tokens: every unit below theirs but those the store
// lends needs a page; the room is
// the free pages, the idle slots' and the surplus, and the cached units
// but those it borrows.
func (m *model) canResume(s *mseq, more, maxCtx int) bool {
	limit := len(s.tokens)
	if s.preempted == Drop {
		limit--
	}
	shared := m.find(s.tokens, s.prompt, s.extra, limit).units
	need := (m.g.unitsFor(min(len(s.tokens)+more, maxCtx)) - len(shared)) * m.up()
	room := m.free() + len(m.lru)*m.up()
	for _, mu := range shared {
		if mu.refs == 0 {
			room -= m.up()
		}
	}
	for _, x := range m.slots {
		switch {
		case x.seq == nil:
			room += m.ownedFrom(x, 0) * m.up()
		case x.seq.preempted == 0:
			room += m.ownedFrom(x, m.g.unitsFor(len(x.seq.tokens))) * m.up()
		}
	}
	return need <= room
}

// preempt takes s's pages (its units not marked written go unpublished).
func (m *model) preempt(s *mseq, mode PreemptMode) {
	m.leave(m.slots[s.slot], false)
	s.preempted = mode
	s.forked = false // resumed, its shared units are what its match finds
}

// family returns the first n tokens of prompt family f: prompts of one
// family share prefixes.
func family(f, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1000*(f+1) + i
	}
	return out
}

type modelRun struct {
	admits, appends, frees, verified, ooms, preempts, resumes, hits, copies int
	// refusedAdmits and refusedResumes are the calls their plans refused;
	// asked the CanAdmit and CanResume answers checked against the calls.
	refusedAdmits, refusedResumes, asked int
	steps, stepOOMs, reserves, warms     int
	forks, refusedForks, cowCopies       int
	replaced                             int
	// cleared counts the ClearKept calls that unmapped a kept unit.
	cleared int
}

// add counts o's figures into r.
func (r *modelRun) add(o modelRun) {
	r.admits += o.admits
	r.appends += o.appends
	r.frees += o.frees
	r.verified += o.verified
	r.ooms += o.ooms
	r.preempts += o.preempts
	r.resumes += o.resumes
	r.hits += o.hits
	r.copies += o.copies
	r.refusedAdmits += o.refusedAdmits
	r.refusedResumes += o.refusedResumes
	r.asked += o.asked
	r.steps += o.steps
	r.stepOOMs += o.stepOOMs
	r.forks += o.forks
	r.refusedForks += o.refusedForks
	r.cowCopies += o.cowCopies
	r.replaced += o.replaced
	r.reserves += o.reserves
	r.warms += o.warms
	r.cleared += o.cleared
}

// books is every book of a cache a refused call must leave as it was:
// its Stats (the failure counts aside), the layouts of its two ranges,
// the memory committed, the store's LRU order and index, the KV events
// queued, and the driver calls the sim driver counted.
type books struct {
	st                Stats
	slots, store, lru string
	used              uint64
	events            int
	calls             sim.Calls
}

func snapBooks(t *testing.T, c *Cache, e *env) books {
	t.Helper()
	st := c.Stats()
	st.FailedAdmits, st.FailedResumes, st.FailedForks = 0, 0, 0
	b := books{st: st, slots: fmt.Sprint(c.slots.Layout()), used: e.used(t)}
	c.mu.Lock()
	if c.ps.s != nil {
		b.store = fmt.Sprint(c.ps.s.Layout())
	}
	for el := c.ps.lru.Front(); el != nil; el = el.Next() {
		su := el.Value.(*storeUnit)
		b.lru += fmt.Sprintf("%d@%d:%d ", su.idx, su.u, su.lastUse)
	}
	b.lru += fmt.Sprint(len(c.ps.byKey), len(c.ps.free))
	b.events = c.ev.queued
	c.mu.Unlock()
	if d, ok := e.drv.(*sim.Driver); ok {
		b.calls = d.Tally().Total()
	}
	return b
}

// requireRefused checks a call refused for lack of memory: marked
// ErrOutOfMemory, counted (failed is the count before and after), and
// every book as it was, no driver call made.
func requireRefused(t *testing.T, err error, before, after books, failed [2]uint64, step string) {
	t.Helper()
	requireIs(t, err, driver.ErrOutOfMemory, step)
	require.Equal(t, failed[0]+1, failed[1], step+": counted")
	require.Equal(t, before, after, step+": a refused call changes no book and makes no driver call")
}

// runModel runs data's ops against a cache on the host driver (or, when
// the config byte says so, the sim driver) and the model, in the layout
// the config byte says — or, layout Contiguous, in that layout with 3
// layers (a token of 12 KiB: 5 1/3 a 64 KiB page, so tokens straddle two
// pages at two boundaries in three). The cache has three slots.
func runModel(t *testing.T, data []byte, layout Layout) (r modelRun) {
	return runModelSlots(t, data, layout, 3)
}

// runModelSlots is runModel with slots slots.
func runModelSlots(t *testing.T, data []byte, layout Layout, slots int) (r modelRun) {
	cfgByte, ops := decode(data)
	if len(ops) == 0 {
		return r
	}
	if len(ops) > 200 {
		ops = ops[:200]
	}
	if layout == AutoLayout {
		layout = Layout(cfgByte % 2)
	}
	onSim := cfgByte/2%4 == 0
	budget := 24 + int(cfgByte/8%4)*16
	cfg := tinyConfig(layout, 96, slots)
	if layout == Contiguous {
		cfg.Layers = 3
	}
	cfg.Budget = uint64(budget) * page
	cfg.NoPrefixSharing = cfgByte/32%4 == 0
	// Half the runs listen to the KV events and check, after each step,
	// that they describe the prefix index (events_test.go).
	var evs *eventIndex
	if cfgByte&128 != 0 {
		evs = newEventIndex()
		cfg.Events = evs.apply
	}
	var e *env
	if onSim {
		e = simEnv(t, 64*units.MiB, page)
	} else {
		e = hostEnv(t, 64*units.MiB)
	}
	c := e.cache(t, cfg)
	m := &model{g: c.g, budget: budget, sharing: !cfg.NoPrefixSharing, byKey: map[string]*munit{}}
	for range cfg.MaxSeqs {
		m.slots = append(m.slots, &mslot{owned: make([]bool, c.g.units), borrowed: make([]*munit, c.g.units), kept: make([]*munit, c.g.units)})
	}
	fresh := 50_000
	for i, o := range ops {
		step := fmt.Sprintf("step %d: %+v", i, o)
		var s *mseq
		if len(m.seqs) > 0 {
			s = m.seqs[o.seq%len(m.seqs)]
		}
		switch o.kind {
		case opAdmit:
			n := 1 + o.n%48
			tail := o.n / 48 % 4
			prompt := family(o.family, n)
			for j := n - min(tail, n-1); j < n; j++ {
				prompt[j] = fresh
				fresh++
			}
			out := o.n % 64
			fits, err := c.CanAdmit(prompt, o.extra, out)
			require.NoError(t, err, step)
			require.Equal(t, m.canAdmit(prompt, o.extra, out, cfg.MaxContext), fits, step)
			// Asked again (the same slice: nothing looked at again) and
			// about the prompt alone: what Admit does.
			again, err := c.CanAdmit(prompt, o.extra, out)
			require.NoError(t, err, step)
			require.Equal(t, fits, again, step)
			admits, err := c.CanAdmit(prompt, o.extra, 0)
			require.NoError(t, err, step)
			require.Equal(t, m.canAdmit(prompt, o.extra, 0, cfg.MaxContext), admits, step)
			r.asked++
			before := snapBooks(t, c, e)
			var grants0 uint64
			sd, _ := e.drv.(*sim.Driver)
			if sd != nil {
				grants0 = sd.Tally().Total().SetAccess
			}
			real, err := c.Admit(prompt, o.extra)
			if sd != nil {
				// Batched access: the shared units' read-only borrow, and
				// a partly shared unit's commit (and borrow), each once a
				// region, however many units match.
				require.LessOrEqual(t, sd.Tally().Total().SetAccess-grants0, uint64(2*c.g.regions+1), step)
			}
			pick := m.pickSlot(m.find(prompt, prompt, o.extra, len(prompt)-1).units)
			if pick < 0 {
				requireIs(t, err, driver.ErrBusy, step)
				require.False(t, admits, step)
				break
			}
			if !admits {
				requireRefused(t, err, before, snapBooks(t, c, e), [2]uint64{uint64(r.refusedAdmits), c.Stats().FailedAdmits}, step)
				r.refusedAdmits++
				break
			}
			require.NoError(t, err, step)
			m.tick++
			ms := &mseq{real: real, slot: pick, prompt: prompt, extra: o.extra, admitted: m.tick}
			m.apply(ms, m.find(prompt, prompt, o.extra, len(prompt)-1), true)
			ms.tokens = slices.Clone(prompt[:ms.matched])
			require.Equal(t, ms.matched, real.Matched(), step)
			m.slots[pick].seq = ms
			m.seqs = append(m.seqs, ms)
			r.admits++
			r.hits += ms.matched
			if more := prompt[ms.matched:]; o.n%5 == 0 && len(more) > 0 {
				// Admit's plan held the whole prompt: the prefill right
				// after it finds its pages.
				got, err := real.Append(more)
				_, ok := m.back(ms, m.g.unitsFor(len(prompt)))
				require.True(t, ok, step+": the model's prefill after the plan")
				require.NoError(t, err, step+": the prefill after the plan")
				ms.tokens = slices.Clone(prompt)
				if !onSim {
					writeStep(t, got, ms.tokens, ms.extra)
				}
				r.appends++
			}
		case opAppend, opAppendMore:
			if s == nil {
				break
			}
			have := len(s.tokens)
			cnt := 1 + o.n%4
			switch {
			case o.kind == opAppendMore && o.n%2 == 0 && have < len(s.prompt):
				cnt = len(s.prompt) - have // the rest of the prompt: a prefill
			case o.kind == opAppendMore:
				cnt = 1 + o.n%40
			}
			more := s.next(have, cnt, &fresh)
			step += fmt.Sprintf(" (%d tokens onto %d)", cnt, have)
			if s.preempted == 0 {
				// What the last Append handed out was written (writeStep):
				// a decode step marks it before it appends the next token.
				require.NoError(t, s.real.MarkWritten(have), step)
				m.publish(s, have)
			}
			got, err := s.real.Append(more)
			if s.preempted != 0 {
				requireIs(t, err, driver.ErrInvalid, step)
				break
			}
			if have+cnt > cfg.MaxContext {
				requireIs(t, err, driver.ErrInvalid, step)
				break
			}
			if !m.cow(s, m.g.unitsFor(have+cnt)) {
				requireIs(t, err, driver.ErrOutOfMemory, step)
				r.ooms++
				break
			}
			if _, ok := m.back(s, m.g.unitsFor(have+cnt)); !ok {
				requireIs(t, err, driver.ErrOutOfMemory, step)
				r.ooms++
				break
			}
			require.NoError(t, err, step)
			s.tokens = append(s.tokens, more...)
			if !onSim {
				writeStep(t, got, s.tokens, s.extra)
			}
			r.appends++
		case opFree:
			if s == nil {
				break
			}
			m.markWritten(t, s, o.n%4 != 0, step)
			require.NoError(t, s.real.Free(), step)
			m.tick++
			sl := m.slots[s.slot]
			m.leave(sl, true)
			sl.seq = nil
			sl.freedAt = m.tick
			m.seqs = slices.DeleteFunc(m.seqs, func(x *mseq) bool { return x == s })
			r.frees++
		case opVerify:
			if s == nil || onSim {
				break
			}
			if s.preempted != 0 {
				_, err := s.real.K(0)
				requireIs(t, err, driver.ErrInvalid, step)
				break
			}
			checkSeq(t, s.real, s.tokens, s.extra, 0, len(s.tokens))
			shared := -1 // what its match found
			if s.forked {
				shared = s.forkShared
			}
			checkUnits(t, c, s.real, s.tokens, s.extra, s.matched, shared, step)
			r.verified++
		case opPreempt:
			if s == nil {
				break
			}
			mode := PreemptMode(1 + o.family%2)
			m.markWritten(t, s, o.n%4 != 0, step)
			err := s.real.Preempt(mode)
			if s.preempted != 0 {
				requireIs(t, err, driver.ErrInvalid, step)
				break
			}
			require.NoError(t, err, step)
			m.preempt(s, mode)
			r.preempts++
		case opResume:
			if s == nil {
				break
			}
			can, canErr := s.real.CanResume(0)
			before := snapBooks(t, c, e)
			got, err := s.real.Resume()
			if s.preempted == 0 {
				requireIs(t, canErr, driver.ErrInvalid, step)
				requireIs(t, err, driver.ErrInvalid, step)
				break
			}
			require.NoError(t, canErr, step)
			require.Equal(t, m.canResume(s, 0, cfg.MaxContext), can, step)
			r.asked++
			if !can {
				requireRefused(t, err, before, snapBooks(t, c, e), [2]uint64{uint64(r.refusedResumes), c.Stats().FailedResumes}, step)
				r.refusedResumes++
				r.ooms++
				break
			}
			limit := len(s.tokens)
			if s.preempted == Drop {
				limit--
			}
			m.apply(s, m.find(s.tokens, s.prompt, s.extra, limit), s.preempted == Drop)
			_, ok := m.back(s, m.g.unitsFor(len(s.tokens)))
			require.True(t, ok, step+": the plan fit, the model's pages do too")
			require.NoError(t, err, step)
			require.Equal(t, s.matched, s.real.Matched(), step)
			if s.preempted == Swap {
				require.Zero(t, got.N, step)
			} else {
				require.Equal(t, Step{Pos: s.matched, N: len(s.tokens) - s.matched, Layers: got.Layers}, got, step)
				if !onSim {
					writeStep(t, got, s.tokens, s.extra)
				}
			}
			s.preempted = 0
			r.resumes++
		case opFork:
			m.forkOp(t, c, e, s, o, &r, step)
		case opReserve:
			if s == nil {
				break
			}
			have, n := len(s.tokens), o.n%48
			before := snapBooks(t, c, e)
			got, err := s.real.Reserve(n)
			if s.preempted != 0 || have+n > cfg.MaxContext {
				requireIs(t, err, driver.ErrInvalid, step)
				require.Equal(t, before, snapBooks(t, c, e), step+": a refused Reserve changes no book and makes no driver call")
				break
			}
			require.NoError(t, err, step)
			require.Equal(t, m.reserve(s, n), got, step)
			r.reserves++
			if got == 0 || o.family%2 != 0 {
				break
			}
			// The Append of what was reserved finds its pages: no
			// driver call, no page committed — but for a fork's last
			// unit, still shared read-only, which the Append copies on
			// write or, its slot the last to map it, grants write
			// access to in place (Reserve reserves past it).
			require.NoError(t, s.real.MarkWritten(have), step)
			m.publish(s, have)
			more := s.next(have, got, &fresh)
			_, mu := m.cowUnit(s)
			copies := mu != nil
			mid := snapBooks(t, c, e)
			out, err := s.real.Append(more)
			if !m.cow(s, m.g.unitsFor(have+got)) {
				requireIs(t, err, driver.ErrOutOfMemory, step+": the copy on write of a reserved Append")
				r.ooms++
				break
			}
			require.NoError(t, err, step+": the Append of what was reserved")
			after := snapBooks(t, c, e)
			if !copies {
				require.Equal(t, mid.calls, after.calls, step+": the Append of what was reserved makes no driver call")
				require.Equal(t, mid.used, after.used, step+": and commits nothing")
			}
			_, ok := m.back(s, m.g.unitsFor(have+got))
			require.True(t, ok, step)
			s.tokens = append(s.tokens, more...)
			if !onSim {
				writeStep(t, out, s.tokens, s.extra)
			}
			r.appends++
		case opWarm:
			// Kept units no match borrowed, above those one did, unmapped
			// ahead as far as o.seq pages allow; then the pool grows to n
			// pages, within the free budget beside the pages in use and
			// the pool.
			pages := o.seq % 16
			cleared, err := c.ClearKept(pages)
			require.NoError(t, err, step)
			require.Equal(t, m.clearKept(pages), cleared, step)
			r.cleared += b2i(cleared > 0)
			n := o.n % 24
			got, err := c.Warm(n)
			require.NoError(t, err, step)
			// Idle slots' pages go into the pool as far as n pages
			// need them, and the cached units commits of the rest would
			// evict lose their kept mappings.
			m.reclaimIdle(n, nil)
			idle := 0
			for _, sl := range m.slots {
				if sl.seq == nil {
					idle += m.ownedFrom(sl, 0) * m.up()
				}
			}
			short := n - max(m.free(), 0) - idle
			for i := 0; i < len(m.lru) && short > 0; i++ {
				for _, sl := range m.slots {
					if mu := m.lru[i]; sl.kept[mu.u] == mu {
						sl.kept[mu.u] = nil
						m.keptDropped++
					}
				}
				short -= m.up()
			}
			// The free slot an admission no kept units match would take
			// keeps nothing after it.
			if spare := m.fewestKept(); spare >= 0 {
				for u, mu := range m.slots[spare].kept {
					if mu != nil {
						m.slots[spare].kept[u] = nil
						m.keptDropped++
					}
				}
			}
			if add := min(n, m.budget-m.pages) - m.pooled; add > 0 {
				m.pooled += add
				m.created += add
			}
			require.Equal(t, m.pooled, got, step)
			// What the time left after the warm pays for: kept units no
			// match borrowed, above those one did.
			r.warms++
		case opStep:
			ok, oom := m.step(t, c, o, &fresh, cfg.MaxContext, onSim, step)
			r.steps += b2i(ok)
			r.stepOOMs += b2i(oom)
		case opSetBudget:
			mode := PreemptMode(1 + o.family%2)
			pages := 8 + o.n%64
			got, err := c.SetBudget(uint64(pages)*page, mode)
			require.NoError(t, err, step)
			m.budget = pages
			var want []*Seq
			if m.free() < 0 {
				m.reclaim(0, nil, 0)
				running := slices.DeleteFunc(slices.Clone(m.seqs), func(x *mseq) bool { return x.preempted != 0 })
				slices.SortFunc(running, func(a, b *mseq) int { return b.admitted - a.admitted })
				for _, x := range running {
					if m.free() >= 0 {
						break
					}
					m.preempt(x, mode)
					m.evict(0)
					want = append(want, x.real)
				}
			}
			m.trim()
			require.Equal(t, want, got, step)
			r.preempts += len(want)
		}
		// At any point, for a preempted sequence: what CanResume says is
		// the model's plan (and the call above, when it was one, agreed).
		if len(m.seqs) > 0 {
			if x := m.seqs[(o.seq+i)%len(m.seqs)]; x.preempted != 0 {
				more := o.n % 40
				can, err := x.real.CanResume(more)
				require.NoError(t, err, step)
				require.Equal(t, m.canResume(x, more, cfg.MaxContext), can, step+": CanResume")
				r.asked++
			}
		}
		// Compare.
		require.NoError(t, c.Check(), step)
		st := c.Stats()
		require.Equal(t, m.pages, st.PagesCommitted, step)
		require.Equal(t, m.pooled, st.PooledPages, step)
		if sd, ok := e.drv.(*sim.Driver); ok {
			// Page reuse: a commit creates only what the pool lacks.
			require.Equal(t, uint64(m.created), sd.Tally().Total().Create, step)
		}
		require.Equal(t, uint64(m.pages+m.pooled)*page, e.used(t), step)
		require.Equal(t, len(m.lru)*m.up(), st.CachedPages, step)
		require.Equal(t, m.copies, st.Copies, step)
		require.Equal(t, m.forks, st.Forks, step)
		require.Equal(t, m.cowCopies, st.CowCopies, step)
		kept := 0
		for _, sl := range m.slots {
			kept += m.keptIn(sl)
		}
		require.Equal(t, kept, st.KeptUnits, step)
		require.Equal(t, m.keptReused, st.KeptReused, step)
		require.Equal(t, m.keptDropped, st.KeptDropped, step)
		idle, surplus, tokens := 0, 0, 0
		for _, sl := range m.slots {
			switch {
			case sl.seq == nil:
				idle += m.ownedFrom(sl, 0) * m.up()
			case sl.seq.preempted == 0:
				surplus += m.ownedFrom(sl, m.g.unitsFor(len(sl.seq.tokens))) * m.up()
			}
		}
		running := 0
		for _, ms := range m.seqs {
			if ms.preempted == 0 {
				tokens += len(ms.tokens)
				running++
			}
			require.Equal(t, len(ms.tokens), ms.real.Len(), step)
			require.Equal(t, ms.slot, ms.real.Slot(), step)
		}
		require.Equal(t, idle, st.IdlePages, step)
		require.Equal(t, surplus, st.SurplusPages, step)
		require.Equal(t, tokens, st.TokensStored, step)
		require.Equal(t, running, st.Running, step)
		require.Equal(t, len(m.seqs)-running, st.Preempted, step)
		// The figures the cache keeps as counters, worked out from the
		// model's slots: its own pages, and the bytes holding a running
		// sequence's token, a store unit's once however many map it.
		slotPages, shared := 0, 0
		var used, saved uint64
		most := map[*munit]int{}
		for _, sl := range m.slots {
			slotPages += m.ownedFrom(sl, 0) * m.up()
			if sl.seq == nil || sl.seq.preempted != 0 {
				continue
			}
			n := len(sl.seq.tokens)
			for u := range sl.owned {
				if sl.owned[u] && u < m.g.unitsFor(n) {
					used += m.g.usedBytes(u, n)
				}
				if mu := sl.borrowed[u]; mu != nil {
					most[mu] = max(most[mu], n)
				}
			}
		}
		for mu, n := range most {
			used += m.g.usedBytes(mu.u, n)
			if mu.refs > 1 {
				shared += m.up()
				saved += uint64((mu.refs-1)*m.up()) * page
			}
		}
		require.Equal(t, slotPages, st.SlotPages, step)
		require.Equal(t, m.pages-slotPages, st.StorePages, step)
		require.Equal(t, used, st.UsedBytes, step)
		require.Equal(t, shared, st.SharedPages, step)
		require.Equal(t, saved, st.SavedBytes, step)
		require.Equal(t, len(m.seqs), st.Sequences, step)
		evs.check(t, c, step)
		if !onSim {
			m.crossCheck(t, step)
		}
	}
	r.copies = m.copies
	r.cowCopies = m.cowCopies
	r.replaced = m.replaced
	for _, ms := range m.seqs {
		require.NoError(t, ms.real.Free())
	}
	require.NoError(t, c.Close())
	evs.check(t, c, "close")
	require.Zero(t, e.used(t))
	return r
}

// requireIs fails t unless err is marked want, naming the step.
func requireIs(t testing.TB, err, want error, step string) {
	t.Helper()
	require.Truef(t, errors.Is(err, want), "%s: want an error marked %q, got %v", step, want, err)
}

// TestCacheModelContiguous runs random operation sequences against the
// model in the Contiguous layout, tokens straddling pages: matches that
// end where a token straddles copy the page it starts in.
func TestCacheModelContiguous(t *testing.T) {
	var total modelRun
	for seed := uint64(0); seed < 24; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := runModel(t, randomInput(rand.New(rand.NewPCG(seed, 13)), 150), Contiguous)
			total.add(r)
		})
	}
	t.Logf("%+v", total)
	require.Greater(t, total.appends, 300)
	require.Greater(t, total.preempts, 20)
	require.Greater(t, total.resumes, 10)
	require.Greater(t, total.hits, 200, "prompts of one family share prefixes")
	require.Greater(t, total.replaced, 5, "written copies take the cached units' places")
	require.Positive(t, total.copies, "matches ending where a token straddles copy a page")
	require.Greater(t, total.forks, 10, "forks")
	require.Positive(t, total.cowCopies, "copies on write")
}

// TestCacheModel runs random operation sequences against the model.
func TestCacheModel(t *testing.T) {
	var total modelRun
	for seed := uint64(0); seed < 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := runModel(t, randomInput(rand.New(rand.NewPCG(seed, 11)), 150), AutoLayout)
			total.add(r)
		})
	}
	t.Logf("%+v", total)
	require.Greater(t, total.refusedAdmits, 5, "admissions are refused")
	require.Positive(t, total.refusedResumes, "resumes are refused")
	require.Greater(t, total.appends, 300)
	require.Greater(t, total.frees, 100)
	require.Greater(t, total.verified, 50)
	require.Greater(t, total.ooms, 5, "the budgets are small enough to refuse")
	require.Greater(t, total.preempts, 50)
	require.Greater(t, total.resumes, 30)
	require.Greater(t, total.hits, 200, "prompts of one family share prefixes")
	// A match ending in a partly shared unit (Stats.Copies) is rare in this
	// mix of twelve kinds of op (0 to 2 in 40 runs): every step compares
	// the model's count with the cache's, and TestPartialUnitCopiedOnce and
	// TestCacheModelContiguous make one for sure.
	require.Greater(t, total.steps, 20, "batched steps")
	require.Positive(t, total.stepOOMs, "some steps do not fit")
	require.Greater(t, total.forks, 10, "forks")
	require.Positive(t, total.cowCopies, "copies on write")
	require.Greater(t, total.reserves, 20, "reservations ahead")
	require.Greater(t, total.warms, 20, "pools warmed")
}

// FuzzCacheModel fuzzes the decoder and the sequences it yields.
func FuzzCacheModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(randomInput(rand.New(rand.NewPCG(seed, 5)), 40))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, ops := decode(data)
		if len(ops) > 0 {
			c2, ops2 := decode(encode(cfg, ops))
			require.Equal(t, cfg, c2)
			require.Equal(t, ops, ops2, "encode is decode's inverse")
		}
		_ = runModel(t, data, AutoLayout)
		_ = runModel(t, data, Contiguous)
		_ = runModelSlots(t, data, AutoLayout, 8)
	})
}

// TestSeedCorpus checks the fuzz seed corpus decodes to operations; with
// VMARENA_WRITE_CORPUS=1 it writes it afresh.
func TestSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzCacheModel")
	if os.Getenv("VMARENA_WRITE_CORPUS") == "1" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for i, n := range []int{10, 40, 100, 200} {
			data := randomInput(rand.New(rand.NewPCG(uint64(200+i), 7)), n)
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d-ops", n)), []byte(body), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "seed-*"))
	require.NoError(t, err)
	require.Len(t, files, 4)
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.SplitN(string(body), "\n", 3)
		require.Equal(t, "go test fuzz v1", lines[0])
		data, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		require.NoError(t, err, f)
		_, ops := decode([]byte(data))
		require.NotEmpty(t, ops, f)
	}
}
