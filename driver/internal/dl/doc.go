// Package dl loads a vendor's C library at run time (github.com/ebitengine/
// purego: no cgo, no vendor headers at build time) and binds its symbols
// to Go function variables, a group at a time: a group is the set of
// symbols one feature needs, and it is bound whole or not at all, so a
// library that lacks one symbol loses that feature and nothing else.
//
// It never unloads a library: the vendor runtimes (libcuda, libascendcl)
// keep threads and state that do not survive an unload. It never lets a
// library that cannot load hold up the process: a path that is no regular
// file (a FIFO would block dlopen forever) is refused before the loader
// sees it (CheckFile), and Once loads each path on a goroutine of its own
// with no lock held, every caller waiting a bounded time.
package dl

import (
	"os"
	"unsafe"
)

// Symbol is one C function: its exported name, a pointer to the Go
// function variable that calls it, and the group it belongs to.
type Symbol struct {
	Name  string
	Fn    any // *func(...) ...
	Group int
}

// Library is an opened library and what of it was bound.
type Library struct {
	Path string
	// Handle is the loader's handle of the library.
	Handle uintptr
	// Has[g] says whether every symbol of group g was found and bound.
	Has []bool
	// Missing[g] names the symbols of group g the library lacks.
	Missing [][]string
}

// CString reads a NUL-terminated C string of at most max bytes at p.
func CString(p *byte, max int) string {
	var b []byte
	for i := range max {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// Pick is the library to load: the caller's choice (opt), else the
// environment variable env, else the vendor's default (a soname the
// dynamic loader finds on its usual path).
func Pick(opt, env, def string) string {
	if opt != "" {
		return opt
	}
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}
