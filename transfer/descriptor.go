package transfer

import (
	"encoding/binary"
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Descriptor names registered memory at its owner, for a peer's Put and
// Get: what a registration's owner sends to the peers it lets move bytes
// in or out of that memory (MarshalBinary), over any channel of its own.
// It is a name, not a capability the owner trusts: the owner's engine
// checks every field of it but Key against its live registrations on
// every transfer (ID, Gen, and each op's bytes from Addr against the
// registration's; see the package doc), so a stale, forged or mangled
// one is refused there. Key only the initiator's UCX reads (ucx kind;
// UCX 1.13's transports without RDMA hardware ignore it).
type Descriptor struct {
	Engine string // the owner's Addr
	// ID and Gen name the registration at the owner: ids are never
	// reused within an engine, and Gen is random, so a descriptor of a
	// closed registration, or of an engine that listened at the same
	// address before, never matches a live one.
	ID, Gen  uint64
	Addr     uint64 // the memory's address in the owner's process
	Len      uint64
	Writable bool
	Key      []byte // UCX packed remote key (empty for tcp)
}

// The wire form of a Descriptor, all integers big-endian:
//
//	magic "vmTD", version 1
//	engine: u16 length, then that many bytes (1 to maxEngine)
//	id, gen, addr, len: u64 each
//	flags: u8 (bit 0: writable; the others zero)
//	key: u16 length, then that many bytes (0 to maxKey)
//
// and nothing after.
const (
	descMagic   = "vmTD"
	descVersion = 1
	maxEngine   = 255
	maxKey      = 4096
	descFixed   = len(descMagic) + 1 + 2 + 4*8 + 1 + 2 // without engine and key
)

func (d Descriptor) String() string {
	return fmt.Sprintf("descriptor %d gen %#x of %d bytes at %s", d.ID, d.Gen, d.Len, d.Engine)
}

// check refuses (ErrInvalid) a descriptor no engine hands out.
func (d *Descriptor) check(what func() string) error {
	switch {
	case d.Engine == "" || len(d.Engine) > maxEngine:
		return errors.Wrapf(driver.ErrInvalid, "%s: the engine address is %d bytes long (1 to %d)", what(), len(d.Engine), maxEngine)
	case d.ID == 0:
		return errors.Wrapf(driver.ErrInvalid, "%s: id 0 names no registration", what())
	case d.Len == 0:
		return errors.Wrapf(driver.ErrInvalid, "%s: no registration is empty", what())
	case d.Addr+d.Len < d.Addr:
		return errors.Wrapf(driver.ErrInvalid, "%s: %d bytes at %#x wrap around the address space", what(), d.Len, d.Addr)
	case len(d.Key) > maxKey:
		return errors.Wrapf(driver.ErrInvalid, "%s: a key of %d bytes (at most %d)", what(), len(d.Key), maxKey)
	}
	return nil
}

// MarshalBinary encodes d (see the wire form above). A descriptor no
// engine hands out (the zero one included) is refused, ErrInvalid.
func (d Descriptor) MarshalBinary() ([]byte, error) {
	if err := d.check(func() string { return "transfer: marshal a descriptor" }); err != nil {
		return nil, err
	}
	b := make([]byte, 0, descFixed+len(d.Engine)+len(d.Key))
	b = append(b, descMagic...)
	b = append(b, descVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(d.Engine)))
	b = append(b, d.Engine...)
	for _, v := range []uint64{d.ID, d.Gen, d.Addr, d.Len} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	var flags byte
	if d.Writable {
		flags = 1
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(len(d.Key)))
	return append(b, d.Key...), nil
}

// UnmarshalBinary decodes what MarshalBinary wrote. Hostile bytes get a
// clear error (ErrInvalid) and leave d as it was; it never panics. The
// key is copied: d does not keep b.
func (d *Descriptor) UnmarshalBinary(b []byte) error {
	what := func() string { return fmt.Sprintf("transfer: unmarshal a descriptor of %d bytes", len(b)) }
	if d == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: into a nil descriptor", what())
	}
	bad := func(format string, args ...any) error {
		return errors.Wrapf(driver.ErrInvalid, "%s: "+format, append([]any{what()}, args...)...)
	}
	if len(b) < descFixed {
		return bad("shorter than the %d bytes of the fixed fields", descFixed)
	}
	if string(b[:4]) != descMagic {
		return bad("it does not start with %q", descMagic)
	}
	if b[4] != descVersion {
		return bad("version %d, this engine reads version %d", b[4], descVersion)
	}
	r := b[5:]
	n := int(binary.BigEndian.Uint16(r))
	r = r[2:]
	if n == 0 || n > maxEngine || len(r) < n+4*8+1+2 {
		return bad("an engine address of %d bytes (1 to %d, and the rest must follow)", n, maxEngine)
	}
	var out Descriptor
	out.Engine, r = string(r[:n]), r[n:]
	out.ID, out.Gen = binary.BigEndian.Uint64(r), binary.BigEndian.Uint64(r[8:])
	out.Addr, out.Len = binary.BigEndian.Uint64(r[16:]), binary.BigEndian.Uint64(r[24:])
	flags := r[32]
	r = r[33:]
	if flags&^1 != 0 {
		return bad("unknown flags %#x", flags)
	}
	out.Writable = flags&1 != 0
	k := int(binary.BigEndian.Uint16(r))
	r = r[2:]
	if k != len(r) {
		return bad("a key of %d bytes, and %d bytes follow", k, len(r))
	}
	if k > 0 {
		out.Key = append([]byte(nil), r...)
	}
	if err := out.check(what); err != nil {
		return err
	}
	*d = out
	return nil
}
