package arena

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// runOffIndex decodes ops — each three bytes: an operation (put, del, get),
// then a 16-bit key — and runs them against an offIndex and a Go map, the
// model, comparing after each step. Keys are offsets in a small space
// times a stride, so that sequences collide, wrap around the table and
// shift runs back on deletion.
func runOffIndex(t *testing.T, ops []byte) {
	t.Helper()
	var x offIndex
	model := map[uint64]bref{}
	fail := func(format string, args ...any) { t.Fatalf(format, args...) }
	for i := 0; i+3 <= len(ops); i += 3 {
		off := uint64(binary.LittleEndian.Uint16(ops[i+1:])) % 512 * 512
		step := fmt.Sprintf("step %d", i/3)
		switch ops[i] % 4 {
		case 0, 1:
			r := bref(i/3 + 1)
			x.put(off, r)
			model[off] = r
		case 2:
			_, had := model[off]
			require.Equal(t, had, x.del(off), "%s: del %#x", step, off)
			delete(model, off)
		case 3:
			require.Equal(t, model[off], x.get(off), "%s: get %#x", step, off)
		}
		require.Equal(t, len(model), x.len(), step)
		x.check(fail)
	}
	for off, r := range model {
		require.Equal(t, r, x.get(off), "at the end: %#x", off)
	}
	seen := map[uint64]bref{}
	x.all(func(off uint64, r bref) { seen[off] = r })
	require.Equal(t, model, seen, "all lists every record once")
	for off := range model {
		require.True(t, x.del(off))
	}
	require.Zero(t, x.len())
	require.LessOrEqual(t, len(x.slots), minIndexSlots, "emptied, the table shrank back to its smallest")
	x.check(fail)
}

// TestOffIndexModel runs random put, delete and get sequences against the
// model, from an empty index up past several resizes and back down.
func TestOffIndexModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		ops := make([]byte, 3*(200+rng.IntN(3000)))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		// Half the rounds put more than they delete, so the table grows.
		if round%2 == 0 {
			for i := 0; i < len(ops); i += 3 {
				ops[i] = byte(i / 3 % 3) // put, put, del
			}
		}
		runOffIndex(t, ops)
	}
}

// TestOffIndexEmpty: a zero index answers without a table.
func TestOffIndexEmpty(t *testing.T) {
	var x offIndex
	require.Zero(t, x.get(0))
	require.False(t, x.del(0))
	require.Zero(t, x.len())
	x.check(func(format string, args ...any) { t.Fatalf(format, args...) })
}

// FuzzOffIndexModel decodes arbitrary bytes into index operations and
// checks them against the model.
func FuzzOffIndexModel(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 2, 0, 2, 1, 0, 3, 2, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 2, 0, 0, 4, 2, 0, 0, 3, 0, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*4096 {
			ops = ops[:3*4096]
		}
		runOffIndex(t, ops)
	})
}
