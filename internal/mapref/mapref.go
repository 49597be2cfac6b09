// Package mapref carries the mapping count of physical chunks from the
// package that keeps it (physical) to the one package that changes it
// (mapping), without making it part of physical's public API: a caller who
// could drop a mapping reference it never took would make a chunk's memory
// return while it is still mapped, and a full device report 0 bytes used.
//
// physical installs the two functions when it is initialised; mapping
// passes every driver Map and Unmap through them. No other package may call
// them.
package mapref

// An Op is the driver call that Map or Unmap runs under physical's lock.
// mapping passes its own records as Ops (a pointer in an interface), not
// closures: a closure handed to a function variable escapes to the heap,
// and a map or unmap would allocate for it every time.
type Op interface{ Do() error }

// OpFunc makes a function an Op.
type OpFunc func() error

// Do calls f.
func (f OpFunc) Do() error { return f() }

var (
	// Map counts one more mapping of chunk (a *physical.Chunk) and runs op,
	// the driver's map, under physical's lock; if op fails the count is as
	// it was. A released chunk is driver.ErrBadHandle and op does not run.
	Map func(chunk any, op Op) error
	// Unmap runs op, the driver's unmap, and counts one mapping of chunk
	// fewer, under physical's lock; if op fails nothing changes.
	Unmap func(chunk any, op Op) error
)
