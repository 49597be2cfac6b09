//go:build !linux

package dl

import "github.com/vmarena/vmarena/internal/errors"

// Open answers that loading vendor libraries needs Linux: the accelerator
// drivers are built everywhere (so the packages above them compile) but
// open only there.
func Open(path string, _ []Symbol, _ int) (*Library, error) {
	return nil, errors.Newf("cannot load %s: the accelerator drivers load their vendor libraries on Linux only", path)
}

// NewCallback is never reached where Open always fails.
func NewCallback(func(arg uintptr)) uintptr { return 0 }
