package mapping_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The model-based test: random sequences of reserve / free / create /
// release / map / unmap / set-access / write / read run against the real
// stack on the host driver and against a plain reference model. After every
// step the model, the table's own view (Spans), the driver (Table.Check),
// physical usage and the kernel (/proc/self/maps) must agree. Sequences are
// decoded from bytes, so the fuzz target explores the same space.

const (
	mDevs    = 2
	mGran    = 64 * units.KiB
	mCapGran = 16 // device capacity in granules
	mMaxRes  = 4
	mMaxChk  = 24
	opBytes  = 6
	maxOps   = 100
)

type opKind uint8

const (
	opReserve opKind = iota
	opFree
	opCreate
	opRelease
	opMap
	opUnmap
	opSetAccess
	opWrite
	opRead
	numOps
)

var opNames = [...]string{"reserve", "free", "create", "release", "map", "unmap", "set-access", "write", "read"}

// op is one decoded operation; the meaning of a..e depends on kind.
type op struct {
	kind          opKind
	a, b, c, d, e uint8
}

func (o op) String() string {
	return fmt.Sprintf("%s(%d,%d,%d,%d,%d)", opNames[o.kind], o.a, o.b, o.c, o.d, o.e)
}

// decode turns any byte string into operations: opBytes bytes each, a
// trailing partial operation ignored. It never fails.
func decode(data []byte) []op {
	var ops []op
	for len(data) >= opBytes && len(ops) < maxOps {
		ops = append(ops, op{kind: opKind(data[0] % byte(numOps)), a: data[1], b: data[2], c: data[3], d: data[4], e: data[5]})
		data = data[opBytes:]
	}
	return ops
}

// encode is decode's inverse, for building seeds.
func encode(ops []op) []byte {
	var out []byte
	for _, o := range ops {
		out = append(out, byte(o.kind), o.a, o.b, o.c, o.d, o.e)
	}
	return out
}

// Reference model.
type mChunk struct {
	c        *physical.Chunk
	dev      int
	ngran    int
	released bool
	maps     int
	data     []byte // the first byte of each granule, as written
}

func (c *mChunk) alive() bool { return !c.released || c.maps > 0 }

type mMap struct {
	c      *mChunk
	start  int // granule index in the reservation
	access [][mDevs]driver.Access
}

type mRes struct {
	r     *vaspace.Reservation
	tab   *mapping.Table
	ngran int
	maps  []*mMap // unsorted; few
}

// mapAt returns the mapping covering granule g, or nil.
func (r *mRes) mapAt(g int) *mMap {
	for _, m := range r.maps {
		if g >= m.start && g < m.start+m.c.ngran {
			return m
		}
	}
	return nil
}

type harness struct {
	t      testing.TB
	drv    *host.Driver
	space  *vaspace.Space
	mem    *physical.Memory
	res    []*mRes
	chunks []*mChunk
	log    []string
	failed int // operations refused as the model predicted
}

func newHarness(t testing.TB) *harness {
	drv, err := host.New(host.Options{Devices: mDevs, Capacity: mCapGran * mGran, Granularity: mGran})
	require.NoError(t, err)
	h := &harness{t: t, drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
	drivertest.CloseAtEnd(t, drv)
	return h
}

// expect checks err against the failures the model says apply: none means
// the call must succeed; otherwise err must be one of them.
func (h *harness) expect(err error, applies ...error) bool {
	h.t.Helper()
	if len(applies) == 0 {
		require.NoError(h.t, err, "steps:\n%s", strings.Join(h.log, "\n"))
		return true
	}
	h.failed++
	for _, want := range applies {
		if errors.Is(err, want) {
			return false
		}
	}
	require.Failf(h.t, "wrong error", "got %v, want one of %v\nsteps:\n%s", err, applies, strings.Join(h.log, "\n"))
	return false
}

// device decodes a device: one value in eight is the unknown device mDevs.
func device(x uint8) int {
	if x%8 == 7 {
		return mDevs
	}
	return int(x) % mDevs
}

// target decodes a granule of r: with the high bit clear, a granule of an
// existing mapping (its start when the next bit is clear too), so most
// operations meet live state; otherwise any granule up to one past the end.
func target(r *mRes, x uint8) int {
	if x&0x80 == 0 && len(r.maps) > 0 {
		m := r.maps[int(x&0x3f)%len(r.maps)]
		if x&0x40 == 0 {
			return m.start
		}
		return m.start + int(x)%m.c.ngran
	}
	return int(x) % (r.ngran + 1)
}

func (h *harness) addr(r *mRes, g int, half bool) driver.Addr {
	a := r.r.Base() + driver.Addr(uint64(g)*mGran)
	if half {
		a += driver.Addr(mGran / 2)
	}
	return a
}

func (h *harness) step(o op) {
	h.log = append(h.log, o.String())
	switch o.kind {
	case opReserve:
		if len(h.res) == mMaxRes {
			return
		}
		n := 8 + int(o.a%57)
		if o.a%32 == 0 {
			n = 0
		}
		r, err := h.space.Reserve(uint64(n)*mGran, 0)
		var applies []error
		if n == 0 {
			applies = append(applies, driver.ErrInvalid)
		}
		if h.expect(err, applies...) {
			tab, err := mapping.New(r, h.mem)
			require.NoError(h.t, err)
			h.res = append(h.res, &mRes{r: r, tab: tab, ngran: n})
		}
	case opFree:
		if len(h.res) == 0 {
			return
		}
		i := int(o.a) % len(h.res)
		r := h.res[i]
		if len(r.maps) > 0 {
			h.expect(r.r.Free(), driver.ErrBusy)
			return
		}
		require.NoError(h.t, r.tab.Close())
		require.NoError(h.t, r.r.Free())
		h.res = append(h.res[:i], h.res[i+1:]...)
	case opCreate:
		if len(h.chunks) == mMaxChk {
			return
		}
		dev := device(o.a)
		halves := 2 * (int(o.b%4) + 1)
		switch o.b % 16 {
		case 0:
			halves = 0
		case 1:
			halves = 3
		}
		var applies []error
		if dev == mDevs {
			applies = append(applies, driver.ErrNoDevice)
		}
		if halves == 0 {
			applies = append(applies, driver.ErrInvalid)
		}
		if halves%2 == 1 {
			applies = append(applies, driver.ErrMisaligned)
		}
		if dev < mDevs && halves%2 == 0 && h.used(dev)+halves/2 > mCapGran {
			applies = append(applies, driver.ErrOutOfMemory)
		}
		c, err := h.mem.Create(driver.DeviceID(dev), uint64(halves)*mGran/2, driver.ChunkOptions{Shareable: o.c%4 == 0})
		if h.expect(err, applies...) {
			h.chunks = append(h.chunks, &mChunk{c: c, dev: dev, ngran: halves / 2, data: make([]byte, halves/2)})
		}
	case opRelease:
		if len(h.chunks) == 0 {
			return
		}
		c := h.chunks[int(o.a)%len(h.chunks)]
		var applies []error
		if c.released {
			applies = append(applies, driver.ErrBadHandle)
		}
		if h.expect(c.c.Release(), applies...) {
			c.released = true
		}
	case opMap:
		if len(h.res) == 0 || len(h.chunks) == 0 {
			return
		}
		r := h.res[int(o.a)%len(h.res)]
		c := h.chunks[int(o.c)%len(h.chunks)]
		if o.c&0x80 == 0 { // prefer a chunk whose handle is live
			for k := range h.chunks {
				if x := h.chunks[(int(o.c)+k)%len(h.chunks)]; !x.released {
					c = x
					break
				}
			}
		}
		g := int(o.b) % (r.ngran + 2)
		if o.b&0x80 == 0 { // prefer the first free stretch that fits
			for k := 0; k+c.ngran <= r.ngran; k++ {
				free := true
				for j := k; j < k+c.ngran; j++ {
					free = free && r.mapAt(j) == nil
				}
				if free {
					g = k
					break
				}
			}
		}
		half := o.d%8 == 0
		lo := uint64(g) * mGran
		if half {
			lo += mGran / 2
		}
		hi := lo + uint64(c.ngran)*mGran
		var applies []error
		if hi > uint64(r.ngran)*mGran {
			applies = append(applies, driver.ErrNotReserved)
		}
		for _, m := range r.maps {
			if lo < uint64(m.start+m.c.ngran)*mGran && uint64(m.start)*mGran < hi {
				applies = append(applies, driver.ErrOverlap)
			}
		}
		if c.released {
			applies = append(applies, driver.ErrBadHandle)
		}
		if half {
			applies = append(applies, driver.ErrMisaligned)
		}
		if h.expect(r.tab.Map(h.addr(r, g, half), c.c), applies...) {
			r.maps = append(r.maps, &mMap{c: c, start: g, access: make([][mDevs]driver.Access, c.ngran)})
			c.maps++
		}
	case opUnmap:
		if len(h.res) == 0 {
			return
		}
		r := h.res[int(o.a)%len(h.res)]
		g := target(r, o.b)
		m := r.mapAt(g)
		var applies []error
		switch {
		case g == r.ngran:
			applies = append(applies, driver.ErrNotReserved)
		case m == nil:
			applies = append(applies, driver.ErrNotMapped)
		case m.start != g:
			applies = append(applies, driver.ErrPartial)
		}
		if h.expect(r.tab.Unmap(h.addr(r, g, false)), applies...) {
			for i, x := range r.maps {
				if x == m {
					r.maps = append(r.maps[:i], r.maps[i+1:]...)
				}
			}
			m.c.maps--
		}
	case opSetAccess:
		if len(h.res) == 0 {
			return
		}
		r := h.res[int(o.a)%len(h.res)]
		g := target(r, o.b)
		dev := device(o.c)
		acc := []driver.Access{driver.AccessNone, driver.AccessRead, driver.AccessReadWrite, driver.AccessReadWrite,
			driver.AccessRead, driver.AccessReadWrite, driver.AccessNone, 2}[o.d%8]
		n := int(o.e%4) + 1
		if o.e%16 == 15 {
			n = 0
		}
		var applies []error
		if dev == mDevs {
			applies = append(applies, driver.ErrNoDevice)
		}
		if !acc.Valid() || n == 0 {
			applies = append(applies, driver.ErrInvalid)
		}
		if g+n > r.ngran {
			applies = append(applies, driver.ErrNotReserved)
		}
		for k := g; k < min(g+n, r.ngran); k++ {
			if r.mapAt(k) == nil {
				applies = append(applies, driver.ErrNotMapped)
			}
		}
		if h.expect(r.tab.SetAccess(h.addr(r, g, false), uint64(n)*mGran, driver.DeviceID(dev), acc), applies...) {
			for k := g; k < g+n; k++ {
				m := r.mapAt(k)
				m.access[k-m.start][dev] = acc
			}
		}
	case opWrite, opRead:
		if len(h.res) == 0 {
			return
		}
		r := h.res[int(o.a)%len(h.res)]
		g := target(r, o.b)
		dev := device(o.c)
		want := driver.AccessRead
		if o.kind == opWrite {
			want = driver.AccessReadWrite
		}
		var applies []error
		var m *mMap
		switch {
		case dev == mDevs:
			applies = append(applies, driver.ErrNoDevice)
		case g == r.ngran:
			applies = append(applies, driver.ErrNotReserved)
		default:
			m = r.mapAt(g)
			if m == nil || !m.access[g-m.start][dev].Allows(want) {
				applies = append(applies, driver.ErrAccessDenied)
			}
		}
		buf := []byte{o.d}
		if o.kind == opWrite {
			if h.expect(r.tab.Write(driver.DeviceID(dev), h.addr(r, g, false), buf), applies...) {
				m.c.data[g-m.start] = o.d
			}
			return
		}
		if h.expect(r.tab.Read(driver.DeviceID(dev), h.addr(r, g, false), buf), applies...) {
			require.Equal(h.t, m.c.data[g-m.start], buf[0], "byte read at granule %d\nsteps:\n%s", g, strings.Join(h.log, "\n"))
		}
	}
}

func (h *harness) used(dev int) int {
	n := 0
	for _, c := range h.chunks {
		if c.dev == dev && c.alive() {
			n += c.ngran
		}
	}
	return n
}

// compare checks that model, library, driver and kernel agree.
func (h *harness) compare() {
	t := h.t
	steps := strings.Join(h.log, "\n")
	require.NoError(t, h.drv.Check(), steps)
	require.NoError(t, h.mem.Check(), steps)
	require.NoError(t, h.space.Check(), steps)
	for dev := 0; dev < mDevs; dev++ {
		u, err := h.mem.Usage(driver.DeviceID(dev))
		require.NoError(t, err)
		require.Equal(t, uint64(h.used(dev))*mGran, u.Used, "device %d used\nsteps:\n%s", dev, steps)
		require.Equal(t, u.Used, h.drv.Used(driver.DeviceID(dev)), "device %d: physical and driver disagree", dev)
	}
	for _, c := range h.chunks {
		if c.alive() {
			require.Equal(t, c.maps, c.c.Mappings(), "%s mappings\nsteps:\n%s", c.c, steps)
		}
	}
	kernel, err := procmaps.Read()
	require.NoError(t, err)
	for _, r := range h.res {
		require.NoError(t, r.tab.Check(), steps)
		// The table's spans, granule by granule, against the model.
		g := 0
		for s := range r.tab.Spans() {
			require.Zero(t, s.Range.Size%mGran)
			for k := 0; k < int(s.Range.Size/mGran); k, g = k+1, g+1 {
				m := r.mapAt(g)
				if m == nil {
					require.Equal(t, mapping.Reserved, s.State, "granule %d\nsteps:\n%s", g, steps)
					continue
				}
				require.Same(t, m.c.c, s.Chunk, "granule %d\nsteps:\n%s", g, steps)
				require.Equal(t, uint64(g-m.start)*mGran, s.ChunkOffset+uint64(k)*mGran, "granule %d", g)
				acc := m.access[g-m.start]
				require.Equal(t, acc[:], s.Access, "granule %d\nsteps:\n%s", g, steps)
				state := mapping.Mapped
				if acc != [mDevs]driver.Access{} {
					state = mapping.Accessible
				}
				require.Equal(t, state, s.State, "granule %d", g)
			}
		}
		require.Equal(t, r.ngran, g, "spans cover the reservation")
		// The kernel's view of every granule.
		for g := 0; g < r.ngran; g++ {
			a := uint64(h.addr(r, g, false))
			e, ok := procmaps.Find(kernel, a)
			require.True(t, ok, "granule %d at %#x is not in /proc/self/maps", g, a)
			m := r.mapAt(g)
			want := "---p"
			if m != nil {
				var widest driver.Access
				for _, x := range m.access[g-m.start] {
					widest |= x
				}
				want = map[driver.Access]string{driver.AccessNone: "---s", driver.AccessRead: "r--s", driver.AccessReadWrite: "rw-s"}[widest]
				require.Contains(t, e.Path, "memfd:vmarena", "granule %d", g)
			}
			require.Equal(t, want, e.Perms, "granule %d at %#x in the kernel\nsteps:\n%s", g, a, steps)
		}
	}
}

func runModel(t testing.TB, ops []op) *harness {
	h := newHarness(t)
	for _, o := range ops {
		h.step(o)
		h.compare()
	}
	defer h.teardown()
	return h
}

// teardown releases everything through the library and checks that every
// byte went back to the device and the kernel.
func (h *harness) teardown() {
	t := h.t
	// Tear down through the library, checking nothing is left.
	for _, r := range h.res {
		require.NoError(t, r.tab.Close())
		require.NoError(t, r.r.Free())
	}
	for _, c := range h.chunks {
		if !c.released {
			require.NoError(t, c.c.Release())
		}
	}
	for dev := driver.DeviceID(0); dev < mDevs; dev++ {
		u, err := h.mem.Usage(dev)
		require.NoError(t, err)
		require.Zero(t, u.Used)
		hb, err := h.drv.HeapBytes(dev)
		require.NoError(t, err)
		require.Zero(t, hb, "heap of device %d returned to the kernel", dev)
	}
	require.NoError(t, h.drv.Check())
}

// randomOps returns a sequence biased towards the operations that build
// state, so long sequences reach full devices and crowded reservations.
func randomOps(rng *rand.Rand, n int) []op {
	weights := []int{2, 1, 4, 2, 5, 3, 4, 3, 3}
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

func TestModel(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 8
	}
	for seed := 0; seed < seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			h := runModel(t, randomOps(rand.New(rand.NewPCG(uint64(seed), 7)), 150))
			live := 0
			for _, r := range h.res {
				live += len(r.maps)
			}
			t.Logf("%d operations refused as predicted, %d chunks created, %d reservations and %d mappings live at the end",
				h.failed, len(h.chunks), len(h.res), live)
		})
	}
}

func TestDecode(t *testing.T) {
	ops := randomOps(rand.New(rand.NewPCG(1, 1)), 50)
	require.Equal(t, ops, decode(encode(ops)))
	require.Empty(t, decode([]byte{1, 2, 3}), "a partial operation is ignored")
	require.Len(t, decode(make([]byte, opBytes*(maxOps+5))), maxOps)
}

// FuzzModel decodes arbitrary bytes into an operation sequence and runs it
// against the model. The seed corpus is in testdata/fuzz/FuzzModel.
func FuzzModel(f *testing.F) {
	f.Add(encode(randomOps(rand.New(rand.NewPCG(9, 9)), 60)))
	f.Fuzz(func(t *testing.T, data []byte) {
		ops := decode(data)
		for _, o := range ops {
			require.Less(t, int(o.kind), int(numOps))
		}
		require.Equal(t, min(len(data)/opBytes, maxOps), len(ops), "decode consumes whole operations")
		require.Equal(t, ops, decode(encode(ops)), "encode inverts decode")
		runModel(t, ops)
	})
}

// TestSeedCorpus checks the fuzz seed corpus is there and decodes into real
// sequences. With VMARENA_WRITE_CORPUS=1 it writes the corpus afresh.
func TestSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzModel")
	if os.Getenv("VMARENA_WRITE_CORPUS") == "1" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for i, n := range []int{8, 25, 50, 75, maxOps} {
			data := encode(randomOps(rand.New(rand.NewPCG(uint64(100+i), 3)), n))
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d-ops", n)), []byte(body), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "seed-*"))
	require.NoError(t, err)
	require.Len(t, files, 5)
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.SplitN(string(body), "\n", 3)
		require.Equal(t, "go test fuzz v1", lines[0])
		quoted := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		data, err := strconv.Unquote(quoted)
		require.NoError(t, err, f)
		require.NotEmpty(t, decode([]byte(data)), f)
	}
}
