// Package pickle decodes Python pickles of plain data — the kind
// torch.cuda.memory._dump_snapshot writes — into Go values, and nothing
// else.
//
// It owns the decoding of a restricted set of opcodes (protocols 2 to 5):
// framing, None, bools, ints (of any width), floats, strings, bytes,
// tuples, lists, dicts, the memo and MARK-based collections. It must never
// construct an object by name or call anything: GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, INST, OBJ, NEWOBJ and persistent ids are refused, as is
// every opcode a snapshot does not use. Hostile input gets an error marked
// ErrMalformed, never a panic; memory stays bounded by Limits (the input's
// size, the values pushed, the stack and the memo; every length is checked
// against the bytes left) and by a budget on the bytes of values a decode
// builds, proportional to the input (BuiltPerByte): a pickle cannot build
// more than a stated multiple of its own size.
//
// Values decode to
//
//	None → nil, bool → bool, float → float64,
//	int → int64, or uint64 from 2^63 to 2^64-1, or *big.Int beyond,
//	str → string, bytes → []byte, tuple → Tuple,
//	list → *List, dict → *Dict
//
// An int takes the first of int64, uint64 and *big.Int that holds it, so
// each value has one Go type. PyTorch writes uint64 values as Python ints:
// a stack frame whose line is unknown has line 2^64-1 (PyCode_Addr2Line's
// -1 cast to uint64_t in torch/csrc/profiler/python/combined_traceback.cpp,
// written by py_symbolize as the frame's "line"), which a pickle holds as
// a LONG1 of 9 bytes.
//
// Lists and dicts are pointers because the memo shares them: a pickle may
// refer to one list from two places, or make a list that holds itself. A
// memo reference costs the decoder one slot, not a copy; a consumer that
// expands what it reads once per reference (one record per list item,
// say) must bound what it builds against the input's size itself, as
// replay's snapshot reader does.
package pickle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/big"
	"unicode/utf8"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/sentinel"
)

// ErrMalformed marks every error about the content of a pickle: a
// truncated one, an opcode refused or unknown, a limit passed.
var ErrMalformed = errors.New("malformed pickle")

// Tuple is a Python tuple.
type Tuple []any

// List is a Python list.
type List struct {
	Items []any
}

// Dict is a Python dict: its keys in insertion order, with their values.
// Keys are hashable values only (nil, bool, int64, uint64, float64,
// string).
type Dict struct {
	keys   []any
	values []any
	// index maps each key to its position in keys and values, once the
	// dict holds more than smallDict keys; a smaller one (a snapshot's
	// trace entries have six) is searched in order, with no map to build.
	index map[any]int
}

const smallDict = 8

// find is the position of key, or -1.
func (d *Dict) find(key any) int {
	if d.index != nil {
		if i, ok := d.index[key]; ok {
			return i
		}
		return -1
	}
	for i, k := range d.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// Len is how many keys the dict holds; 0 for a nil dict.
func (d *Dict) Len() int {
	if d == nil {
		return 0
	}
	return len(d.keys)
}

// Get returns the value under key and whether there is one; nothing for a
// nil dict.
func (d *Dict) Get(key any) (any, bool) {
	if d == nil {
		return nil, false
	}
	if !hashable(key) {
		return nil, false
	}
	i := d.find(key)
	if i < 0 {
		return nil, false
	}
	return d.values[i], true
}

// Keys returns the dict's keys in insertion order; nil for a nil dict.
func (d *Dict) Keys() []any {
	if d == nil {
		return nil
	}
	return append([]any(nil), d.keys...)
}

// set sets key to value, keeping the key's first position as Python does.
func (d *Dict) set(key, value any) error {
	switch k := key.(type) {
	case nil, bool, int64, uint64, string:
	case float64:
		if math.IsNaN(k) { // never equal to itself: Go's map would keep every one apart
			return errors.New("a NaN dict key")
		}
	case *big.Int:
		return errors.New("a dict key that is an int wider than 64 bits (a pointer here, which == cannot compare by value)")
	default:
		return errors.Newf("a dict key of type %s (only None, bools, ints, floats and strings are taken)", TypeName(key))
	}
	if i := d.find(key); i >= 0 {
		d.values[i] = value
		return nil
	}
	d.keys = append(d.keys, key)
	d.values = append(d.values, value)
	switch {
	case d.index != nil:
		d.index[key] = len(d.keys) - 1
	case len(d.keys) > smallDict:
		d.index = make(map[any]int, len(d.keys))
		for i, k := range d.keys {
			d.index[k] = i
		}
	}
	return nil
}

// hashable says whether key can be a dict key here: comparing any other
// value with == could panic (a []byte) or never match.
func hashable(key any) bool {
	switch k := key.(type) {
	case nil, bool, int64, uint64, string:
		return true
	case float64:
		return !math.IsNaN(k)
	}
	return false
}

// Limits bound what a decode may hold. Zero fields take the defaults.
type Limits struct {
	// MaxInput is the longest pickle taken, in bytes (default
	// DefaultMaxInput).
	MaxInput int
	// MaxMemo is the most memo entries (default 1<<24) and the largest
	// memo index a PUT may name.
	MaxMemo int
	// MaxStack is the most values on the stack at once (default 1<<24).
	MaxStack int
	// MaxValues is the most values a decode may push, each a new value
	// or a memo reference that a list, dict or tuple may keep (default
	// 1<<26): what bounds the decoded data, at a few dozen bytes a value,
	// where a hostile pickle makes a value of every byte or two. The
	// largest snapshot here (3.9 MB) pushes 0.94 million.
	MaxValues int
	// MaxBuilt is the most bytes of values a decode may build (default
	// BuiltPerByte times the input's length, plus BuiltFloor): each
	// value's slot, string and bytes payloads, collections' headers and
	// item slots, memo entries, by the approximate costs in builtCosts.
	MaxBuilt int64
}

// BuiltPerByte bounds what a decode builds per byte of input by default;
// BuiltFloor is added so that a tiny pickle is never refused. The three
// real snapshots of ../../testdata/alloc-traces/pickles build 5.7, 13.8
// and 13.4 bytes per byte of input (TestBuiltPerByte); a list of one-byte
// values (None, an empty tuple) builds 32; a hostile pickle of one-byte
// opcodes that each make a collection would build 48 to 80.
const (
	BuiltPerByte = 40
	BuiltFloor   = 1 << 20
)

// builtCosts are the bytes charged against MaxBuilt: close to what the Go
// heap holds for each (a slice grows by doubling, so it may hold up to
// twice its items' slots).
const (
	costSlot  = 16 // an any: a stack, list, tuple or dict slot
	costList  = 32 // a List and its slice header
	costDict  = 64 // a Dict's two slices and its index pointer
	costIndex = 48 // a key in a Dict's index map
	costMemo  = 48 // a memo map entry
	costBig   = 32 // a big.Int's header
)

// DefaultMaxInput is the longest pickle taken by default: 1 GiB.
const DefaultMaxInput = 1 << 30

func (l *Limits) defaults() {
	if l.MaxInput <= 0 {
		l.MaxInput = DefaultMaxInput
	}
	if l.MaxMemo <= 0 {
		l.MaxMemo = 1 << 24
	}
	if l.MaxStack <= 0 {
		l.MaxStack = 1 << 24
	}
	if l.MaxValues <= 0 {
		l.MaxValues = 1 << 26
	}
}

// budget is the MaxBuilt a decode of n bytes gets: lim's own, or the
// default for n.
func (l *Limits) budget(n int) int64 {
	if l.MaxBuilt > 0 {
		return l.MaxBuilt
	}
	return BuiltPerByte*int64(n) + BuiltFloor
}

// Decode decodes the pickle in data, which must end with its STOP opcode
// (nothing may follow), with the default Limits.
func Decode(data []byte) (any, error) {
	return DecodeLimits(data, Limits{})
}

// Read reads a whole pickle from r, at most the default Limits' MaxInput
// bytes, and decodes it.
func Read(r io.Reader) (any, error) {
	data, err := ReadInput(r, DefaultMaxInput)
	if err != nil {
		return nil, err
	}
	return Decode(data)
}

// ReadInput reads the whole of r, refusing more than most bytes (an
// error marked ErrMalformed) after reading most+1: what Read decodes, for
// a caller that also needs the input's size.
func ReadInput(r io.Reader, most int) ([]byte, error) {
	if r == nil {
		return nil, sentinel.Mark(errors.New("pickle: the reader is nil"), ErrMalformed)
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(most)+1))
	if err != nil {
		return nil, errors.Wrap(err, "pickle: read")
	}
	if len(data) > most {
		return nil, sentinel.Mark(errors.Newf("pickle: more than %d bytes, the limit", most), ErrMalformed)
	}
	return data, nil
}

// DecodeLimits is Decode under the given limits.
func DecodeLimits(data []byte, lim Limits) (any, error) {
	lim.defaults()
	if len(data) > lim.MaxInput {
		return nil, sentinel.Mark(errors.Newf("pickle: %d bytes, more than the limit of %d", len(data), lim.MaxInput), ErrMalformed)
	}
	d := decoder{data: data, lim: lim, memo: map[uint32]any{}, budget: lim.budget(len(data))}
	v, err := d.run()
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "pickle: at byte %d", d.at), ErrMalformed)
	}
	return v, nil
}

// decoder is one decode: the input and the position of the opcode being
// decoded (at) and of the next byte to read (pos), the stack, the marks
// (positions in the stack where a MARK was pushed, innermost last) and the
// memo. Invariant: every mark is at most len(stack).
type decoder struct {
	data    []byte
	at, pos int
	lim     Limits
	stack   []any
	marks   []int
	memo    map[uint32]any
	pushed  int // values pushed so far, at most lim.MaxValues
	// built is the bytes of values built so far, at most budget.
	built, budget int64
}

// build charges n bytes against the budget, or refuses them.
func (d *decoder) build(n int64) error {
	if n > d.budget-d.built {
		how := "Limits.MaxBuilt"
		if d.lim.MaxBuilt <= 0 {
			how = fmt.Sprintf("%d a byte of input plus %d", BuiltPerByte, BuiltFloor)
		}
		return errors.Newf("more than %d bytes of values built from a pickle of %d bytes (the limit: %s): a pickle that builds far more than it holds",
			d.budget, len(d.data), how)
	}
	d.built += n
	return nil
}

// The opcodes taken, by their names in Python's pickletools.
const (
	opMark           = '('
	opStop           = '.'
	opNone           = 'N'
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinFloat       = 'G'
	opBinUnicode     = 'X'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opBinBytes8      = 0x8e
	opEmptyTuple     = ')'
	opTuple          = 't'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opEmptyList      = ']'
	opList           = 'l'
	opAppend         = 'a'
	opAppends        = 'e'
	opEmptyDict      = '}'
	opDict           = 'd'
	opSetItem        = 's'
	opSetItems       = 'u'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opMemoize        = 0x94
	opProto          = 0x80
	opFrame          = 0x95
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opGlobal         = 'c'
	opStackGlobal    = 0x93
	opReduce         = 'R'
	opBuild          = 'b'
	opInst           = 'i'
	opObj            = 'o'
	opNewObj         = 0x81
	opNewObjEx       = 0x92
	opPersID         = 'P'
	opBinPersID      = 'Q'
	opExt1           = 0x82
	opExt2           = 0x83
	opExt4           = 0x84
	opNextBuffer     = 0x97
	opReadOnlyBuffer = 0x98
)

// refused names the opcodes that would build objects by name or call code.
var refused = map[byte]string{
	opGlobal: "GLOBAL", opStackGlobal: "STACK_GLOBAL", opReduce: "REDUCE", opBuild: "BUILD",
	opInst: "INST", opObj: "OBJ", opNewObj: "NEWOBJ", opNewObjEx: "NEWOBJ_EX",
	opPersID: "PERSID", opBinPersID: "BINPERSID", opExt1: "EXT1", opExt2: "EXT2", opExt4: "EXT4",
	opNextBuffer: "NEXT_BUFFER", opReadOnlyBuffer: "READONLY_BUFFER",
}

func (d *decoder) run() (any, error) {
	for {
		d.at = d.pos
		op, err := d.byte()
		if err != nil {
			return nil, err
		}
		if name, ok := refused[op]; ok {
			return nil, errors.Newf("opcode %s refused: it builds an object by name or calls code, which a memory snapshot never needs", name)
		}
		switch op {
		case opStop:
			if len(d.stack) != 1 || len(d.marks) != 0 {
				return nil, errors.Newf("STOP with %d values on the stack and %d marks open, want one value and none", len(d.stack), len(d.marks))
			}
			if d.pos != len(d.data) {
				return nil, errors.Newf("%d bytes after STOP", len(d.data)-d.pos)
			}
			return d.stack[0], nil
		case opProto:
			v, err := d.byte()
			if err != nil {
				return nil, err
			}
			if v < 2 || v > 5 {
				return nil, errors.Newf("protocol %d, want 2 to 5", v)
			}
		case opFrame:
			// Frames only group opcodes for buffered reading; the whole
			// input is in memory. Their length must still fit.
			n, err := d.uint(8)
			if err != nil {
				return nil, err
			}
			if n > uint64(len(d.data)-d.pos) {
				return nil, errors.Newf("a frame of %d bytes with %d left", n, len(d.data)-d.pos)
			}
		case opMark:
			if len(d.marks) >= d.lim.MaxStack {
				return nil, errors.Newf("more than %d marks open", d.lim.MaxStack)
			}
			d.marks = append(d.marks, len(d.stack))
		case opPop:
			if len(d.marks) > 0 && d.marks[len(d.marks)-1] == len(d.stack) {
				d.marks = d.marks[:len(d.marks)-1] // POP of a mark pops the mark
				continue
			}
			if _, err := d.pop(); err != nil {
				return nil, err
			}
		case opPopMark:
			if _, err := d.popMark(); err != nil {
				return nil, err
			}
		case opDup:
			v, err := d.top()
			if err != nil {
				return nil, err
			}
			err = d.push(v)
			if err != nil {
				return nil, err
			}
		default:
			if err := d.value(op); err != nil {
				return nil, err
			}
		}
	}
}

// value decodes one opcode that builds, changes or remembers a value.
func (d *decoder) value(op byte) error {
	switch op {
	case opNone:
		return d.push(nil)
	case opNewTrue:
		return d.push(true)
	case opNewFalse:
		return d.push(false)
	case opBinInt:
		v, err := d.uint(4)
		return d.pushOr(int64(int32(v)), err)
	case opBinInt1:
		v, err := d.uint(1)
		return d.pushOr(int64(v), err)
	case opBinInt2:
		v, err := d.uint(2)
		return d.pushOr(int64(v), err)
	case opLong1, opLong4:
		width := 1
		if op == opLong4 {
			width = 4
		}
		n, err := d.uint(width)
		if err != nil {
			return err
		}
		b, err := d.bytes(n)
		if err != nil {
			return err
		}
		v := long(b)
		if _, ok := v.(*big.Int); ok {
			if err := d.build(costBig + int64(len(b))); err != nil {
				return err
			}
		}
		return d.push(v)
	case opBinFloat:
		b, err := d.bytes(8)
		if err != nil {
			return err
		}
		return d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
	case opBinUnicode, opShortBinUni, opBinUnicode8:
		b, err := d.counted(op, opShortBinUni, opBinUnicode, opBinUnicode8)
		if err != nil {
			return err
		}
		if !utf8.Valid(b) {
			return errors.New("a string that is not UTF-8")
		}
		if err := d.build(int64(len(b))); err != nil {
			return err
		}
		return d.push(string(b))
	case opBinBytes, opShortBinBytes, opBinBytes8:
		b, err := d.counted(op, opShortBinBytes, opBinBytes, opBinBytes8)
		if err != nil {
			return err
		}
		if err := d.build(int64(len(b))); err != nil {
			return err
		}
		return d.push(bytes.Clone(b))
	case opEmptyTuple:
		return d.push(Tuple{})
	case opTuple:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		return d.pushOr(Tuple(items), d.buildSlots(len(items)))
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		if err := d.need(n); err != nil {
			return err
		}
		if err := d.buildSlots(n); err != nil {
			return err
		}
		t := Tuple(append([]any(nil), d.stack[len(d.stack)-n:]...))
		d.stack = d.stack[:len(d.stack)-n]
		return d.push(t)
	case opEmptyList:
		if err := d.build(costList); err != nil {
			return err
		}
		return d.push(&List{})
	case opList:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if err := d.build(costList); err != nil {
			return err
		}
		return d.pushOr(&List{Items: items}, d.buildSlots(len(items)))
	case opAppend, opAppends:
		items, err := d.popItems(op == opAppend, 1)
		if err != nil {
			return err
		}
		top, err := d.top()
		if err != nil {
			return err
		}
		l, ok := top.(*List)
		if !ok {
			return errors.Newf("%s onto a %s, want a list", opName(op), TypeName(top))
		}
		if err := d.buildSlots(len(items)); err != nil {
			return err
		}
		l.Items = append(l.Items, items...)
		return nil
	case opEmptyDict:
		if err := d.build(costDict); err != nil {
			return err
		}
		return d.push(&Dict{})
	case opDict:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if err := d.build(costDict); err != nil {
			return err
		}
		dict := &Dict{}
		return d.pushOr(dict, d.setItems(dict, items))
	case opSetItem, opSetItems:
		items, err := d.popItems(op == opSetItem, 2)
		if err != nil {
			return err
		}
		top, err := d.top()
		if err != nil {
			return err
		}
		dict, ok := top.(*Dict)
		if !ok {
			return errors.Newf("%s onto a %s, want a dict", opName(op), TypeName(top))
		}
		return d.setItems(dict, items)
	case opBinGet, opLongBinGet:
		width := 1
		if op == opLongBinGet {
			width = 4
		}
		i, err := d.uint(width)
		if err != nil {
			return err
		}
		v, ok := d.memo[uint32(i)]
		if !ok {
			return errors.Newf("memo entry %d is not set", i)
		}
		return d.push(v)
	case opBinPut, opLongBinPut:
		width := 1
		if op == opLongBinPut {
			width = 4
		}
		i, err := d.uint(width)
		if err != nil {
			return err
		}
		return d.put(i)
	case opMemoize:
		return d.put(uint64(len(d.memo)))
	}
	return errors.Newf("opcode 0x%02x (%s) is not taken: a memory snapshot does not use it", op, opName(op))
}

// put remembers the value on top of the stack under memo index i.
func (d *decoder) put(i uint64) error {
	v, err := d.top()
	if err != nil {
		return err
	}
	if i >= uint64(d.lim.MaxMemo) {
		return errors.Newf("memo index %d, past the limit of %d", i, d.lim.MaxMemo)
	}
	if _, ok := d.memo[uint32(i)]; !ok {
		if len(d.memo) >= d.lim.MaxMemo {
			return errors.Newf("more than %d memo entries", d.lim.MaxMemo)
		}
		if err := d.build(costMemo); err != nil {
			return err
		}
	}
	d.memo[uint32(i)] = v
	return nil
}

// setItems sets the key-value pairs in items, charging each pair the
// most a new key costs (two slots and an index entry) and each string
// key the bytes the set reads of it: hashed and compared once in a dict
// with an index, compared with each key of a small one. A long key named
// through the memo and set over and over would otherwise cost work
// quadratic in the input (a 4 MiB pickle of one 2 MiB key set a million
// times took 20 s); charged, it is refused as building too much.
func (d *decoder) setItems(dict *Dict, items []any) error {
	if len(items)%2 != 0 {
		return errors.Newf("%d values to set in a dict, want key-value pairs", len(items))
	}
	if err := d.build(int64(len(items)/2) * (2*costSlot + costIndex)); err != nil {
		return err
	}
	for i := 0; i < len(items); i += 2 {
		if k, ok := items[i].(string); ok {
			reads := 2
			if dict.index == nil {
				reads = 1 + len(dict.keys)
			}
			if err := d.build(int64(len(k)) * int64(reads)); err != nil {
				return err
			}
		}
		if err := dict.set(items[i], items[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// long decodes a LONG1/LONG4 payload, little-endian two's complement,
// into the first of int64, uint64 and *big.Int that holds its value.
// Python's encoder writes the fewest bytes, but any width is read: a
// payload padded with sign bytes decodes to the same value.
func long(b []byte) any {
	negative := len(b) > 0 && b[len(b)-1]&0x80 != 0
	// Drop the sign bytes that carry no value: 0x00 above a byte whose top
	// bit is clear, 0xff above one whose top bit is set.
	for len(b) > 1 {
		top, next := b[len(b)-1], b[len(b)-2]
		if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
			b = b[:len(b)-1]
			continue
		}
		break
	}
	switch {
	case len(b) == 0:
		return int64(0)
	case len(b) <= 8:
		var u uint64
		for i := len(b) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		shift := 64 - 8*uint(len(b))
		return int64(u<<shift) >> shift // sign-extend
	case len(b) == 9 && !negative && b[8] == 0:
		return binary.LittleEndian.Uint64(b) // 2^63 to 2^64-1
	}
	// Wider: big-endian magnitude for big.Int, two's complement undone.
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	v := new(big.Int).SetBytes(be)
	if negative {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return v
}

// counted reads the length-prefixed payload of a string or bytes opcode:
// short has a 1-byte length, mid a 4-byte one, long an 8-byte one.
func (d *decoder) counted(op, short, mid, long byte) ([]byte, error) {
	width := 8
	switch op {
	case short:
		width = 1
	case mid:
		width = 4
	}
	n, err := d.uint(width)
	if err != nil {
		return nil, err
	}
	return d.bytes(n)
}

func (d *decoder) byte() (byte, error) {
	if d.pos >= len(d.data) {
		return 0, errors.New("the pickle ends before its STOP opcode")
	}
	d.pos++
	return d.data[d.pos-1], nil
}

// uint reads a little-endian unsigned integer of width bytes (1 to 8).
func (d *decoder) uint(width int) (uint64, error) {
	b, err := d.bytes(uint64(width))
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := width - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// bytes returns the next n bytes, a view of the input.
func (d *decoder) bytes(n uint64) ([]byte, error) {
	if n > uint64(len(d.data)-d.pos) {
		return nil, errors.Newf("an argument of %d bytes with %d left", n, len(d.data)-d.pos)
	}
	b := d.data[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

func (d *decoder) push(v any) error {
	if len(d.stack) >= d.lim.MaxStack {
		return errors.Newf("more than %d values on the stack", d.lim.MaxStack)
	}
	if d.pushed >= d.lim.MaxValues {
		return errors.Newf("more than %d values", d.lim.MaxValues)
	}
	if err := d.build(costSlot); err != nil {
		return err
	}
	d.pushed++
	d.stack = append(d.stack, v)
	return nil
}

// buildSlots charges n slots of a collection.
func (d *decoder) buildSlots(n int) error { return d.build(int64(n) * costSlot) }

// pushOr pushes v unless err is set, and returns err.
func (d *decoder) pushOr(v any, err error) error {
	if err != nil {
		return err
	}
	return d.push(v)
}

// floor is where the stack's values above the innermost mark begin: no
// opcode but a mark's own may take a value below it.
func (d *decoder) floor() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

// need checks that n values sit above the innermost mark.
func (d *decoder) need(n int) error {
	if len(d.stack)-d.floor() < n {
		return errors.Newf("%d values wanted above the mark, %d there", n, len(d.stack)-d.floor())
	}
	return nil
}

func (d *decoder) top() (any, error) {
	if err := d.need(1); err != nil {
		return nil, err
	}
	return d.stack[len(d.stack)-1], nil
}

func (d *decoder) pop() (any, error) {
	v, err := d.top()
	if err != nil {
		return nil, err
	}
	d.stack = d.stack[:len(d.stack)-1]
	return v, nil
}

// popItems pops what APPEND or SETITEM (single: the top n values) or
// APPENDS or SETITEMS (the values above the innermost mark, and the mark)
// add to the collection under them.
func (d *decoder) popItems(single bool, n int) ([]any, error) {
	if !single {
		return d.popMark()
	}
	if err := d.need(n); err != nil {
		return nil, err
	}
	items := append([]any(nil), d.stack[len(d.stack)-n:]...)
	d.stack = d.stack[:len(d.stack)-n]
	return items, nil
}

// popMark pops the values above the innermost mark, and the mark.
func (d *decoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, errors.New("no MARK open")
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := append([]any(nil), d.stack[m:]...)
	d.stack = d.stack[:m]
	return items, nil
}

func opName(op byte) string {
	switch op {
	case opAppend:
		return "APPEND"
	case opAppends:
		return "APPENDS"
	case opSetItem:
		return "SETITEM"
	case opSetItems:
		return "SETITEMS"
	}
	if name, ok := refused[op]; ok {
		return name
	}
	return fmt.Sprintf("%q", op)
}

// TypeName names a decoded value's Python type ("dict", "int", ...), for
// messages about values of the wrong kind.
func TypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, uint64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case Tuple:
		return "tuple"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}
