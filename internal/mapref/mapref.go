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

var (
	// Map counts one more mapping of chunk (a *physical.Chunk) and runs do,
	// the driver's map, under physical's lock; if do fails the count is as
	// it was. A released chunk is driver.ErrBadHandle and do does not run.
	Map func(chunk any, do func() error) error
	// Unmap runs do, the driver's unmap, and counts one mapping of chunk
	// fewer, under physical's lock; if do fails nothing changes.
	Unmap func(chunk any, do func() error) error
)
