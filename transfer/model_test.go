package transfer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/transfer"
)

// The model-based test: random sequences of Register, Close, Descriptor,
// Put, Get and remap on one engine talking to itself (loopback), against
// a model that is byte arrays and books. After every step each region's
// bytes, and the engine's Stats, must be the model's.

// modelOp is one step, decoded from bytes (decodeOps) so that the fuzz
// target explores the same space as the random test.
type modelOp struct {
	kind       byte // opRegister...
	a, b       int  // a region or registration index, and a second one
	off1, off2 uint64
	n          uint64
	seed       uint64
}

const (
	opRegister = iota
	opClose
	opDescriptor
	opPut
	opGet
	opRemap
)

// opWeights draws moves most often, then registrations, and remaps and
// closes seldom enough that most registrations live a while.
var opWeights = []byte{opRegister, opRegister, opClose, opDescriptor, opPut, opPut, opPut, opPut, opPut,
	opGet, opGet, opGet, opGet, opGet, opRemap, opDescriptor}

// modelSizes are the regions' sizes: small, and not all the same, so
// ranges past one region's end fit in another.
var modelSizes = []uint64{4096, 8192, 12288}

// decodeOps reads steps from data, 6 bytes each (a trailing part is
// ignored): kind (through opWeights), a, b, then three bytes that place and size a move.
// Offsets and lengths reach somewhat past the regions, so that bad ranges
// are drawn too.
func decodeOps(data []byte) []modelOp {
	var ops []modelOp
	for ; len(data) >= 6; data = data[6:] {
		op := modelOp{kind: opWeights[data[0]%byte(len(opWeights))], a: int(data[1]), b: int(data[2])}
		op.n = 1 + uint64(data[3])*4   // up to 1021 bytes
		op.off1 = uint64(data[4]) * 16 // up to 4080: past the smallest region's end, now and then
		op.off2 = uint64(data[5]) * 16
		if data[3] == 255 {
			op.n = 1 << 20 // past every region
		}
		op.seed = uint64(data[3])<<8 | uint64(data[4])
		ops = append(ops, op)
	}
	return ops
}

// modelReg is a registration and what the model knows of it.
type modelReg struct {
	r      *transfer.Registration
	d      transfer.Descriptor
	region int
	epoch  int // the region's epoch when registered: stale once the region's moves on
	closed bool
}

// pick draws one of n registrations from a, mostly among the last three
// made (older ones are mostly stale or closed by then).
func pick(a, n int) int {
	if a%4 != 0 {
		return n - 1 - (a/4)%min(n, 3)
	}
	return (a / 4) % n
}

// runModel runs ops and checks every step against the model.
func runModel(t *testing.T, ops []modelOp) (outcomes map[string]int) {
	outcomes = map[string]int{}
	h := mustHostMem(t, 64<<20)
	e, err := transfer.New(transfer.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	var regions []*region
	var model [][]byte
	epochs := make([]int, len(modelSizes))
	for i, n := range modelSizes {
		r, err := newRegion(h.a, n, uint64(i))
		require.NoError(t, err)
		defer func() { require.NoError(t, r.end()) }()
		regions = append(regions, r)
		model = append(model, seeded(int(n), uint64(i)))
	}
	p := connect(t, e, e.Addr())
	var regs []*modelReg
	var want transfer.Stats
	ctx := context.Background()
	stale := func(m *modelReg) bool { return m.epoch != epochs[m.region] }
	for step, op := range ops {
		what := fmt.Sprintf("step %d %+v", step, op)
		switch op.kind {
		case opRegister:
			k := op.a % len(regions)
			r, err := e.Register(regions[k].t)
			require.NoError(t, err, what)
			d, err := r.Descriptor()
			require.NoError(t, err, what)
			regs = append(regs, &modelReg{r: r, d: d, region: k, epoch: epochs[k]})
		case opClose, opDescriptor:
			if len(regs) == 0 {
				continue
			}
			m := regs[pick(op.a, len(regs))]
			if op.kind == opClose {
				err := m.r.Close()
				if m.closed {
					drivertest_RequireIs(t, err, driver.ErrClosed, what)
				} else {
					require.NoError(t, err, what)
				}
				m.closed = true
				continue
			}
			d, err := m.r.Descriptor()
			if m.closed || stale(m) {
				drivertest_RequireIs(t, err, driver.ErrClosed, what)
			} else {
				require.NoError(t, err, what)
				require.Equal(t, m.d, d, what)
			}
		case opPut, opGet:
			if len(regs) == 0 {
				continue
			}
			local, remote := regs[pick(op.a, len(regs))], regs[pick(op.b, len(regs))]
			if local.region == remote.region && op.off1 < op.off2+op.n && op.off2 < op.off1+op.n {
				continue // moving a region's bytes onto themselves: the order of the copy is not defined
			}
			o := transfer.Op{Local: local.r, LocalOff: op.off1, Remote: remote.d, RemoteOff: op.off2, Len: op.n}
			var err error
			if op.kind == opPut {
				err = p.Put(ctx, o)
			} else {
				err = p.Get(ctx, o)
			}
			switch {
			case op.off1+op.n > local.r.Len() || op.off2+op.n > remote.d.Len:
				drivertest_RequireIs(t, err, driver.ErrInvalid, what)
				want.Refused++
				outcomes["invalid"]++
			case local.closed || stale(local) || remote.closed || stale(remote):
				drivertest_RequireIs(t, err, driver.ErrClosed, what)
				want.Refused++
				outcomes["closed"]++
			default:
				require.NoError(t, err, what)
				outcomes["moved"]++
				src, dst := model[local.region][op.off1:op.off1+op.n], model[remote.region][op.off2:op.off2+op.n]
				if op.kind == opPut {
					copy(dst, src)
					want.Puts += 2 // issued and served
				} else {
					copy(src, dst)
					want.Gets += 2
				}
				want.BytesIn += op.n
				want.BytesOut += op.n
			}
		case opRemap:
			k := op.a % len(regions)
			require.NoError(t, regions[k].remap(op.seed), what)
			epochs[k]++
			model[k] = seeded(int(modelSizes[k]), op.seed)
		}
		for k, r := range regions {
			got, err := r.bytes()
			require.NoError(t, err, what)
			if sha(got) != sha(model[k]) {
				require.Equal(t, model[k], got, "%s: region %d", what, k)
			}
		}
		require.Equal(t, want, e.Stats(), what)
		require.NoError(t, e.Check(), what)
	}
	require.NoError(t, p.Close())
	return outcomes
}

func drivertest_RequireIs(t *testing.T, err, want error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.True(t, errors.Is(err, want), "%s: want %v, got %v", what, want, err)
}

// TestModel runs random op sequences against the model.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 26))
	for round := range 8 {
		data := make([]byte, 6*150)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			out := runModel(t, decodeOps(data))
			t.Logf("moves: %v", out)
			require.Positive(t, out["moved"], "some moves were done")
			require.Positive(t, out["closed"], "some were refused as stale or closed")
		})
	}
}

// FuzzModel decodes the fuzzer's bytes into an op sequence and runs it
// against the model.
func FuzzModel(f *testing.F) {
	// register 0, register 1, put, get, remap 1, put, descriptor, close, get
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 4, 0, 1, 10, 1, 2, 9, 1, 0, 3, 4, 5,
		14, 1, 0, 9, 9, 9, 4, 0, 1, 1, 1, 1, 3, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 9, 0, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 6*64 {
			data = data[:6*64]
		}
		runModel(t, decodeOps(data))
	})
}
