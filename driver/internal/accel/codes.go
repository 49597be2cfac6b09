package accel

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
)

// Code is what a driver knows of one of its vendor's error codes: its name
// in the vendor's header, the contract's sentinel it is marked with, and a
// hint for the user ("" for none).
type Code struct {
	Name     string
	Sentinel error
	Hint     string
}

// CallError is the error of vendor call fn returning r, nil for 0 (every
// vendor's success): "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)", marked
// with the table's sentinel and hint. A code the table lacks (a newer
// runtime's) is ErrDeviceFault, named by unknown(r) when that gives a name
// (CUDA's cuGetErrorName), else as "<kind> <r>" ("CUresult 1234"). detail,
// when not empty, is the runtime's own message (AscendCL's
// aclGetRecentErrMsg), kept in the error's details.
func CallError[K ~int32](table map[K]Code, fn string, r K, kind string, unknown func(K) string, detail string) error {
	if r == 0 {
		return nil
	}
	c, ok := table[r]
	name := c.Name
	if !ok {
		c.Sentinel = driver.ErrDeviceFault
		if unknown != nil {
			name = unknown(r)
		}
	}
	spelled := fmt.Sprintf("%s %d", kind, r)
	if name != "" {
		spelled = fmt.Sprintf("%s (%d)", name, r)
	}
	err := sentinel.Mark(errors.Newf("%s: %s", errors.Safe(fn), errors.Safe(spelled)), c.Sentinel)
	if detail != "" {
		err = errors.WithDetailf(err, "the runtime says: %s", detail)
	}
	if c.Hint != "" {
		err = errors.WithHint(err, c.Hint)
	}
	return err
}
