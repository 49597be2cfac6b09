package runs

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// runModel decodes ops — each four bytes: lo, length, the value's
// operand, the operation (set, or, and-not) — against a List of n units
// and a plain value per unit, the model, comparing every unit, the runs
// Each reports, and the invariants after each step.
func runModel(t *testing.T, n uint64, ops []byte) {
	t.Helper()
	a := New[uint64](n)
	model := make([]uint64, n)
	for i := 0; i+4 <= len(ops); i += 4 {
		lo := uint64(ops[i]) % n
		hi := lo + 1 + uint64(ops[i+1])%(n-lo)
		v := uint64(ops[i+2]) & 0xf
		var f func(uint64) uint64
		switch ops[i+3] % 3 {
		case 0:
			f = func(uint64) uint64 { return v }
		case 1:
			f = func(w uint64) uint64 { return w | v }
		default:
			f = func(w uint64) uint64 { return w &^ v }
		}
		a.Set(lo, hi, f)
		for g := lo; g < hi; g++ {
			model[g] = f(model[g])
		}
		require.NoError(t, a.Check())
		for g := range n {
			require.Equal(t, model[g], a.At(g), "step %d: unit %d", i/4, g)
		}
		// each over a random window reports the model's words, run-length.
		wlo := uint64(ops[i+1]) % n
		whi := wlo + 1 + uint64(ops[i+2])%(n-wlo)
		next := wlo
		require.NoError(t, a.Each(wlo, whi, func(g0, g1, w uint64) error {
			require.Equal(t, next, g0, "runs follow each other")
			require.Less(t, g0, g1)
			for g := g0; g < g1; g++ {
				require.Equal(t, model[g], w, "unit %d", g)
			}
			next = g1
			return nil
		}))
		require.Equal(t, whi, next, "each covers the window")
	}
}

// TestModel runs random sets over lists of 1 to 300 units.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 200 {
		n := uint64(1 + rng.IntN(300))
		if round%4 == 0 {
			n = uint64(1 + rng.IntN(4))
		}
		ops := make([]byte, 4*(1+rng.IntN(60)))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		runModel(t, n, ops)
	}
}

// TestWholeSetsStayOneRun: values set over the whole list keep one run,
// however many units; a set inside splits it in three, and a whole set
// merges it back.
func TestWholeSetsStayOneRun(t *testing.T) {
	a := New[[4]uint8](1 << 20)
	for dev := range 4 {
		a.Set(0, a.Len(), func(w [4]uint8) [4]uint8 { w[dev] = 3; return w })
	}
	require.Equal(t, 1, a.Runs())
	require.Equal(t, [4]uint8{3, 3, 3, 3}, a.At(12345))
	a.Set(5, 9, func([4]uint8) [4]uint8 { return [4]uint8{} })
	require.Equal(t, 3, a.Runs())
	a.Set(0, a.Len(), func([4]uint8) [4]uint8 { return [4]uint8{1} })
	require.Equal(t, 1, a.Runs(), "a whole set merges everything back")
	require.NoError(t, a.Check())
}

// TestOneRunAllocatesNothing: a new list, and sets over all of it, keep
// their one run inline; the first split allocates, and once split the
// list splits and merges again in the room it has.
func TestOneRunAllocatesNothing(t *testing.T) {
	var l List[[4]uint8]
	require.Zero(t, testing.AllocsPerRun(100, func() {
		l = New[[4]uint8](512)
		l.Set(0, l.Len(), func(w [4]uint8) [4]uint8 { w[1]++; return w })
	}))
	require.Nil(t, l.runs, "one run stays inline")
	require.Equal(t, uint8(1), l.At(7)[1])
	l.Set(5, 9, func([4]uint8) [4]uint8 { return [4]uint8{} })
	require.Equal(t, 3, l.Runs())
	require.NoError(t, l.Check())
	require.Zero(t, testing.AllocsPerRun(100, func() {
		l.Set(0, l.Len(), func([4]uint8) [4]uint8 { return [4]uint8{9} })
		l.Set(5, 9, func([4]uint8) [4]uint8 { return [4]uint8{} })
	}))
	require.Equal(t, 3, l.Runs())
	require.Equal(t, [4]uint8{9}, l.At(4))
	require.Equal(t, [4]uint8{}, l.At(5))
	require.NoError(t, l.Check())
}

// TestCheckFindsBrokenRuns: Check reports each broken invariant.
func TestCheckFindsBrokenRuns(t *testing.T) {
	for name, l := range map[string]List[uint64]{
		"no units":     {n: 0},
		"no runs":      {runs: []run[uint64]{}, n: 4},
		"late start":   {runs: []run[uint64]{{1, 0}}, n: 4},
		"out of order": {runs: []run[uint64]{{0, 0}, {3, 1}, {2, 0}}, n: 4},
		"past the end": {runs: []run[uint64]{{0, 0}, {4, 1}}, n: 4},
		"equal values": {runs: []run[uint64]{{0, 7}, {2, 7}}, n: 4},
	} {
		require.Error(t, l.Check(), name)
	}
}

// FuzzModel decodes arbitrary bytes into sets, checked against the model.
func FuzzModel(f *testing.F) {
	f.Add(uint16(7), []byte{0, 3, 5, 0, 2, 1, 3, 1, 0, 6, 1, 2})
	f.Add(uint16(1), []byte{0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, n uint16, ops []byte) {
		if len(ops) > 4*256 {
			ops = ops[:4*256]
		}
		runModel(t, 1+uint64(n)%512, ops)
	})
}
