package kvcache

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// Layout says how a slot lays out the keys and values of its sequence.
type Layout uint8

const (
	// PerLayer gives every layer's K and every layer's V a region of its
	// own, MaxContext tokens long (vAttention's layout): layer l's K is one
	// row-major tensor [tokens, KVHeads, HeadDim]. A sequence's tail wastes
	// up to one page in each of its 2*Layers regions.
	PerLayer Layout = iota
	// TokenMajor fills each page with a group of tokens for all layers,
	// laid out [layer][K, V][token][head][dim]: layer l's K is a strided
	// tensor [groups, tokens per group, KVHeads, HeadDim]. A sequence's
	// tail wastes at most one group, and a page whose size is not a
	// multiple of a token's bytes wastes the rest of it.
	TokenMajor
	// Contiguous lays a slot's tokens back to back, one uniform stride of
	// 2*Layers*row bytes a token, [token][layer][K, V][head][dim], tokens
	// straddling page boundaries: token t's layer l K lies at
	// t*2*Layers*row + 2*l*row. Layer l's K is a strided tensor [tokens,
	// KVHeads, HeadDim] (token stride 2*Layers*row/elt). No byte of a
	// page inside a sequence is unused; the tail wastes less than one
	// page.
	Contiguous
	numLayouts
	// AutoLayout asks Config.check (New) for the layout PickLayout picks
	// for the model and page.
	AutoLayout Layout = 255
)

func (l Layout) String() string {
	switch l {
	case PerLayer:
		return "per-layer"
	case TokenMajor:
		return "token-major"
	case Contiguous:
		return "contiguous"
	case AutoLayout:
		return "auto"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// Layouts lists the layouts, as String writes them, in their order.
func Layouts() []string {
	out := make([]string, 0, numLayouts)
	for l := Layout(0); l < numLayouts; l++ {
		out = append(out, l.String())
	}
	return out
}

// ParseLayout reads a layout as String writes it: "per-layer",
// "token-major", "contiguous", or "auto" (AutoLayout).
func ParseLayout(s string) (Layout, error) {
	for l := Layout(0); l < numLayouts; l++ {
		if l.String() == s {
			return l, nil
		}
	}
	if s == AutoLayout.String() {
		return AutoLayout, nil
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "kvcache: layout %q is none of %s, or %q", s, strings.Join(Layouts(), ", "), AutoLayout)
}

// Config is the shape of a cache: the model's keys and values, the
// sequences it holds and the memory it may use.
type Config struct {
	// Layers, KVHeads and HeadDim are the model's: each token keeps, per
	// layer, a key and a value of KVHeads*HeadDim elements of DType.
	Layers, KVHeads, HeadDim int
	DType                    tensor.DType
	// BlockTokens is the unit of prefix hashing, in tokens (default 16).
	BlockTokens int
	// MaxContext is the most tokens one sequence holds, prompt and output.
	MaxContext int
	// MaxSeqs is the number of sequence slots.
	MaxSeqs int
	// Budget is the most KV memory the cache keeps committed (default, 0:
	// the device's capacity). SetBudget changes it at run time.
	Budget uint64
	// PageSize is the unit of commit (default, 0: the device's recommended
	// granularity); a multiple of the driver's granularity.
	PageSize uint64
	// Layout is PerLayer (the zero value), TokenMajor, Contiguous, or
	// AutoLayout: the one PickLayout picks for the shape and PageSize.
	Layout Layout
	// Window is the tokens each layer attends to: a sequence keeps the
	// last Window tokens, and the units wholly behind them go back to the
	// budget as it grows (0: full attention, every token kept). At most
	// MaxContext.
	Window int // tokens each layer attends to (0: full attention)
	// Ring maps each layer's window pages twice back to back, so that the
	// last Window tokens are one contiguous slice of the layer's K (and
	// V) region with one row stride. Needs Window.
	Ring bool // window pages mapped twice back to back: the last Window tokens are one contiguous slice
	// Device holds every page.
	Device driver.DeviceID
	// MapAhead is the mapping-ahead watermark in tokens: when fewer remain
	// free on a running sequence's last page, a background goroutine
	// commits its next page (default, 0: BlockTokens; negative: no mapping
	// ahead, every page is committed by the Append that needs it).
	MapAhead int
	// NoPrefixSharing turns prefix sharing off: no prompt page goes to the
	// prefix store, none is matched.
	NoPrefixSharing bool
	// Events, when set, is told the prefix index's changes as vLLM's KV
	// events (BlockStored, BlockRemoved, AllBlocksCleared: events.go
	// says when, and how a slow or panicking callback is handled), one
	// batch per call, outside the cache's lock, from one goroutine at a
	// time. EventWriter.Write writes them as JSON lines. Unset, nothing
	// is queued.
	Events func(EventBatch)
}

// presets are the shapes of common models; they set the shape and dtype
// only.
var presets = map[string]Config{
	// LLaMA 7B: multi-head attention, fp16.
	"llama-7b": {Layers: 32, KVHeads: 32, HeadDim: 128, DType: tensor.Float16},
	// LLaMA 3 8B: grouped-query attention (8 KV heads), fp16.
	"llama3-8b": {Layers: 32, KVHeads: 8, HeadDim: 128, DType: tensor.Float16},
	// Qwen2.5 7B: grouped-query attention (4 KV heads), 28 layers, bf16 (2
	// bytes, kept as Float16): a token of 57,344 bytes, which no page of a
	// power of two holds a whole number of.
	"qwen2.5-7b": {Layers: 28, KVHeads: 4, HeadDim: 128, DType: tensor.Float16},
	// Mistral 7B: grouped-query attention (8 KV heads), bf16.
	"mistral-7b": {Layers: 32, KVHeads: 8, HeadDim: 128, DType: tensor.Float16},
	// DeepSeek-V3: multi-head latent attention, one vector of 576
	// elements (kv_lora_rank 512 + qk_rope_head_dim 64) a layer and a
	// token, bf16, 61 layers. The cache keeps a key and a value a layer:
	// the latent is kept as a "key" and a "value" of half of it each (the
	// same bytes a token: 70,272), as package serving's Cache scheme
	// does.
	"deepseek-v3": {Layers: 61, KVHeads: 1, HeadDim: 288, DType: tensor.Float16},
	// A small float32 model for tests and examples.
	"tiny": {Layers: 4, KVHeads: 8, HeadDim: 64, DType: tensor.Float32},
}

// Presets lists the names Preset knows, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Preset returns the shape (Layers, KVHeads, HeadDim, DType) of a common
// model; the caller fills in the rest. An unknown name is ErrInvalid.
func Preset(name string) (Config, error) {
	cfg, ok := presets[name]
	if !ok {
		return Config{}, errors.Wrapf(driver.ErrInvalid, "kvcache: no preset %q (known: %s)", name, strings.Join(Presets(), ", "))
	}
	return cfg, nil
}

// geometry is where every byte of a slot goes, worked out once from the
// Config.
//
// A slot is regions side by side, each regionBytes long and made of units
// of unitBytes: PerLayer has 2*Layers regions (region 2l is layer l's K,
// 2l+1 its V) whose unit is one page; TokenMajor has one region whose unit
// is a group of pages holding tpg tokens for all layers; Contiguous has
// one region whose unit is one page, tokens stride bytes apart across
// page boundaries. Unit u of every region together is the unit of commit
// for a sequence and the unit of sharing in the prefix store: a store
// unit holds the same regions' unit u side by side.
type geometry struct {
	layout      Layout
	layers      int
	heads, dim  int
	dt          tensor.DType
	elt         int
	row         uint64 // bytes of one token's K (or V) in one layer
	page        uint64
	regions     int
	unitBytes   uint64 // bytes of one unit in one region: a whole number of pages
	units       int    // units per region
	tpg         int    // TokenMajor: tokens per group (unit)
	stride      uint64 // PerLayer, Contiguous: bytes from a token to the next in a region
	period      int    // Contiguous: pages from one page boundary a token starts at to the next
	regionBytes uint64
	slotBytes   uint64
	maxCtx      int
	block       int
	// ring is, with Config.Ring, the pages R of each region's ring (a
	// region is then 2R pages: the ring and its mirror), ringCap the
	// whole rows they hold (ring.go); 0 otherwise.
	ring, ringCap int
}

// tokenBytes is the memory of one token: keys and values of all layers.
func (g *geometry) tokenBytes() uint64 { return 2 * uint64(g.layers) * g.row }

// unitPages is the number of pages of one unit over all regions.
func (g *geometry) unitPages() int { return g.regions * int(g.unitBytes/g.page) }

// unitsFor is the number of units (from unit 0) n tokens need.
func (g *geometry) unitsFor(n int) int {
	if g.layout != TokenMajor {
		return int((uint64(n)*g.stride + g.page - 1) / g.page)
	}
	return (n + g.tpg - 1) / g.tpg
}

// unitTokens is [start, end): the tokens with bytes in unit u.
func (g *geometry) unitTokens(u int) (start, end int) {
	if g.layout != TokenMajor {
		lo, hi := uint64(u)*g.page, uint64(u+1)*g.page
		return int(lo / g.stride), int((hi + g.stride - 1) / g.stride)
	}
	return u * g.tpg, (u + 1) * g.tpg
}

// usedBytes is the bytes of unit u (all regions) that hold tokens below n.
func (g *geometry) usedBytes(u, n int) uint64 {
	if g.layout != TokenMajor {
		b := uint64(n) * g.stride
		lo := uint64(u) * g.page
		if b <= lo {
			return 0
		}
		return uint64(g.regions) * min(b-lo, g.page)
	}
	t := n - u*g.tpg
	if t <= 0 {
		return 0
	}
	return uint64(min(t, g.tpg)) * g.tokenBytes()
}

// unitOff is the offset of unit u of region r in a slot.
func (g *geometry) unitOff(r, u int) uint64 {
	return uint64(r)*g.regionBytes + uint64(u)*g.unitBytes
}

// tokenOff is the offset in a slot of token t's K (kv 0) or V (kv 1) in
// layer l.
func (g *geometry) tokenOff(l, kv, t int) uint64 {
	switch g.layout {
	case PerLayer:
		return g.unitOff(2*l+kv, 0) + uint64(t)*g.row
	case Contiguous:
		return uint64(t)*g.stride + uint64(2*l+kv)*g.row
	}
	u, j := t/g.tpg, t%g.tpg
	return g.unitOff(0, u) + uint64((2*l+kv)*g.tpg+j)*g.row
}

// keyTokens is [from, end): the tokens a store unit u is listed with —
// those with bytes in it that the units before it have not (unitTokens
// but the first, in the Contiguous layout, when a token straddles into it
// from unit u-1). A chain of units lists each token once; its key is the
// prefix hash at end, its parent's at from.
func (g *geometry) keyTokens(u int) (from, end int) {
	from, end = g.unitTokens(u)
	if u > 0 && g.layout == Contiguous {
		_, from = g.unitTokens(u - 1)
	}
	return from, end
}

// cut is what a sequence takes of a prefix the store holds as its first
// u units: it borrows units [0, borrow), copies unit borrow from the
// store's when copyNext (the unit a token straddles into from a borrowed
// one would otherwise be written by the sequence, read-only), and has
// tokens matched — the tokens that lie whole in units [0, u). Only in
// the Contiguous layout can a token straddle a unit boundary (sharing in
// PerLayer needs a page of whole rows): there borrow is the unit the
// first unmatched token starts in, copied when the token starts inside
// it.
func (g *geometry) cut(u int) (borrow int, copyNext bool, tokens int) {
	if g.layout != Contiguous {
		start, _ := g.unitTokens(u)
		return u, false, start
	}
	t := uint64(u) * g.page / g.stride
	b := t * g.stride
	return int(b / g.page), b%g.page != 0, int(t)
}

// cleanBelow is the largest k' <= k such that no token straddles the
// boundary after unit k'-1: a match of units [0, k') leaves nothing of
// the tokens past it in the borrowed units.
func (g *geometry) cleanBelow(k int) int {
	if g.layout != Contiguous {
		return k
	}
	return k / g.period * g.period
}

// check validates cfg against the driver's devices and fills in its
// defaults, returning the geometry. Every refusal is ErrInvalid (or
// ErrNoDevice, ErrMisaligned from the driver's checks) and names the field.
func (cfg *Config) check(devs []driver.Device, gran uint64) (*geometry, error) {
	what := func() string { return "kvcache: new cache" }
	bad := func(format string, args ...any) error {
		return errors.Wrapf(driver.ErrInvalid, "%s: "+format, append([]any{what()}, args...)...)
	}
	switch {
	case cfg.Layers < 1 || cfg.KVHeads < 1 || cfg.HeadDim < 1:
		return nil, errors.WithHint(bad("Layers %d, KVHeads %d and HeadDim %d must all be at least 1", cfg.Layers, cfg.KVHeads, cfg.HeadDim),
			"start from a preset: kvcache.Preset(\"llama3-8b\")")
	case !cfg.DType.Valid():
		return nil, bad("DType %s is not a defined dtype", cfg.DType)
	case cfg.MaxContext < 1:
		return nil, bad("MaxContext %d must be at least 1 token", cfg.MaxContext)
	case cfg.MaxSeqs < 1:
		return nil, bad("MaxSeqs %d must be at least 1", cfg.MaxSeqs)
	case cfg.BlockTokens < 0:
		return nil, bad("BlockTokens %d is negative", cfg.BlockTokens)
	case cfg.Layout >= numLayouts && cfg.Layout != AutoLayout:
		return nil, bad("Layout %d is none of PerLayer (0), TokenMajor (1), Contiguous (2), AutoLayout (255)", cfg.Layout)
	case cfg.Window < 0:
		return nil, bad("Window %d is negative (0 is full attention)", cfg.Window)
	case cfg.Window > cfg.MaxContext:
		return nil, bad("Window %d is more than MaxContext %d", cfg.Window, cfg.MaxContext)
	case cfg.Ring && cfg.Window == 0:
		return nil, bad("Ring needs a Window (0 is full attention)")
	}
	if err := driver.CheckDevice(what, cfg.Device, len(devs)); err != nil {
		return nil, err
	}
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = 16
	}
	if cfg.MapAhead == 0 {
		cfg.MapAhead = cfg.BlockTokens
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = devs[cfg.Device].RecommendedGranularity
	}
	if err := driver.CheckSize(func() string { return what() + ": PageSize" }, cfg.PageSize, gran); err != nil {
		return nil, err
	}
	if cfg.Layout == AutoLayout && cfg.Ring {
		cfg.Layout = PerLayer // the one layout a ring has (ring.go)
	}
	if cfg.Ring {
		cfg.MapAhead = -1 // a ring's pages are all committed at its first Append
	}
	if cfg.Layout == AutoLayout {
		l, err := PickLayout(*cfg)
		if err != nil {
			return nil, err
		}
		cfg.Layout = l
	}
	g := &geometry{layout: cfg.Layout, layers: cfg.Layers, heads: cfg.KVHeads, dim: cfg.HeadDim, dt: cfg.DType,
		elt: cfg.DType.Size(), page: cfg.PageSize, maxCtx: cfg.MaxContext, block: cfg.BlockTokens}
	// Every product below is checked: a config is the caller's input.
	mul := func(a, b uint64) (uint64, bool) {
		hi, lo := bits.Mul64(a, b)
		return lo, hi == 0
	}
	tooBig := func(which string) error {
		return bad("%s overflows: %d layers x %d KV heads x %d x %d-byte %s, %d tokens x %d sequences",
			which, cfg.Layers, cfg.KVHeads, cfg.HeadDim, g.elt, cfg.DType, cfg.MaxContext, cfg.MaxSeqs)
	}
	row, ok := mul(uint64(cfg.KVHeads), uint64(cfg.HeadDim))
	row, ok2 := mul(row, uint64(g.elt))
	if !ok || !ok2 || row > math.MaxInt32 {
		return nil, tooBig("a token's row")
	}
	g.row = row
	perTok, ok := mul(2*uint64(cfg.Layers), row)
	if !ok || perTok > math.MaxInt {
		return nil, tooBig("a token's bytes")
	}
	roundUp := func(x uint64) (uint64, bool) {
		r := (x + g.page - 1) / g.page * g.page
		return r, r >= x
	}
	switch cfg.Layout {
	case PerLayer, Contiguous:
		g.regions, g.stride = 2*cfg.Layers, row
		if cfg.Layout == Contiguous {
			g.regions, g.stride = 1, perTok
			g.period = int(perTok / gcd(perTok, g.page))
		}
		g.unitBytes = g.page
		b, ok := mul(uint64(cfg.MaxContext), g.stride)
		if b, ok2 := roundUp(b); ok && ok2 {
			g.regionBytes = b
		} else {
			return nil, tooBig("a region")
		}
		g.units = int(g.regionBytes / g.page)
		if cfg.Ring && cfg.Layout == PerLayer {
			if err := g.ringGeometry(cfg.Window); err != nil {
				return nil, bad("%v", err)
			}
		}
	case TokenMajor:
		g.regions = 1
		if perTok <= g.page {
			g.tpg, g.unitBytes = int(g.page/perTok), g.page
		} else {
			// A token larger than a page: each group is one token over
			// as many whole pages as it needs.
			g.tpg = 1
			if g.unitBytes, ok = roundUp(perTok); !ok {
				return nil, tooBig("a token's pages")
			}
		}
		g.units = (cfg.MaxContext + g.tpg - 1) / g.tpg
		if g.regionBytes, ok = mul(uint64(g.units), g.unitBytes); !ok {
			return nil, tooBig("a slot")
		}
	}
	if g.slotBytes, ok = mul(uint64(g.regions), g.regionBytes); !ok {
		return nil, tooBig("a slot")
	}
	if total, ok := mul(g.slotBytes, uint64(cfg.MaxSeqs)); !ok || total > math.MaxInt64 {
		return nil, errors.WithHint(tooBig("the slots' address space"), "fewer MaxSeqs or a shorter MaxContext")
	}
	if g.units > math.MaxInt32 {
		return nil, tooBig("the pages of a slot")
	}
	if n, ok := mul(uint64(g.units+slotEntryUnits), uint64(cfg.MaxSeqs)); !ok || n > MaxUnits {
		return nil, errors.WithHint(bad("%d slots (MaxSeqs) of %d units (%s) would take books of %d units (a slot's own entry counted as %d), more than MaxUnits (%d; %d bytes of host memory each)",
			cfg.MaxSeqs, g.units, g, n, slotEntryUnits, MaxUnits, unitInfoBytes), "fewer MaxSeqs, a shorter MaxContext or a larger PageSize")
	}
	return g, nil
}

// MaxUnits is the most commit units (pages, or a page in every region in
// PerLayer) a cache's slots may span together: the books keep an entry
// for each from New on, and one for each slot that weighs slotEntryUnits
// of them, so a config asking for more is refused instead of building
// them. It is the number of 2 MiB pages in 128 TiB, the whole of
// a 47-bit address space, so at a GPU's page size no reservation the
// address space could hold is refused; smaller pages reach it sooner
// (64 TiB at 1 MiB, 4 TiB at 64 KiB). Each group of a Hybrid is a cache
// of its own.
const MaxUnits = 1 << 26

// unitInfoBytes is the size of a unit's entry in the books (MaxUnits'
// error).
const unitInfoBytes = int(unsafe.Sizeof(unitInfo{}))

// slotEntryUnits is a slot's own entry in the books (the slot and its
// place in the slot list), counted in units' entries, rounded up: what
// MaxUnits counts for each slot beside its units.
const slotEntryUnits = (int(unsafe.Sizeof(slot{})+unsafe.Sizeof((*slot)(nil))) + unitInfoBytes - 1) / unitInfoBytes

// pickOrder is the layouts PickLayout weighs, the one it takes on a tie
// first: TokenMajor's pages hold whole tokens (a prefix is shared at
// every page, with no copy where it ends), Contiguous's need no page to
// hold whole tokens, PerLayer's commit unit is a page in every region.
var pickOrder = [...]Layout{TokenMajor, Contiguous, PerLayer}

// PickLayout is the layout whose worst-case waste per sequence is the
// lowest for cfg's shape, PageSize (0: 2 MiB, a GPU's granularity) and
// MaxContext: the most bytes committed past a sequence's tokens, over
// every length from 1 to MaxContext (WorstWaste). On a tie it takes
// TokenMajor, then Contiguous, then PerLayer. A layout whose slot cannot
// hold cfg (it overflows, or passes MaxUnits) is passed over; a config no
// layout holds is ErrInvalid, as New words it for the first.
func PickLayout(cfg Config) (Layout, error) {
	best, worst, found := PerLayer, uint64(math.MaxUint64), false
	var first error
	for _, l := range pickOrder {
		w, err := WorstWaste(cfg, l)
		if err != nil {
			// A layout that cannot hold cfg (its slot overflows where
			// another's does not) is not a choice; a fault of cfg's
			// own is every layout's.
			if first == nil {
				first = err
			}
			continue
		}
		if !found || w < worst {
			best, worst, found = l, w, true
		}
	}
	if !found {
		return 0, first
	}
	return best, nil
}

// WorstWaste is the most bytes a sequence of cfg's shape, in layout l,
// with PageSize pages (0: 2 MiB), commits past its tokens' bytes, over
// every length from 1 token to MaxContext: its tail and, in TokenMajor,
// the rest of every page a whole number of tokens leaves.
func WorstWaste(cfg Config, l Layout) (uint64, error) {
	if l >= numLayouts {
		return 0, errors.Wrapf(driver.ErrInvalid, "kvcache: worst waste: Layout %d is none of PerLayer, TokenMajor, Contiguous", l)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 2 * units.MiB
	}
	cfg.Layout, cfg.Device, cfg.MaxSeqs = l, 0, 1
	g, err := cfg.check([]driver.Device{{RecommendedGranularity: cfg.PageSize}}, cfg.PageSize)
	if err != nil {
		return 0, err
	}
	return g.worstWaste(), nil
}

// worstWaste is WorstWaste of g.
func (g *geometry) worstWaste() uint64 {
	if g.layout == TokenMajor {
		// The worst is one token into the last group MaxContext reaches.
		n := 1 + (g.maxCtx-1)/g.tpg*g.tpg
		return uint64(g.unitsFor(n))*g.unitBytes - uint64(n)*g.tokenBytes()
	}
	// Each region wastes (-n*stride) mod page: every multiple of
	// gcd(stride, page) below the page once n has gone round.
	d := gcd(g.stride, g.page)
	q := g.page / d
	if uint64(g.maxCtx) >= q {
		return uint64(g.regions) * (g.page - d)
	}
	// Short of that, with s = stride/d coprime to q, n*s mod q is never
	// 0 for n in [1, MaxContext], so (-n*s) mod q is q less it and the
	// worst is q less the least n*s mod q: found in O(log² q), where a
	// walk over every length is MaxContext steps (a caller's config may
	// ask for 2^40 tokens).
	return uint64(g.regions) * d * (q - leastMulMod(g.stride/d%q, q, uint64(g.maxCtx)))
}

// leastMulMod is the least a*n mod m over n in [1, most], for a coprime
// to m and 1 <= most < m (so that it is never 0): the least t in [1, m)
// with firstMulIn(a, m, 1, t) <= most, by bisection (the first n whose
// residue is at most t comes no later as t grows).
func leastMulMod(a, m, most uint64) uint64 {
	lo, hi := uint64(1), m-1 // a*1 mod m <= m-1: hi always qualifies
	for lo < hi {
		t := lo + (hi-lo)/2
		if n, ok := firstMulIn(a, m, 1, t); ok && n <= most {
			hi = t
		} else {
			lo = t + 1
		}
	}
	return lo
}

// firstMulIn is the least n >= 0 with lo <= a*n mod m <= hi, for
// 0 <= lo <= hi < m, and false when there is none. Euclid's descent: if
// no multiple of a (a < m) lies in [lo, hi], an n that has it wraps y
// times, a*n = m*y + r with r in [lo, hi], and the least n is that of the
// least y, which is the least y with m*y mod a in [a - hi%a, a - lo%a]
// (lo and hi then have one quotient by a, so the range does not wrap):
// the same question of (m mod a, a), so the depth is Euclid's on (a, m).
// Every product is 128-bit: m may be any uint64.
func firstMulIn(a, m, lo, hi uint64) (uint64, bool) {
	if lo == 0 {
		return 0, true
	}
	if a %= m; a == 0 {
		return 0, false
	}
	k := lo/a + min(lo%a, 1) // the first multiple of a at or past lo
	if h, l := bits.Mul64(k, a); h == 0 && l <= hi {
		return k, true
	}
	y, ok := firstMulIn(m, a, a-hi%a, a-lo%a)
	if !ok {
		return 0, false
	}
	// n = ceil((m*y + lo) / a), less than m (residues repeat with period m).
	h, l := bits.Mul64(m, y)
	l, c := bits.Add64(l, lo, 0)
	h += c
	n, r := bits.Div64(h, l, a)
	return n + min(r, 1), true
}

// String describes the geometry for messages: "per-layer, 64 regions of
// 4 MiB (2 pages of 2 MiB) a slot".
func (g *geometry) String() string {
	switch g.layout {
	case PerLayer:
		return fmt.Sprintf("%s, %d regions of %s (%d pages of %s) a slot", g.layout, g.regions,
			units.Bytes(g.regionBytes), g.units, units.Bytes(g.page))
	case Contiguous:
		return fmt.Sprintf("%s, %d pages of %s a slot, a token every %s", g.layout, g.units,
			units.Bytes(g.page), units.Bytes(g.stride))
	}
	return fmt.Sprintf("%s, %d groups of %d tokens in %s a slot", g.layout, g.units, g.tpg, units.Bytes(g.unitBytes))
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
