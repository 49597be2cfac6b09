package pickle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
)

// p builds a protocol-4 pickle of the opcodes given, with STOP after them.
func p(ops ...[]byte) []byte {
	b := []byte{opProto, 4}
	for _, o := range ops {
		b = append(b, o...)
	}
	return append(b, opStop)
}

func o(op byte, arg ...byte) []byte { return append([]byte{op}, arg...) }

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func str(s string) []byte { return append([]byte{opShortBinUni, byte(len(s))}, s...) }

func TestOpcodes(t *testing.T) {
	list := func(items ...any) *List { return &List{Items: items} }
	floatBytes := binary.BigEndian.AppendUint64(nil, math.Float64bits(1.5))
	for _, tc := range []struct {
		name string
		in   []byte
		want any
	}{
		{"NONE", p(o(opNone)), nil},
		{"NEWTRUE", p(o(opNewTrue)), true},
		{"NEWFALSE", p(o(opNewFalse)), false},
		{"BININT", p(o(opBinInt, le32(uint32(0xfffffffe))...)), int64(-2)},
		{"BININT1", p(o(opBinInt1, 200)), int64(200)},
		{"BININT2", p(o(opBinInt2, 0x34, 0x12)), int64(0x1234)},
		{"LONG1 empty", p(o(opLong1, 0)), int64(0)},
		{"LONG1 positive", p(o(opLong1, 6, 0x00, 0x20, 0x5e, 0x1c, 0x1f, 0x7f)), int64(0x7f1f1c5e2000)},
		{"LONG1 negative", p(o(opLong1, 2, 0x00, 0xff)), int64(-256)},
		{"LONG1 64 bits", p(o(opLong1, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)), int64(math.MaxInt64)},
		{"LONG4", p(o(opLong4, append(le32(1), 5)...)), int64(5)},
		{"BINFLOAT", p(o(opBinFloat, floatBytes...)), 1.5},
		{"SHORT_BINUNICODE", p(str("alloc")), "alloc"},
		{"BINUNICODE", p(o(opBinUnicode, append(le32(2), "é"...)...)), "é"},
		{"BINUNICODE8", p(o(opBinUnicode8, append(le64(1), 'x')...)), "x"},
		{"SHORT_BINBYTES", p(o(opShortBinBytes, 2, 1, 2)), []byte{1, 2}},
		{"BINBYTES", p(o(opBinBytes, append(le32(1), 9)...)), []byte{9}},
		{"BINBYTES8", p(o(opBinBytes8, le64(0)...)), []byte{}},
		{"EMPTY_TUPLE", p(o(opEmptyTuple)), Tuple{}},
		{"TUPLE", p(o(opMark), o(opNone), o(opNewTrue), o(opTuple)), Tuple{nil, true}},
		{"TUPLE1", p(o(opNone), o(opTuple1)), Tuple{nil}},
		{"TUPLE2", p(o(opBinInt1, 1), o(opBinInt1, 2), o(opTuple2)), Tuple{int64(1), int64(2)}},
		{"TUPLE3", p(o(opBinInt1, 1), o(opBinInt1, 2), o(opBinInt1, 3), o(opTuple3)), Tuple{int64(1), int64(2), int64(3)}},
		{"EMPTY_LIST", p(o(opEmptyList)), list()},
		{"LIST", p(o(opMark), o(opBinInt1, 7), o(opList)), list(int64(7))},
		{"APPEND", p(o(opEmptyList), o(opBinInt1, 7), o(opAppend)), list(int64(7))},
		{"APPENDS", p(o(opEmptyList), o(opMark), o(opBinInt1, 7), o(opNone), o(opAppends)), list(int64(7), nil)},
		{"APPENDS empty", p(o(opEmptyList), o(opMark), o(opAppends)), list()},
		{"POP", p(o(opNone), o(opNewTrue), o(opPop)), nil},
		{"POP of a mark", p(o(opNone), o(opMark), o(opPop)), nil},
		{"POP_MARK", p(o(opNone), o(opMark), o(opNewTrue), o(opNewFalse), o(opPopMark)), nil},
		{"DUP", p(o(opNone), o(opDup), o(opTuple2)), Tuple{nil, nil}},
		{"FRAME", p(o(opFrame, le64(1)...), o(opNone)), nil},
		{"BINPUT BINGET", p(str("a"), o(opBinPut, 3), o(opPop), o(opBinGet, 3)), "a"},
		{"LONG_BINPUT LONG_BINGET", p(str("a"), o(opLongBinPut, le32(70000)...), o(opPop), o(opLongBinGet, le32(70000)...)), "a"},
		{"MEMOIZE", p(str("a"), o(opMemoize), str("b"), o(opMemoize), o(opTuple2), o(opBinGet, 1), o(opTuple2)),
			Tuple{Tuple{"a", "b"}, "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, v)
		})
	}
}

func TestDicts(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"SETITEM", p(o(opEmptyDict), str("a"), o(opBinInt1, 1), o(opSetItem), str("b"), o(opNone), o(opSetItem))},
		{"SETITEMS", p(o(opEmptyDict), o(opMark), str("a"), o(opBinInt1, 1), str("b"), o(opNone), o(opSetItems))},
		{"DICT", p(o(opMark), str("a"), o(opBinInt1, 1), str("b"), o(opNone), o(opDict))},
		{"a key set twice keeps its place", p(o(opEmptyDict), o(opMark), str("a"), o(opBinInt1, 9), str("b"), o(opNone), str("a"), o(opBinInt1, 1), o(opSetItems))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode(tc.in)
			require.NoError(t, err)
			d := v.(*Dict)
			require.Equal(t, 2, d.Len())
			require.Equal(t, []any{"a", "b"}, d.Keys())
			a, ok := d.Get("a")
			require.True(t, ok)
			require.Equal(t, int64(1), a)
			b, ok := d.Get("b")
			require.True(t, ok)
			require.Nil(t, b)
			_, ok = d.Get("c")
			require.False(t, ok)
		})
	}
	// A dict past smallDict keys is indexed; keys that cannot be dict keys
	// are never found, and never panic.
	ops := [][]byte{o(opEmptyDict), o(opMark)}
	for i := range 20 {
		ops = append(ops, o(opBinInt1, byte(i)), o(opBinInt1, byte(100+i)))
	}
	ops = append(ops, o(opBinInt1, 3), o(opNone), o(opSetItems))
	v, err := Decode(p(ops...))
	require.NoError(t, err)
	big := v.(*Dict)
	require.Equal(t, 20, big.Len())
	got, ok := big.Get(int64(19))
	require.True(t, ok)
	require.Equal(t, int64(119), got)
	got, ok = big.Get(int64(3))
	require.True(t, ok)
	require.Nil(t, got, "set twice: the last value")
	for _, key := range []any{Tuple{int64(1)}, []byte("a"), &List{}, math.NaN(), int64(20)} {
		_, ok := big.Get(key)
		require.False(t, ok)
	}
	var nilDict *Dict
	require.Zero(t, nilDict.Len())
	require.Nil(t, nilDict.Keys())
	_, ok = nilDict.Get("a")
	require.False(t, ok)
}

// TestSharedList: the memo shares a list, and a list may hold itself.
func TestSharedList(t *testing.T) {
	v, err := Decode(p(o(opEmptyList), o(opMemoize), o(opBinGet, 0), o(opAppend)))
	require.NoError(t, err)
	l := v.(*List)
	require.Len(t, l.Items, 1)
	require.Same(t, l, l.Items[0])
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		msg  string
	}{
		{"GLOBAL", p(o(opGlobal), []byte("os\nsystem\n")), "GLOBAL refused"},
		{"STACK_GLOBAL", p(str("os"), str("system"), o(opStackGlobal)), "STACK_GLOBAL refused"},
		{"REDUCE", p(o(opNone), o(opEmptyTuple), o(opReduce)), "REDUCE refused"},
		{"BUILD", p(o(opNone), o(opEmptyDict), o(opBuild)), "BUILD refused"},
		{"NEWOBJ", p(o(opNone), o(opEmptyTuple), o(opNewObj)), "NEWOBJ refused"},
		{"BINPERSID", p(o(opNone), o(opBinPersID)), "BINPERSID refused"},
		{"unknown opcode", p(o(0xff)), "0xff"},
		{"text-mode INT", p([]byte("I1\n")), "is not taken"},
		{"empty", nil, "ends before its STOP"},
		{"no STOP", []byte{opProto, 4, opNone}, "ends before its STOP"},
		{"protocol 1", []byte{opProto, 1, opNone, opStop}, "protocol 1"},
		{"protocol 6", []byte{opProto, 6, opNone, opStop}, "protocol 6"},
		{"bytes after STOP", append(p(o(opNone)), 0), "after STOP"},
		{"STOP on an empty stack", p(), "STOP with 0 values"},
		{"STOP with two values", p(o(opNone), o(opNone)), "STOP with 2 values"},
		{"STOP with a mark open", p(o(opMark), o(opNone)), "1 marks open"},
		{"a string past the end", p(o(opBinUnicode, le32(1<<31)...)), "with 1 left"},
		{"a huge BINUNICODE8", p(o(opBinUnicode8, le64(math.MaxUint64)...)), "bytes with"},
		{"a frame past the end", p(o(opFrame, le64(100)...)), "a frame of 100 bytes"},
		{"not UTF-8", p(o(opShortBinUni, 1, 0xff)), "not UTF-8"},
		{"an int wider than 64 bits as a dict key", p(o(opEmptyDict), o(opLong1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1), o(opNone), o(opSetItem)), "wider than 64 bits"},
		{"BINGET of an unset entry", p(o(opBinGet, 4)), "memo entry 4 is not set"},
		{"BINPUT on an empty stack", p(o(opBinPut, 0)), "1 values wanted"},
		{"APPEND onto a dict", p(o(opEmptyDict), o(opNone), o(opAppend)), "APPEND onto a dict"},
		{"APPENDS without a mark", p(o(opEmptyList), o(opNone), o(opAppends)), "no MARK open"},
		{"SETITEM onto a list", p(o(opEmptyList), str("a"), o(opNone), o(opSetItem)), "SETITEM onto a list"},
		{"SETITEMS with a key alone", p(o(opEmptyDict), o(opMark), str("a"), o(opSetItems)), "key-value pairs"},
		{"a list as a dict key", p(o(opEmptyDict), o(opEmptyList), o(opNone), o(opSetItem)), "dict key of type list"},
		{"a NaN dict key", p(o(opEmptyDict), o(opBinFloat, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0), o(opNone), o(opSetItem)), "NaN"},
		{"TUPLE2 across a mark", p(o(opNone), o(opMark), o(opNone), o(opTuple2)), "2 values wanted above the mark, 1 there"},
		{"POP on an empty stack", p(o(opPop)), "1 values wanted"},
		{"TUPLE without a mark", p(o(opNone), o(opTuple)), "no MARK open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.in)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestLimits(t *testing.T) {
	_, err := DecodeLimits(p(o(opNone)), Limits{MaxInput: 3})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "more than the limit of 3")

	_, err = DecodeLimits(p(o(opMark), o(opNone), o(opNone), o(opNone), o(opTuple)), Limits{MaxStack: 2})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "more than 2 values on the stack")

	_, err = DecodeLimits(p(o(opMark), o(opMark), o(opMark)), Limits{MaxStack: 2})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "more than 2 marks")

	_, err = DecodeLimits(p(o(opNone), o(opMemoize), o(opMemoize), o(opMemoize)), Limits{MaxMemo: 2})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "memo index 2, past the limit of 2")

	_, err = DecodeLimits(p(o(opNone), o(opLongBinPut, le32(5)...)), Limits{MaxMemo: 2})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "memo index 5")

	// Values kept in a list leave the stack, and still count.
	_, err = DecodeLimits(p(o(opEmptyList), o(opNone), o(opAppend), o(opNone), o(opAppend), o(opNone), o(opAppend)), Limits{MaxValues: 3})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "more than 3 values")

	_, err = Read(bytes.NewReader(p(o(opNone))))
	require.NoError(t, err)
	_, err = Read(nil)
	require.ErrorIs(t, err, ErrMalformed)
}

// TestSnapshot decodes a real PyTorch memory snapshot (a copy of
// ../shared/data/alloc-traces/pickles/silmont2000_mem_snapshot.pickle)
// and checks what Python's pickle reads from it: 97 trace entries on one
// device, the first a segment_alloc of 20 MiB.
func TestSnapshot(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "silmont2000_mem_snapshot.pickle"))
	require.NoError(t, err)
	v, err := Decode(data)
	require.NoError(t, err)
	snap := v.(*Dict)
	require.Equal(t, []any{"segments", "device_traces", "allocator_settings", "external_annotations"}, snap.Keys())
	traces, _ := snap.Get("device_traces")
	require.Len(t, traces.(*List).Items, 1)
	entries := traces.(*List).Items[0].(*List).Items
	require.Len(t, entries, 97)
	first := entries[0].(*Dict)
	for key, want := range map[string]any{"action": "segment_alloc", "addr": int64(139781763760128),
		"size": int64(20971520), "stream": int64(0), "time_us": int64(1772688692031317)} {
		got, ok := first.Get(key)
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	// Every prefix short of the whole is an error, never a panic.
	for _, n := range []int{0, 1, 2, 100, len(data) / 2, len(data) - 1} {
		_, err := Decode(data[:n])
		require.ErrorIs(t, err, ErrMalformed)
	}
}

// FuzzUnpickle: any input decodes or is refused with ErrMalformed, never
// a panic, and within the limits. Seeds: every opcode test, the real
// snapshot above and the first 8 KiB of two others (copies of the starts
// of ../shared/data/alloc-traces/pickles/select_n_snapshot_v1f2f548.pickle
// and wedsonlin_medium_512_training.pickle).
func FuzzUnpickle(f *testing.F) {
	for _, name := range []string{"silmont2000_mem_snapshot.pickle", "select_n_prefix.pickle", "wedsonlin_prefix.pickle"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(data[:min(len(data), 4096)])
	}
	f.Add(p(o(opEmptyDict), o(opMark), str("a"), o(opEmptyList), o(opMemoize), o(opMark), o(opBinGet, 0), o(opAppends), o(opSetItems)))
	f.Add(p(o(opMark), o(opLong1, 2, 0, 1), o(opBinFloat, 0, 0, 0, 0, 0, 0, 0, 0), o(opTuple)))
	lim := Limits{MaxInput: 1 << 20, MaxMemo: 1 << 10, MaxStack: 1 << 10, MaxValues: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := DecodeLimits(data, lim)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("an error not marked ErrMalformed: %v", err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "pickle: ") {
			t.Fatalf("an error without the package's prefix: %v", err)
		}
	})
}

// TestInts: every int PyTorch writes decodes, to the first of int64,
// uint64 and *big.Int that holds it: a stack frame's line of 2^64-1 is a
// LONG1 of 9 bytes (ff x 8, then a sign byte 00).
func TestInts(t *testing.T) {
	ff8 := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	wide := new(big.Int).Lsh(big.NewInt(1), 64)
	negWide := new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 72))
	for _, tc := range []struct {
		name string
		in   []byte
		want any
	}{
		{"2^64-1 (a line PyTorch could not find)", p(o(opLong1, append(append([]byte{9}, ff8...), 0)...)), uint64(math.MaxUint64)},
		{"2^63", p(o(opLong1, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0)), uint64(1 << 63)},
		{"2^63-1", p(o(opLong1, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)), int64(math.MaxInt64)},
		{"-2^63", p(o(opLong1, 8, 0, 0, 0, 0, 0, 0, 0, 0x80)), int64(math.MinInt64)},
		{"-1", p(o(opLong1, 1, 0xff)), int64(-1)},
		{"-1 padded to 9 bytes", p(o(opLong1, append(append([]byte{9}, ff8...), 0xff)...)), int64(-1)},
		{"5 padded to 3 bytes", p(o(opLong1, 3, 5, 0, 0)), int64(5)},
		{"2^64", p(o(opLong1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1)), wide},
		{"-2^72 in a LONG4", p(o(opLong4, append(le32(10), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff)...)), negWide},
		{"a LONG4 of 2^63", p(o(opLong4, append(le32(9), 0, 0, 0, 0, 0, 0, 0, 0x80, 0)...)), uint64(1 << 63)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode(tc.in)
			require.NoError(t, err)
			if w, ok := tc.want.(*big.Int); ok {
				got, ok := v.(*big.Int)
				require.True(t, ok, "%T", v)
				require.Zero(t, w.Cmp(got), "%v", got)
			} else {
				require.Equal(t, tc.want, v)
			}
			require.Equal(t, "int", TypeName(v))
		})
	}
	// A uint64 is a dict key, found by its value; an int64 of another
	// value is not the same key.
	max64 := o(opLong1, append(append([]byte{9}, ff8...), 0)...)
	v, err := Decode(p(o(opEmptyDict), max64, str("line"), o(opSetItem), o(opBinInt1, 1), o(opNone), o(opSetItem)))
	require.NoError(t, err)
	got, ok := v.(*Dict).Get(uint64(math.MaxUint64))
	require.True(t, ok)
	require.Equal(t, "line", got)
	_, ok = v.(*Dict).Get(int64(-1))
	require.False(t, ok)
}

// TestBuiltBudget: a decode builds at most BuiltPerByte bytes a byte of
// input (plus BuiltFloor), however its opcodes multiply what it holds.
func TestBuiltBudget(t *testing.T) {
	// Empty dicts appended to a list: 2 bytes of input, 96 of values each.
	n := 1 << 16
	ops := [][]byte{o(opEmptyList), o(opMark)}
	for range n {
		ops = append(ops, o(opEmptyDict))
	}
	ops = append(ops, o(opAppends))
	in := p(ops...)
	_, err := DecodeLimits(in, Limits{MaxBuilt: 1 << 20})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "more than 1048576 bytes of values built from a pickle of 65542 bytes (the limit: Limits.MaxBuilt)")
	_, err = DecodeLimits(in, Limits{MaxBuilt: 1 << 30})
	require.NoError(t, err)

	// The default: past the floor, refused by the per-byte bound.
	ops = [][]byte{o(opEmptyList), o(opMark)}
	for range BuiltFloor / 16 {
		ops = append(ops, o(opEmptyDict))
	}
	ops = append(ops, o(opAppends))
	_, err = Decode(p(ops...))
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "(the limit: 40 a byte of input plus 1048576)")

	// A list of Nones (one byte each) is under the default.
	ops = [][]byte{o(opEmptyList), o(opMark)}
	for range 4 << 20 {
		ops = append(ops, o(opNone))
	}
	ops = append(ops, o(opAppends))
	v, err := Decode(p(ops...))
	require.NoError(t, err)
	require.Len(t, v.(*List).Items, 4<<20)

	// A wide int is charged its bytes.
	_, err = DecodeLimits(p(o(opLong4, append(le32(1<<12), make([]byte, 1<<12)...)...), o(opPop), o(opNone)), Limits{MaxBuilt: 4096})
	require.NoError(t, err, "zeros pad to 0: nothing wide is built")
	wideInt := append(le32(1<<12), make([]byte, 1<<12)...)
	wideInt[len(wideInt)-1] = 1
	_, err = DecodeLimits(p(o(opLong4, wideInt...)), Limits{MaxBuilt: 4096})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "bytes of values built")
}

// TestLongKeySetOverAndOver: a long string key named through the memo
// and set in a dict over and over is charged its bytes at each set, so
// the decode is refused as building too much, in time linear in the
// input; the same key set a few times decodes.
func TestLongKeySetOverAndOver(t *testing.T) {
	key := strings.Repeat("k", 1<<20)
	pickle := func(small bool, sets int) []byte {
		ops := [][]byte{o(opEmptyDict)}
		if !small { // past smallDict keys: an index is built
			for i := range 9 {
				ops = append(ops, str(fmt.Sprint(i)), o(opNone), o(opSetItem))
			}
		}
		ops = append(ops, o(opBinUnicode, append(le32(uint32(len(key))), key...)...), o(opBinPut, 0), o(opPop))
		for range sets {
			ops = append(ops, o(opBinGet, 0), o(opNone), o(opSetItem))
		}
		return p(ops...)
	}
	for _, small := range []bool{true, false} {
		_, err := Decode(pickle(small, 1<<18))
		require.ErrorIs(t, err, ErrMalformed, "small %t", small)
		require.Contains(t, err.Error(), "bytes of values built")
		v, err := Decode(pickle(small, 4))
		require.NoError(t, err, "small %t", small)
		got, ok := v.(*Dict).Get(key)
		require.True(t, ok)
		require.Nil(t, got)
	}
}

// TestBuiltPerByte: the real snapshots build well under the default
// budget (the figures BuiltPerByte's doc gives).
func TestBuiltPerByte(t *testing.T) {
	for _, name := range []string{"silmont2000_mem_snapshot", "select_n_snapshot_v1f2f548", "wedsonlin_medium_512_training"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "alloc-traces", "pickles", name+".pickle"))
		require.NoError(t, err)
		var lim Limits
		lim.defaults()
		d := decoder{data: data, lim: lim, memo: map[uint32]any{}, budget: lim.budget(len(data))}
		_, err = d.run()
		require.NoError(t, err)
		perByte := float64(d.built) / float64(len(data))
		t.Logf("%s: %d bytes of pickle build %d bytes of values, %.1f a byte", name, len(data), d.built, perByte)
		require.Less(t, perByte, float64(BuiltPerByte)/2)
	}
}
