//go:build linux

package dl

import (
	"github.com/ebitengine/purego"
	"github.com/vmarena/vmarena/internal/errors"
)

// Open loads the library at path (a path, or a soname the dynamic loader
// finds) and binds every group of syms whose symbols are all there;
// groups is the number of groups. A path that is no regular file is
// refused before the loader sees it (CheckFile); other errors are the
// loader's.
func Open(path string, syms []Symbol, groups int) (*Library, error) {
	if err := CheckFile(path); err != nil {
		return nil, err
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, errors.Newf("cannot load %s: %v", path, err)
	}
	lib := &Library{Path: path, Handle: h, Has: make([]bool, groups), Missing: make([][]string, groups)}
	addrs := make([]uintptr, len(syms))
	for i, s := range syms {
		a, err := purego.Dlsym(h, s.Name)
		if err != nil || a == 0 {
			lib.Missing[s.Group] = append(lib.Missing[s.Group], s.Name)
			continue
		}
		addrs[i] = a
	}
	for g := range groups {
		lib.Has[g] = len(lib.Missing[g]) == 0
	}
	for i, s := range syms {
		if lib.Has[s.Group] {
			purego.RegisterFunc(s.Fn, addrs[i])
		}
	}
	return lib, nil
}

// NewCallback returns a C function pointer that calls fn with its one
// pointer-sized argument, from any thread. Callbacks are never freed (and
// there is a limit on how many a process may make): make one per process.
func NewCallback(fn func(arg uintptr)) uintptr { return purego.NewCallback(fn) }
