package multidev

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
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The model-based test: random sequences of grow / shrink / trim / grant /
// migrate / read / write (and memory taken and given back beside the arena,
// and Close) run against an arena over four host devices and against a
// plain model of chunk → device, grants and contents. After every step the
// model, the arena (Len, Committed, Layout, DeviceAt, Access), the page
// table (Lookup of every granule), physical usage and the driver must
// agree, and Check must pass. Sequences are decoded from bytes: the first
// byte picks the configuration (placement, OnFull, whether devices reach
// each other), then opBytes bytes per operation, so the fuzz target
// explores the same space.

const (
	mDevs   = 4
	mChunk  = 2 * g // two granules per chunk: misaligned ranges are granule-aligned
	mCap    = 5     // device capacity, in chunks
	mMax    = 12    // arena maximum, in chunks
	opBytes = 6
	maxOps  = 120
)

type opKind uint8

const (
	opGrow opKind = iota
	opShrink
	opTrim
	opGrant
	opMigrate
	opRead
	opWrite
	opHog
	opClose
	numOps
)

var opNames = [...]string{"grow", "shrink", "trim", "grant", "migrate", "read", "write", "hog", "close"}

type op struct {
	kind          opKind
	a, b, c, d, e uint8
}

func (o op) String() string {
	return fmt.Sprintf("%s(%d,%d,%d,%d,%d)", opNames[o.kind], o.a, o.b, o.c, o.d, o.e)
}

// config is what the first byte of a sequence chooses.
type config struct {
	placement int // 0 striped, 1 blocked, 2 weighted, 3 explicit
	onFull    OnFull
	noPeer    bool
}

func (c config) String() string {
	return fmt.Sprintf("placement %d, %s, no peer access %v", c.placement, c.onFull, c.noPeer)
}

func decodeConfig(b byte) config {
	return config{placement: int(b % 4), onFull: OnFull(b / 4 % 2), noPeer: b/8%2 == 1}
}

// decode turns any byte string into a configuration and operations; a
// trailing partial operation is ignored. It never fails.
func decode(data []byte) (config, []op) {
	if len(data) == 0 {
		return config{}, nil
	}
	cfg := decodeConfig(data[0])
	data = data[1:]
	var ops []op
	for len(data) >= opBytes && len(ops) < maxOps {
		ops = append(ops, op{kind: opKind(data[0] % byte(numOps)), a: data[1], b: data[2], c: data[3], d: data[4], e: data[5]})
		data = data[opBytes:]
	}
	return cfg, ops
}

// encode is decode's inverse, for building seeds.
func encode(cfg byte, ops []op) []byte {
	out := []byte{cfg}
	for _, o := range ops {
		out = append(out, byte(o.kind), o.a, o.b, o.c, o.d, o.e)
	}
	return out
}

// The placements the configurations use, and the model's own reading of
// each policy.
var (
	stripedDevs = []driver.DeviceID{2, 0, 3, 1}
	blockedDevs = []driver.DeviceID{3, 1, 0, 2}
)

func explicitDevice(off uint64) driver.DeviceID {
	i := off / mChunk
	if i == mMax-1 {
		return mDevs // the last chunk names a device the machine lacks
	}
	return driver.DeviceID((i*3 + 1) % mDevs)
}

func (c config) placementPolicy() Placement {
	switch c.placement {
	case 0:
		return Striped(stripedDevs...)
	case 1:
		return Blocked(2*mChunk, blockedDevs...)
	case 2:
		return Weighted(0, 1, 2, 3)
	}
	return Explicit(explicitDevice)
}

func (c config) order(i int, free []int) []int {
	var devs []driver.DeviceID
	switch c.placement {
	case 0:
		devs = append(stripedDevs[i%4:], stripedDevs[:i%4]...)
	case 1:
		k := i / 2 % 4
		devs = append(blockedDevs[k:], blockedDevs[:k]...)
	case 2:
		out := []int{0, 1, 2, 3}
		slices.SortStableFunc(out, func(x, y int) int { return free[y] - free[x] })
		return out
	default:
		devs = []driver.DeviceID{explicitDevice(uint64(i) * mChunk)}
	}
	var out []int
	for _, d := range devs {
		out = append(out, int(d))
	}
	return out
}

// Reference model.
type mChunkState struct {
	dev    int
	access [mDevs]driver.Access
	data   []byte
}

type harness struct {
	t      testing.TB
	cfg    config
	e      *env
	a      *Arena
	chunks []*mChunkState
	length uint64
	hogs   [mDevs]*physical.Chunk // one chunk each, beside the arena
	closed bool
	log    []string
	failed int         // operations refused as the model predicted
	done   [numOps]int // operations that succeeded, by kind
	cur    opKind
}

// modelMachine is the machine the model runs on.
func modelMachine(noPeer bool) machine {
	return machine{devices: mDevs, capacity: mCap * mChunk, noPeer: noPeer}
}

func newHarness(t testing.TB, d backend, cfg config) *harness {
	drv := d.open(t, modelMachine(cfg.noPeer))
	e := &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
	a, err := New(e.space, e.mem, Options{Max: mMax * mChunk, ChunkSize: mChunk, Placement: cfg.placementPolicy(), OnFull: cfg.onFull})
	require.NoError(t, err)
	return &harness{t: t, cfg: cfg, e: e, a: a, log: []string{cfg.String()}}
}

func (h *harness) steps() string { return strings.Join(h.log, "\n") }

// expect checks err against the failures the model says apply: none means
// the call must succeed; otherwise err must be one of them.
func (h *harness) expect(err error, applies ...error) bool {
	h.t.Helper()
	if h.closed {
		applies = []error{driver.ErrClosed}
	}
	if len(applies) == 0 {
		require.NoError(h.t, err, "steps:\n%s", h.steps())
		h.done[h.cur]++
		return true
	}
	h.failed++
	for _, want := range applies {
		if errors.Is(err, want) {
			return false
		}
	}
	require.Failf(h.t, "wrong error", "got %v, want one of %v\nsteps:\n%s", err, applies, h.steps())
	return false
}

// device decodes a device: one value in eight is the unknown device mDevs.
func device(x uint8) int {
	if x%8 == 7 {
		return mDevs
	}
	return int(x) % mDevs
}

func (h *harness) free() []int {
	free := make([]int, mDevs)
	for d := range free {
		free[d] = mCap
		if h.hogs[d] != nil {
			free[d]--
		}
	}
	for _, c := range h.chunks {
		free[c.dev]--
	}
	return free
}

func (h *harness) reach(dev, owner int) bool { return dev == owner || !h.cfg.noPeer }

// span decodes a chunk range [lo, lo+n) and whether it is shifted by one
// granule off the chunk boundary.
func (h *harness) span(o op) (lo, n int, misaligned bool) {
	lo = int(o.a) % (len(h.chunks) + 1)
	n = 1 + int(o.b%6)
	if o.b&0x80 == 0 { // mostly, a range that fits
		n = max(1, min(n, len(h.chunks)-lo))
	}
	if o.b%16 == 15 {
		n = 0
	}
	return lo, n, o.d%16 == 0
}

func (h *harness) step(o op) {
	h.log = append(h.log, o.String())
	h.cur = o.kind
	t, a := h.t, h.a
	switch o.kind {
	case opGrow:
		n := uint64(o.a%5)*mChunk + uint64(o.b%4)*mChunk/4
		newLen := h.length + n
		var applies []error
		var placed []int
		if newLen > mMax*mChunk {
			applies = append(applies, driver.ErrOutOfMemory)
		} else if need := int((newLen + mChunk - 1) / mChunk); need > len(h.chunks) {
			free := h.free()
		place:
			for i := len(h.chunks); i < need; i++ {
				order := h.cfg.order(i, free)
				for _, d := range order {
					if d == mDevs {
						applies = append(applies, driver.ErrNoDevice)
						break place
					}
				}
				for _, d := range order {
					if free[d] > 0 {
						free[d]--
						placed = append(placed, d)
						continue place
					}
					if h.cfg.onFull == FailWhenFull {
						break
					}
				}
				applies = append(applies, driver.ErrOutOfMemory)
				break
			}
		}
		if h.expect(a.Grow(n), applies...) {
			for _, d := range placed {
				h.chunks = append(h.chunks, &mChunkState{dev: d, data: make([]byte, mChunk)})
			}
			h.length = newLen
		}
	case opShrink:
		n := uint64(o.a%7)*mChunk/2 + uint64(o.b%3)
		var applies []error
		if n > h.length {
			applies = append(applies, driver.ErrInvalid)
		}
		if h.expect(a.Shrink(n), applies...) {
			h.length -= n
		}
	case opTrim:
		if h.expect(a.Trim()) {
			h.chunks = h.chunks[:int((h.length+mChunk-1)/mChunk)]
		}
	case opGrant:
		lo, n, mis := h.span(o)
		dev := device(o.c)
		acc := []driver.Access{driver.AccessNone, driver.AccessRead, driver.AccessReadWrite, driver.AccessReadWrite,
			driver.AccessReadWrite, driver.AccessRead, driver.AccessReadWrite, 2}[o.e%8]
		var applies []error
		if dev == mDevs {
			applies = append(applies, driver.ErrNoDevice)
		}
		if !acc.Valid() || n == 0 {
			applies = append(applies, driver.ErrInvalid)
		}
		if mis {
			applies = append(applies, driver.ErrMisaligned)
		}
		if lo+n > len(h.chunks) || (mis && lo+n == len(h.chunks)) {
			applies = append(applies, driver.ErrNotMapped)
		}
		if len(applies) == 0 && acc != driver.AccessNone {
			for _, c := range h.chunks[lo : lo+n] {
				if !h.reach(dev, c.dev) {
					applies = append(applies, driver.ErrAccessDenied)
				}
			}
		}
		off := uint64(lo) * mChunk
		if mis {
			off += g
		}
		if h.expect(a.Grant(driver.DeviceID(dev), off, uint64(n)*mChunk, acc), applies...) {
			for _, c := range h.chunks[lo : lo+n] {
				c.access[dev] = acc
			}
		}
	case opMigrate:
		lo, n, mis := h.span(o)
		to := device(o.c)
		var applies []error
		if to == mDevs {
			applies = append(applies, driver.ErrNoDevice)
		}
		if n == 0 {
			applies = append(applies, driver.ErrInvalid)
		}
		if mis {
			applies = append(applies, driver.ErrMisaligned)
		}
		if lo+n > len(h.chunks) || (mis && lo+n == len(h.chunks)) {
			applies = append(applies, driver.ErrNotMapped)
		}
		var moved []*mChunkState
		if len(applies) == 0 {
			for _, c := range h.chunks[lo : lo+n] {
				if c.dev == to {
					continue
				}
				moved = append(moved, c)
				for d, acc := range c.access {
					if acc != driver.AccessNone && !h.reach(d, to) {
						applies = append(applies, driver.ErrAccessDenied)
					}
				}
			}
			if len(moved) > h.free()[to] {
				applies = append(applies, driver.ErrOutOfMemory)
			}
		}
		off := uint64(lo) * mChunk
		if mis {
			off += g
		}
		if h.expect(a.Migrate(off, uint64(n)*mChunk, driver.DeviceID(to)), applies...) {
			for _, c := range moved {
				c.dev = to
			}
		}
	case opRead, opWrite:
		dev := device(o.c)
		off := (uint64(o.a)<<8 | uint64(o.b)) * 4099 % (h.length + 1)
		if o.e%8 == 0 {
			off = h.length - min(h.length, uint64(o.e%3)) // at the very end
		}
		n := 1 + int(o.d%24)
		want := driver.AccessRead
		if o.kind == opWrite {
			want = driver.AccessReadWrite
		}
		if o.c < 192 {
			// Mostly, move to the next chunk inside Len that some device
			// may touch, and take that device: most reads and writes get
			// through to the bytes.
			inLen := int((h.length + mChunk - 1) / mChunk)
		find:
			for k := range inLen {
				i := (int(off/mChunk) + k) % inLen
				for j := range mDevs {
					if d := (int(o.c) + j) % mDevs; h.chunks[i].access[d].Allows(want) {
						off = uint64(i)*mChunk + off%mChunk
						dev = d
						break find
					}
				}
			}
		}
		var applies []error
		switch {
		case dev == mDevs:
			applies = append(applies, driver.ErrNoDevice)
		case off+uint64(n) > h.length:
			applies = append(applies, driver.ErrAccessDenied)
		default:
			for i := off / mChunk; i <= (off+uint64(n)-1)/mChunk; i++ {
				if !h.chunks[i].access[dev].Allows(want) {
					applies = append(applies, driver.ErrAccessDenied)
				}
			}
		}
		buf := make([]byte, n)
		if o.kind == opWrite {
			for i := range buf {
				buf[i] = o.e + byte(len(h.log)) + byte(i)
			}
			if h.expect(a.Write(driver.DeviceID(dev), off, buf), applies...) {
				for i, b := range buf {
					at := off + uint64(i)
					h.chunks[at/mChunk].data[at%mChunk] = b
				}
			}
			return
		}
		if h.expect(a.Read(driver.DeviceID(dev), off, buf), applies...) {
			for i, b := range buf {
				at := off + uint64(i)
				require.Equal(t, h.chunks[at/mChunk].data[at%mChunk], b, "byte at %#x\nsteps:\n%s", at, h.steps())
			}
		}
	case opHog:
		d := int(o.a) % mDevs
		if h.hogs[d] != nil {
			require.NoError(t, h.hogs[d].Release())
			h.hogs[d] = nil
			return
		}
		var applies []error
		if h.free()[d] == 0 {
			applies = append(applies, driver.ErrOutOfMemory)
		}
		c, err := h.e.mem.Create(driver.DeviceID(d), mChunk, driver.ChunkOptions{})
		closed := h.closed
		h.closed = false // the hog is beside the arena: Close does not touch it
		if h.expect(err, applies...) {
			h.hogs[d] = c
		}
		h.closed = closed
		return
	case opClose:
		if o.a >= 64 || len(h.log) < maxOps/2 { // rarely, and late: a closed arena refuses everything
			return
		}
		if h.expect(a.Close()) {
			h.closed = true
			h.chunks, h.length = nil, 0
		}
	}
}

// compare checks that the model, the arena, the page table, physical usage
// and the driver agree.
func (h *harness) compare() {
	t, a := h.t, h.a
	require.NoError(t, a.Check(), h.steps())
	require.NoError(t, h.e.mem.Check(), h.steps())
	require.NoError(t, h.e.drv.Check(), h.steps())
	used := make([]uint64, mDevs)
	for d, hog := range h.hogs {
		if hog != nil {
			used[d] += mChunk
		}
	}
	for _, c := range h.chunks {
		used[c.dev] += mChunk
	}
	require.Equal(t, used, h.e.used(t), "usage per device\nsteps:\n%s", h.steps())
	if h.closed {
		require.Empty(t, a.Layout())
		return
	}
	require.Equal(t, h.length, a.Len(), h.steps())
	require.Equal(t, uint64(len(h.chunks))*mChunk, a.Committed(), h.steps())
	var want []driver.DeviceID
	var layout []Extent
	for i, c := range h.chunks {
		want = append(want, driver.DeviceID(c.dev), driver.DeviceID(c.dev))
		if n := len(layout); n > 0 && layout[n-1].Device == driver.DeviceID(c.dev) {
			layout[n-1].Range.Size += mChunk
		} else {
			layout = append(layout, Extent{Range: vaspace.Range{Base: a.Base() + driver.Addr(uint64(i)*mChunk), Size: mChunk}, Device: driver.DeviceID(c.dev)})
		}
		for d := range mDevs {
			acc, err := a.Access(driver.DeviceID(d), uint64(i)*mChunk+g)
			require.NoError(t, err)
			require.Equal(t, c.access[d], acc, "device %d over chunk %d\nsteps:\n%s", d, i, h.steps())
		}
	}
	require.Equal(t, want, devicesOf(t, a), "device of every granule\nsteps:\n%s", h.steps())
	require.Equal(t, layout, a.Layout(), h.steps())
}

// teardown reads every committed byte back (granting each chunk's own
// device read access to do so), closes the arena and checks that every
// chunk went back.
func (h *harness) teardown() {
	t, a := h.t, h.a
	if !h.closed {
		for i, c := range h.chunks {
			off := uint64(i) * mChunk
			require.NoError(t, a.Grant(driver.DeviceID(c.dev), off, mChunk, driver.AccessRead))
			n := min(mChunk, h.length-min(h.length, off))
			got := make([]byte, n)
			require.NoError(t, a.Read(driver.DeviceID(c.dev), off, got))
			require.Equal(t, c.data[:n], got, "contents of chunk %d\nsteps:\n%s", i, h.steps())
		}
		require.NoError(t, a.Close())
	}
	for _, hog := range h.hogs {
		if hog != nil {
			require.NoError(t, hog.Release())
		}
	}
	require.Equal(t, make([]uint64, mDevs), h.e.used(t))
	require.NoError(t, h.e.drv.Check())
}

func runModel(t testing.TB, d backend, cfg config, ops []op) *harness {
	h := newHarness(t, d, cfg)
	for _, o := range ops {
		h.step(o)
		h.compare()
	}
	h.teardown()
	return h
}

// randomOps returns a sequence weighted towards the operations that build
// state, so sequences reach full devices, spread grants and long arenas.
func randomOps(rng *rand.Rand, n int) []op {
	weights := []int{4, 3, 2, 6, 5, 4, 4, 2, 1}
	total := 0
	for _, w := range weights {
		total += w
	}
	ops := make([]op, n)
	for i := range ops {
		x := rng.IntN(total)
		k := 0
		for x >= weights[k] {
			x -= weights[k]
			k++
		}
		ops[i] = op{kind: opKind(k), a: uint8(rng.Uint32()), b: uint8(rng.Uint32()), c: uint8(rng.Uint32()),
			d: uint8(rng.Uint32()), e: uint8(rng.Uint32())}
	}
	return ops
}

func TestMultidevModel(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		seeds := 32 // every configuration twice
		if testing.Short() {
			seeds = 16
		}
		seeds = d.Seeds(seeds)
		var done [numOps]int
		failed := 0
		for seed := range seeds {
			cfg := decodeConfig(byte(seed))
			t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
				// Every run ends by closing its arena, so that Close and
				// the state after it are checked however few seeds run
				// (-short, a stand-in's half): a random close is rare.
				ops := append(randomOps(rand.New(rand.NewPCG(uint64(seed), 11)), maxOps-1), op{kind: opClose})
				h := runModel(t, d, cfg, ops)
				for k, n := range h.done {
					done[k] += n
				}
				failed += h.failed
			})
		}
		// The sequences must reach real states, not only refusals.
		t.Logf("done: %v; refused as predicted: %d", done, failed)
		for k, n := range done {
			if opKind(k) != opClose {
				require.Greater(t, n, seeds, "successful %s operations", opNames[k])
			}
		}
		require.Positive(t, done[opClose], "some sequence closes its arena")
	})
}

func TestDecode(t *testing.T) {
	ops := randomOps(rand.New(rand.NewPCG(1, 1)), 50)
	cfg, got := decode(encode(13, ops))
	require.Equal(t, decodeConfig(13), cfg)
	require.Equal(t, ops, got)
	_, got = decode([]byte{1, 2, 3})
	require.Empty(t, got, "a partial operation is ignored")
	_, got = decode(make([]byte, 1+opBytes*(maxOps+5)))
	require.Len(t, got, maxOps)
}

// FuzzMultidevModel decodes arbitrary bytes into a configuration and an
// operation sequence and runs it against the model. The seed corpus is in
// testdata/fuzz/FuzzMultidevModel.
func FuzzMultidevModel(f *testing.F) {
	f.Add(encode(5, randomOps(rand.New(rand.NewPCG(9, 9)), 40)))
	ds := fuzzDrivers(f, modelMachine(false), modelMachine(true))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, ops := decode(data)
		for _, o := range ops {
			require.Less(t, int(o.kind), int(numOps))
		}
		if len(data) > 0 {
			require.Equal(t, min((len(data)-1)/opBytes, maxOps), len(ops), "decode consumes whole operations")
		}
		for _, d := range ds {
			runModel(t, d, cfg, ops)
		}
	})
}

// TestSeedCorpus checks the fuzz seed corpus is there and decodes into
// real sequences. With VMARENA_WRITE_CORPUS=1 it writes the corpus afresh.
func TestSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzMultidevModel")
	sizes := []int{10, 30, 60, 90, maxOps}
	if os.Getenv("VMARENA_WRITE_CORPUS") == "1" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for i, n := range sizes {
			data := encode(byte(3*i+8*(i%2)), randomOps(rand.New(rand.NewPCG(uint64(200+i), 3)), n))
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d-ops", n)), []byte(body), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "seed-*"))
	require.NoError(t, err)
	require.Len(t, files, len(sizes))
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(body)), "\n")
		require.Len(t, lines, 2, f)
		require.Equal(t, "go test fuzz v1", lines[0], f)
		lit := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		s, err := strconv.Unquote(lit)
		require.NoError(t, err, f)
		_, ops := decode([]byte(s))
		require.GreaterOrEqual(t, len(ops), 10, f)
	}
}
