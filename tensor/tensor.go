package tensor

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Buffer is memory a tensor can live in: *arena.View satisfies it. Bytes is
// called once, when the tensor is made; the slice must stay valid for as
// long as the tensor (and every view of it) is used.
type Buffer interface {
	Bytes() ([]byte, error)
}

// addresser is a buffer that knows its device address (*arena.View).
type addresser interface{ Addr() driver.Addr }

// storage is the memory one tensor and all its views share.
//
// Invariant: bytes never changes after creation; once released is set, no
// tensor over this storage touches bytes again.
type storage struct {
	bytes []byte
	// addr is the device address of bytes[0], 0 when the buffer has none.
	addr     driver.Addr
	released atomic.Bool
	// owner is the one tensor whose Release ends the storage, with release
	// doing it; nil when something else owns the memory, which holder
	// then names for the error ("the caller", "a Growable").
	owner   *Tensor
	release func() error
	holder  string
	// lease, when not nil, ends the storage too: revoked, it is as
	// released (NewLeased).
	lease *Lease
	// readOnly is how many of bytes, from the start, refuse writes
	// through the checked accessors (NewLeasedReadOnly); never more than
	// len(bytes).
	readOnly int
	// unaddressable is set for a storage over memory the process cannot
	// address (a GPU's, an NPU's, the sim driver's: a device tensor):
	// bytes is nil and size is the memory's length; every accessor of
	// bytes (At, Set, Data, Copy, Access) refuses it (ErrUnsupported)
	// rather than index nil, and AccessDevice hands out addr instead.
	unaddressable bool
	size          int
	// using counts the accesses in flight (enter to exit). An access
	// counts itself before it looks at released, and Release sets
	// released before it looks at using (both sequentially consistent),
	// so once Release sees zero no access is touching the memory and
	// none will: it ends the memory only then.
	using atomic.Int64
}

// length is the storage's memory in bytes: its bytes', or a device
// storage's size.
func (st *storage) length() int {
	if st.unaddressable {
		return st.size
	}
	return len(st.bytes)
}

// hostBytes refuses (ErrUnsupported) an access to the bytes of a tensor
// over memory the process cannot address.
func (t *Tensor) hostBytes(what func() string) error {
	if t.st.unaddressable {
		return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: its memory is not addressable from this process", what()),
			"move its bytes with the driver's copies (AccessDevice gives its device address), or over transfer")
	}
	return nil
}

// gone reports whether the storage's memory may no longer be touched:
// released by its owner, or its lease revoked.
func (st *storage) gone() bool {
	return st.released.Load() || (st.lease != nil && st.lease.Revoked())
}

// enter starts an access to the storage's memory, which stays mapped
// until exit (its lease, if any, waits: Lease); false, with nothing
// started, when the memory may no longer be touched.
func (st *storage) enter() bool {
	if st.lease != nil && !st.lease.enter() {
		return false
	}
	st.using.Add(1)
	if st.released.Load() {
		st.exit()
		return false
	}
	return true
}

// exit ends an access enter started.
func (st *storage) exit() {
	st.using.Add(-1)
	if st.lease != nil {
		st.lease.exit()
	}
}

// Tensor is a dtype, shape, strides and offset over a storage. It is
// immutable: every operation returns a new tensor (a view of the same
// storage, or a copy in another buffer).
//
// Invariant: see the package doc; n is the product of shape.
type Tensor struct {
	st      *storage
	dt      DType
	shape   []int
	strides []int
	offset  int
	n       int
}

// rowMajor returns the strides of a contiguous row-major tensor of shape.
func rowMajor(shape []int) []int {
	strides := make([]int, len(shape))
	s := 1
	for d := len(shape) - 1; d >= 0; d-- {
		strides[d] = s
		s *= max(shape[d], 1)
	}
	return strides
}

// numElements returns the product of shape, or an error naming the dim
// that is negative. It also refuses a shape whose non-zero dims multiply
// past an int even when a zero dim makes it empty, so that no stride of
// any view of it can overflow.
func numElements(shape []int) (int, error) {
	n, nonzero := 1, 1
	for d, s := range shape {
		if s < 0 {
			return 0, errors.Newf("dim %d is %d, below zero", d, s)
		}
		if s != 0 {
			if nonzero > math.MaxInt/s {
				return 0, errors.Newf("its dims multiply past the largest int")
			}
			nonzero *= s
		}
		n *= s
	}
	return n, nil
}

// New lays a row-major tensor of dt and shape over buf, at offset 0. It
// refuses (ErrInvalid) an undefined dtype, a negative dim, a shape whose
// bytes overflow an int, or a buffer too small for the shape, and (ErrMisaligned) a buffer that does not start at
// a multiple of the element size. A shape of no dims is a scalar (one
// element); a zero dim makes an empty tensor, which fits any buffer.
//
// A buffer over memory the process cannot address (an arena view on a
// CUDA or AscendCL device: its Bytes is ErrUnsupported, and it has Addr
// and Len) makes a device tensor (see OnArena).
//
// The tensor does not own buf: the caller keeps it live for as long as the
// tensor and its views are used, and ends it itself.
func New(buf Buffer, dt DType, shape ...int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: new %s tensor of shape %v", dt, shape) }
	if isnil.Is(buf) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the buffer is nil", what())
	}
	b, addr, dev, n, err := bufferBytes(buf)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: the buffer's bytes", what())
	}
	st := &storage{bytes: b, addr: addr, unaddressable: dev, size: n, holder: "the caller, who made it with New"}
	return newOn(st, dt, shape, what)
}

// deviceBuffer is a buffer over device memory that knows its length
// (*arena.View over a driver whose memory the process cannot address,
// whose Bytes is ErrUnsupported).
type deviceBuffer interface {
	Addr() driver.Addr
	Len() uint64
}

// bufferBytes asks buf for its bytes and, if it has one, its address. A
// buffer with an address and a length whose Bytes is ErrUnsupported is
// device memory: dev is set, with n its length and b nil. buf is the
// caller's code: a panic in it becomes an error (ErrInvalid).
func bufferBytes(buf Buffer) (b []byte, addr driver.Addr, dev bool, n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, addr, dev, n, err = nil, 0, false, 0, errors.Wrapf(driver.ErrInvalid, "the %T buffer panicked: %v", buf, r)
		}
	}()
	if b, err = buf.Bytes(); err != nil {
		d, ok := buf.(deviceBuffer)
		if !ok || !errors.Is(err, driver.ErrUnsupported) || d.Len() > math.MaxInt {
			return nil, 0, false, 0, err
		}
		return nil, d.Addr(), true, int(d.Len()), nil
	}
	if a, ok := buf.(addresser); ok {
		addr = a.Addr()
	}
	return b, addr, false, len(b), nil
}

// newOn makes a row-major tensor at offset 0 of st, checking everything.
func newOn(st *storage, dt DType, shape []int, what func() string) (*Tensor, error) {
	n, err := checkLayout(dt, shape, what)
	if err != nil {
		return nil, err
	}
	if n > st.length()/dt.Size() {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: needs %d bytes (%d elements of %d), the buffer holds %s (%d bytes)",
				what(), n*dt.Size(), n, dt.Size(), units.Bytes(uint64(st.length())), st.length()),
			"give it a larger buffer, or a smaller shape")
	}
	if st.unaddressable && st.size > 0 && uint64(st.addr)%uint64(dt.Size()) != 0 ||
		len(st.bytes) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(st.bytes)))%uintptr(dt.Size()) != 0 {
		return nil, errors.Wrapf(driver.ErrMisaligned, "%s: the buffer does not start at a multiple of the %s element size, %d bytes",
			what(), dt, dt.Size())
	}
	shape = slices.Clone(shape)
	if shape == nil {
		shape = []int{}
	}
	return &Tensor{st: st, dt: dt, shape: shape, strides: rowMajor(shape), n: n}, nil
}

// OnArena grows a by the tensor's bytes (after padding Len up to a
// multiple of the element size, so elements are aligned) and lays a
// row-major tensor over a view of them. The tensor owns the view: its
// Release ends it, after which the arena may shrink over the memory. The
// bytes stay in the arena (an arena only shrinks from its end; shrinking
// is the arena owner's business).
//
// An empty shape (a zero dim) grows nothing and holds no view. If the
// arena cannot grow (past its Max, or the device is out of memory) the
// arena's error is returned and the arena is as it was.
//
// The bytes come from arena.Append, which grows and hands them over in one
// step, so other users may grow the same arena at the same time. On an
// arena whose memory the process cannot address (a CUDA or AscendCL
// device's, the sim driver's) the tensor is a device tensor: it has a
// device address and a length but no bytes, so At, Set, Data, Copy and
// Access refuse it (ErrUnsupported), and its bytes move with the
// driver's copies under AccessDevice (package transfer stages them).
func OnArena(a *arena.Arena, dt DType, shape ...int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: %s tensor of shape %v on an arena", dt, shape) }
	if a == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the arena is nil", what())
	}
	if a.Closed() {
		return nil, driver.Closed(what() + ": the arena is closed (or was not made by arena.New)")
	}
	n, err := checkLayout(dt, shape, what)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		st := &storage{addr: a.Base() + driver.Addr(a.Len()), release: func() error { return nil }, unaddressable: !a.HostAddressable()}
		t, err := newOn(st, dt, shape, what)
		if err == nil {
			st.owner = t
		}
		return t, err
	}
	size := uint64(n * dt.Size())
	v, err := a.Append(size, uint64(dt.Size()))
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	// Past Append the bytes are ours alone; a failure leaves them as
	// padding in the arena rather than shrink under other users.
	undo := func(err error, v *arena.View) error { return errors.CombineErrors(err, v.Release()) }
	st := &storage{addr: v.Addr(), release: v.Release}
	if a.HostAddressable() {
		if st.bytes, err = v.Bytes(); err != nil {
			return nil, undo(errors.Wrapf(err, "%s", what()), v)
		}
	} else {
		st.unaddressable, st.size = true, int(size)
	}
	t, err := newOn(st, dt, shape, what)
	if err != nil {
		return nil, undo(err, v)
	}
	st.owner = t
	return t, nil
}

// checkLayout checks dt and shape for a new tensor and returns its number of
// elements, whose bytes fit an int.
func checkLayout(dt DType, shape []int, what func() string) (int, error) {
	if !dt.Valid() {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: %s is not a defined dtype", what(), dt)
	}
	n, err := numElements(shape)
	if err != nil {
		return 0, sentinel.Mark(errors.Wrapf(err, "%s", what()), driver.ErrInvalid)
	}
	if n > math.MaxInt/dt.Size() {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: %d elements of %d bytes overflow an int", what(), n, dt.Size())
	}
	return n, nil
}

// Release ends the memory of a tensor that owns it (one OnArena or Empty
// returned): the arena view ends, or the allocation is freed. Every view
// of the tensor refuses to touch memory afterwards (ErrClosed), and the
// accesses in flight through any of them (At, Set, Copy, Access) end
// first: Release waits for them, so none touches memory after it is
// freed (or handed to the next allocation). It must not be called from
// inside an access of the tensor or its views, which it would wait for.
// A view, or a tensor over memory someone else owns, cannot release it
// (ErrInvalid); releasing twice is ErrClosed.
func (t *Tensor) Release() error {
	if err := t.made(func() string { return "tensor: release" }); err != nil {
		return err
	}
	if t.st.owner != t {
		if t.st.owner != nil {
			return errors.WithHint(
				errors.Wrapf(driver.ErrInvalid, "tensor: release of %s: it is a view; its memory belongs to the tensor it was made from", t),
				"release the tensor OnArena or Empty returned")
		}
		return errors.Wrapf(driver.ErrInvalid, "tensor: release of %s: its memory belongs to %s", t, t.st.holder)
	}
	if !t.st.released.CompareAndSwap(false, true) {
		return driver.Closed(fmt.Sprintf("tensor: release of %s: already released", t))
	}
	drain(&t.st.using)
	if err := t.st.release(); err != nil {
		t.st.released.Store(false)
		return errors.Wrapf(err, "tensor: release of %s", t)
	}
	return nil
}

// made returns ErrInvalid for a nil Tensor or one not made by this
// package's constructors (a zero Tensor, which has no storage).
func (t *Tensor) made(what func() string) error {
	if t == nil || t.st == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: not a tensor made by New, OnArena, Empty or a Growable", what()),
			"a nil or zero Tensor has no memory")
	}
	return nil
}

// live returns ErrClosed once the storage has been released, and
// ErrInvalid for a tensor with no storage at all.
func (t *Tensor) live(what func() string) error {
	if err := t.made(what); err != nil {
		return err
	}
	if t.st.gone() {
		return driver.Closed(what() + ": its memory was released")
	}
	return nil
}

// enter is live for a call about to touch t's memory: on success the
// memory stays until the caller's t.st.exit().
func (t *Tensor) enter(what func() string) error {
	if err := t.made(what); err != nil {
		return err
	}
	if !t.st.enter() {
		return driver.Closed(what() + ": its memory was released")
	}
	return nil
}

// writable refuses (ErrAccessDenied) a write to t's elements when the
// lowest of them lies in the storage's read-only bytes (a prefix: the
// lowest element is the one to check).
func (t *Tensor) writable(what func() string) error {
	if lo, _ := t.span(); t.n > 0 && lo < t.st.readOnly {
		return errors.WithHint(errors.Wrapf(driver.ErrAccessDenied, "%s: the first %s of its memory are read-only, and the write reaches byte %d",
			what(), units.Bytes(uint64(t.st.readOnly)), lo), "its owner shares that memory (a KV cache's prefix pages): write elsewhere")
	}
	return nil
}

// DType is the element type.
func (t *Tensor) DType() DType {
	if t == nil {
		return 0
	}
	return t.dt
}

// Shape is the size of each dim (a copy).
func (t *Tensor) Shape() []int {
	if t == nil {
		return nil
	}
	return slices.Clone(t.shape)
}

// Dims is the number of dims (0 for a scalar).
func (t *Tensor) Dims() int {
	if t == nil {
		return 0
	}
	return len(t.shape)
}

// Strides is the step of each dim, in elements (a copy).
func (t *Tensor) Strides() []int {
	if t == nil {
		return nil
	}
	return slices.Clone(t.strides)
}

// Offset is the storage offset of the first element, in elements.
func (t *Tensor) Offset() int {
	if t == nil {
		return 0
	}
	return t.offset
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Addr is the device address of the storage the tensor lives in: the start
// of the arena view or allocation, not of the tensor's first element (add
// Offset()*DType().Size() for that). It is what Allocator.Free takes for an
// Empty tensor. It is 0 for a buffer that has no device address.
func (t *Tensor) Addr() driver.Addr {
	if t == nil || t.st == nil {
		return 0
	}
	return t.st.addr
}

// Released reports whether the tensor's memory has been released; a
// tensor with no storage (nil, or zero) has none to use and reports true.
func (t *Tensor) Released() bool { return t == nil || t.st == nil || t.st.gone() }

// SharesStorage reports whether t and u are views of the same storage;
// false when either has none.
func (t *Tensor) SharesStorage(u *Tensor) bool {
	return t != nil && u != nil && t.st != nil && t.st == u.st
}

// IsContiguous reports whether the elements lie back to back in row-major
// order (dims of size 1 may have any stride; an empty tensor is contiguous).
func (t *Tensor) IsContiguous() bool {
	if t == nil {
		return false
	}
	if t.n == 0 {
		return true
	}
	want := 1
	for d := len(t.shape) - 1; d >= 0; d-- {
		if t.shape[d] != 1 && t.strides[d] != want {
			return false
		}
		want *= t.shape[d]
	}
	return true
}

// String describes the tensor: "float32[2 3] strides [3 1] offset 0".
func (t *Tensor) String() string {
	if t == nil {
		return "tensor (nil)"
	}
	return fmt.Sprintf("%s%v strides %v offset %d", t.dt, t.shape, t.strides, t.offset)
}

// span returns the storage byte range [lo, hi) the tensor's elements lie
// in; lo == hi for an empty tensor.
func (t *Tensor) span() (lo, hi int) {
	if t.n == 0 {
		return 0, 0
	}
	last := t.offset
	for d, s := range t.shape {
		last += (s - 1) * t.strides[d]
	}
	return t.offset * t.dt.Size(), (last + 1) * t.dt.Size()
}

// Check verifies the tensor's invariants (see the package doc) and reports
// every one that does not hold.
func (t *Tensor) Check() error {
	if err := t.made(func() string { return "tensor: check" }); err != nil {
		return err
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("tensor: %s: "+format, append([]any{t}, args...)...))
	}
	if !t.dt.Valid() {
		fail("undefined dtype")
		return errs
	}
	if len(t.shape) != len(t.strides) {
		fail("%d dims but %d strides", len(t.shape), len(t.strides))
		return errs
	}
	if n, err := numElements(t.shape); err != nil || n != t.n {
		fail("%d elements recorded, the shape has %d (%v)", t.n, n, err)
	}
	if t.offset < 0 {
		fail("negative offset")
	}
	for d, s := range t.strides {
		if s < 0 {
			fail("negative stride in dim %d", d)
		}
	}
	if _, hi := t.span(); hi > t.st.length() {
		fail("elements reach byte %d, the storage holds %d", hi, t.st.length())
	}
	if t.st.unaddressable && t.st.bytes != nil {
		fail("a device storage has %d host bytes", len(t.st.bytes))
	}
	if len(t.st.bytes) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(t.st.bytes)))%uintptr(t.dt.Size()) != 0 {
		fail("storage not aligned to the element size")
	}
	return errs
}
