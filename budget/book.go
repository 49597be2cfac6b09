package budget

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// The file's layout, little-endian throughout.
const (
	// MaxMembers is the most members one book holds at once.
	MaxMembers = 32
	// MaxName is the longest member name, in bytes.
	MaxName = 40
	// MaxCapacity bounds a book's capacity (64 PiB), so that the sum of
	// every member's hold fits in 64 bits.
	MaxCapacity = 1 << 56

	magic      = "vmabudg1"
	version    = 1
	headerSize = 64
	recSize    = 112
	stateHead  = 24 // gen, crc, reserved, capacity
	stateSize  = stateHead + MaxMembers*recSize
	copy0      = headerSize
	copy1      = headerSize + stateSize
	mailOff    = 8192
	mailSize   = 32
	// FileSize is the size of a book's file.
	FileSize = mailOff + MaxMembers*mailSize + 3072
	// liveBase is the byte whose lock says slot 0's member lives; the
	// locks lie past the file's end, where no data is.
	liveBase = 1 << 30
	// maxGen bounds a copy's generation: one write a generation, no
	// book reaches it, and one past it is refused as corrupt rather than
	// let a forged generation outrank every write after it.
	maxGen = 1 << 62
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is one member's line of the books.
type record struct {
	used    bool
	pid     uint32
	token   uint64 // this incarnation of the slot, never 0 when used
	floor   uint64
	ceiling uint64
	hold    uint64
	idle    uint64
	asked   uint64 // requests to give back that reached it
	given   uint64 // bytes it gave back when asked
	name    string
}

// state is the books: one copy's contents.
type state struct {
	gen      uint64
	capacity uint64
	recs     [MaxMembers]record
}

// reserved is what a member keeps from the others: its hold, or its
// floor when it holds less.
func (r *record) reserved() uint64 { return max(r.hold, r.floor) }

// spare is what the member could give back when asked: its idle memory
// above its floor.
func (r *record) spare() uint64 {
	if r.hold <= r.floor {
		return 0
	}
	return min(r.idle, r.hold-r.floor)
}

// reservedSum is Σ max(hold, floor) over the members.
func (s *state) reservedSum() uint64 {
	var sum uint64
	for i := range s.recs {
		if s.recs[i].used {
			sum += s.recs[i].reserved()
		}
	}
	return sum
}

// encodeHeader writes the file's header.
func encodeHeader(b []byte, capacity uint64) {
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[8:], version)
	binary.LittleEndian.PutUint32(b[12:], MaxMembers)
	binary.LittleEndian.PutUint64(b[16:], capacity)
}

// decodeHeader checks the header and returns the capacity.
func decodeHeader(b []byte) (uint64, error) {
	if len(b) < headerSize {
		return 0, errors.Wrapf(driver.ErrInvalid, "budget: the header has %d bytes, less than %d", len(b), headerSize)
	}
	if string(b[:8]) != magic {
		return 0, errors.Wrapf(driver.ErrInvalid, "budget: not a budget book (magic %q)", b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != version {
		return 0, errors.Wrapf(driver.ErrInvalid, "budget: book version %d, this build reads %d", v, version)
	}
	if n := binary.LittleEndian.Uint32(b[12:]); n != MaxMembers {
		return 0, errors.Wrapf(driver.ErrInvalid, "budget: the book has room for %d members, this build %d", n, MaxMembers)
	}
	c := binary.LittleEndian.Uint64(b[16:])
	if c == 0 || c > MaxCapacity {
		return 0, errors.Wrapf(driver.ErrInvalid, "budget: the book's capacity %d is zero or over %d", c, uint64(MaxCapacity))
	}
	return c, nil
}

// encodeState writes s into one copy's bytes (stateSize of them),
// generation and CRC included.
func encodeState(b []byte, s *state) {
	clear(b[:stateSize])
	le := binary.LittleEndian
	le.PutUint64(b[0:], s.gen)
	le.PutUint64(b[16:], s.capacity)
	for i := range s.recs {
		r := &s.recs[i]
		if !r.used {
			continue
		}
		o := b[stateHead+i*recSize:]
		le.PutUint32(o[0:], 1)
		le.PutUint32(o[4:], r.pid)
		le.PutUint64(o[8:], r.token)
		le.PutUint64(o[16:], r.floor)
		le.PutUint64(o[24:], r.ceiling)
		le.PutUint64(o[32:], r.hold)
		le.PutUint64(o[40:], r.idle)
		le.PutUint64(o[48:], r.asked)
		le.PutUint64(o[56:], r.given)
		o[64] = byte(len(r.name))
		copy(o[65:65+MaxName], r.name)
	}
	le.PutUint32(b[8:], stateCRC(b))
}

// stateCRC is the CRC-32C of a copy's bytes but its own field.
func stateCRC(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b[0:8])
	return crc32.Update(c, castagnoli, b[12:stateSize])
}

// errTorn marks a copy whose CRC fails: one a kill cut short, or never
// written.
var errTorn = errors.New("budget: torn copy")

// decodeState reads one copy, checking every value against capacity
// (the header's): a CRC that fails is errTorn, a broken rule ErrInvalid.
func decodeState(b []byte, capacity uint64) (*state, error) {
	if len(b) < stateSize {
		return nil, errors.Wrapf(driver.ErrInvalid, "budget: a copy of %d bytes, less than %d", len(b), stateSize)
	}
	le := binary.LittleEndian
	if le.Uint32(b[8:]) != stateCRC(b) {
		return nil, errTorn
	}
	s := &state{gen: le.Uint64(b[0:]), capacity: le.Uint64(b[16:])}
	bad := func(format string, args ...any) (*state, error) {
		return nil, errors.Wrapf(driver.ErrInvalid, "budget: corrupt book (generation %d): %s", s.gen, fmt.Sprintf(format, args...))
	}
	if le.Uint32(b[12:]) != 0 {
		return bad("a reserved field is not zero")
	}
	if s.gen == 0 || s.gen > maxGen {
		// A generation the next write would wrap (or near it) would win
		// over every later write: no book writes 2^62 times.
		return bad("generation %d, want 1 to %d", s.gen, uint64(maxGen))
	}
	if s.capacity != capacity {
		return bad("capacity %d, the header says %d", s.capacity, capacity)
	}
	names := map[string]bool{}
	for i := range s.recs {
		o := b[stateHead+i*recSize : stateHead+(i+1)*recSize]
		switch le.Uint32(o[0:]) {
		case 0:
			for _, x := range o {
				if x != 0 {
					return bad("slot %d is free but not zero", i)
				}
			}
			continue
		case 1:
		default:
			return bad("slot %d has flag %d", i, le.Uint32(o[0:]))
		}
		r := &s.recs[i]
		*r = record{used: true, pid: le.Uint32(o[4:]), token: le.Uint64(o[8:]),
			floor: le.Uint64(o[16:]), ceiling: le.Uint64(o[24:]), hold: le.Uint64(o[32:]),
			idle: le.Uint64(o[40:]), asked: le.Uint64(o[48:]), given: le.Uint64(o[56:])}
		n := int(o[64])
		if n == 0 || n > MaxName {
			return bad("slot %d's name has %d bytes (1 to %d)", i, n, MaxName)
		}
		for _, x := range o[65+n : 65+MaxName] {
			if x != 0 {
				return bad("slot %d has bytes after its name", i)
			}
		}
		for _, x := range o[65+MaxName:] {
			if x != 0 {
				return bad("slot %d's padding is not zero", i)
			}
		}
		r.name = string(o[65 : 65+n])
		if err := checkName(r.name); err != nil {
			return bad("slot %d: %v", i, err)
		}
		if names[r.name] {
			return bad("two members named %q", r.name)
		}
		names[r.name] = true
		switch {
		case r.token == 0:
			return bad("member %q has token 0", r.name)
		case r.ceiling > capacity:
			return bad("member %q's ceiling %d is over the capacity %d", r.name, r.ceiling, capacity)
		case r.floor > r.ceiling:
			return bad("member %q's floor %d is over its ceiling %d", r.name, r.floor, r.ceiling)
		case r.hold > r.ceiling:
			return bad("member %q holds %d, over its ceiling %d", r.name, r.hold, r.ceiling)
		case r.idle > r.hold:
			return bad("member %q has %d idle, over its hold %d", r.name, r.idle, r.hold)
		}
	}
	if sum := s.reservedSum(); sum > capacity {
		return bad("the members hold or are guaranteed %d, over the capacity %d", sum, capacity)
	}
	return s, nil
}

// Decode reads a whole book (the file's bytes): the header, then the
// newer of the two copies whose CRC holds. It returns which copy that
// was. A book with no good copy, or whose newest good copy breaks a rule,
// is refused (ErrInvalid).
func decode(b []byte) (*state, int, error) {
	if len(b) < copy1+stateSize {
		return nil, 0, errors.Wrapf(driver.ErrInvalid, "budget: a book of %d bytes, less than %d", len(b), copy1+stateSize)
	}
	capacity, err := decodeHeader(b)
	if err != nil {
		return nil, 0, err
	}
	s0, err0 := decodeState(b[copy0:], capacity)
	s1, err1 := decodeState(b[copy1:], capacity)
	// The copy with the higher generation among those whose CRC holds
	// is the books; a torn one is skipped.
	var gen0, gen1 uint64
	ok0, ok1 := !errors.Is(err0, errTorn), !errors.Is(err1, errTorn)
	if ok0 {
		gen0 = binary.LittleEndian.Uint64(b[copy0:])
	}
	if ok1 {
		gen1 = binary.LittleEndian.Uint64(b[copy1:])
	}
	switch {
	case ok0 && (!ok1 || gen0 > gen1):
		return s0, 0, err0
	case ok1 && (!ok0 || gen1 > gen0):
		return s1, 1, err1
	case ok0 && ok1:
		return nil, 0, errors.Wrapf(driver.ErrInvalid, "budget: corrupt book: both copies have generation %d", gen0)
	}
	return nil, 0, errors.Wrapf(driver.ErrInvalid, "budget: corrupt book: neither copy's CRC holds")
}

// checkName refuses a name no record may have.
func checkName(name string) error {
	switch {
	case name == "" || len(name) > MaxName:
		return errors.Newf("the name has %d bytes (1 to %d)", len(name), MaxName)
	case !utf8.ValidString(name):
		return errors.New("the name is not UTF-8")
	case strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return errors.New("the name has a control character")
	}
	return nil
}

// find returns the slot of the member named name, or -1.
func (s *state) find(name string) int {
	for i := range s.recs {
		if s.recs[i].used && s.recs[i].name == name {
			return i
		}
	}
	return -1
}

// checkLimits checks a floor and ceiling for a member, whose slot is
// self (-1 for a joiner), and returns what is wrong.
func (s *state) checkLimits(what func() string, self int, floor, ceiling uint64) error {
	switch {
	case ceiling == 0:
		return errors.Wrapf(driver.ErrInvalid, "%s: a ceiling of zero holds nothing", what())
	case floor > ceiling:
		return errors.Wrapf(driver.ErrInvalid, "%s: the floor %s is over the ceiling %s", what(), units.Bytes(floor), units.Bytes(ceiling))
	case ceiling > s.capacity:
		return errors.Wrapf(driver.ErrInvalid, "%s: the ceiling %s is over the capacity %s", what(), units.Bytes(ceiling), units.Bytes(s.capacity))
	}
	var hold uint64
	others := s.reservedSum()
	if self >= 0 {
		r := &s.recs[self]
		hold = r.hold
		others -= r.reserved()
		if hold > ceiling {
			return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: the member holds %s, over the ceiling asked", what(), units.Bytes(hold)),
				"release memory first, or lower its ceiling once it holds less")
		}
	}
	if others+max(hold, floor) > s.capacity {
		return errors.Wrapf(driver.ErrOutOfMemory, "%s: the others hold or are guaranteed %s of %s, no room for a floor of %s",
			what(), units.Bytes(others), units.Bytes(s.capacity), units.Bytes(floor))
	}
	return nil
}

// holders says who holds what, for an out-of-memory error.
func (s *state) holders() string {
	var parts []string
	for i := range s.recs {
		r := &s.recs[i]
		if r.used {
			parts = append(parts, fmt.Sprintf("%s (pid %d) holds %s, %s idle, floor %s, ceiling %s",
				r.name, r.pid, units.Bytes(r.hold), units.Bytes(r.idle), units.Bytes(r.floor), units.Bytes(r.ceiling)))
		}
	}
	if len(parts) == 0 {
		return "no members"
	}
	return strings.Join(parts, "; ")
}

// ask is a give-back to ask of one member.
type ask struct {
	slot  int
	bytes uint64
}

// plan returns what self must ask of the others for n more bytes: the
// shortfall, and the members to ask (most spare first, then by slot),
// each for what it can give up to what is still short. It asks nothing
// when the spare of all the others does not cover the shortfall.
func (s *state) plan(self int, n uint64) (short uint64, asks []ask, coverable bool) {
	r := &s.recs[self]
	need := s.reservedSum() - r.reserved() + max(r.hold+n, r.floor)
	if need <= s.capacity {
		return 0, nil, true
	}
	short = need - s.capacity
	var total uint64
	for i := range s.recs {
		if i != self && s.recs[i].used && s.recs[i].spare() > 0 {
			asks = append(asks, ask{slot: i, bytes: s.recs[i].spare()})
			total += s.recs[i].spare()
		}
	}
	if total < short {
		return short, nil, false
	}
	sort.SliceStable(asks, func(a, b int) bool { return asks[a].bytes > asks[b].bytes })
	left := short
	out := asks[:0]
	for _, a := range asks {
		if left == 0 {
			break
		}
		a.bytes = min(a.bytes, left)
		left -= a.bytes
		out = append(out, a)
	}
	return short, out, true
}
