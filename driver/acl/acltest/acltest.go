// Package acltest opens the AscendCL driver over a C stand-in of
// libascendcl.so that the test builds with the system C compiler: the same
// dynamic loading, calling convention, structs and error codes as the real
// runtime, implemented on host memory with AscendCL's rules (a map of a
// whole handle, accessible at once with aclrtMapMem and not with
// aclrtMemMapNoAccess, one NPU's memory per reservation, local or
// imported, reservations without alignment, access set over exactly one
// mapping, 64-byte aligned async copies, tokens with an allow-list that
// work across processes). Tests of every layer use it to run on the
// AscendCL driver without an NPU, and to make the runtime fail where an
// NPU would (out of memory at the n-th aclrtMallocPhysical, a refused
// aclrtMemMapNoAccess in the middle of a grow) and see each layer roll
// back.
//
// What the stand-in cannot prove is how real NPUs time and order their
// work, or any rule Huawei does not document; the stand-in's acl.c lists
// where it chose the strict reading of a silent document.
package acltest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// Config is the stand-in's configuration: its devices, their capacity and
// granularities, the features it lacks, and the symbol groups left out.
type Config = standin.Config

// Lib is one stand-in instance: fault injection and the counters of what
// it holds.
type Lib = standin.Lib

// Small is a configuration for layer tests: two NPUs of 64 granules of
// 64 KiB, the recommended granularity 2 MiB as ACL_HBM_MEM_HUGE's.
func Small() Config {
	return Config{Devices: 2, Capacity: 64 * 64 << 10, MinGranularity: 64 << 10, RecommendedGranularity: 2 << 20}
}

// Open builds (once) and loads a fresh stand-in configured with cfg and
// opens the AscendCL driver over it with opts (Options.Library is set to
// the stand-in). The driver is closed when the test ends, and the test
// fails if it cannot be (something the test made still maps memory) or if
// the stand-in still holds anything afterwards, contexts included. Without
// a C compiler the test is skipped, unless VMARENA_REQUIRE_STANDIN=1.
func Open(t testing.TB, cfg Config, opts acl.Options) (*acl.Driver, *Lib) {
	t.Helper()
	lib := standin.Open(t, standin.ACL, cfg)
	opts.Library = lib.Path()
	d, err := acl.Open(opts)
	require.NoError(t, err, "open the AscendCL driver over the stand-in")
	t.Cleanup(func() { RequireEmpty(t, lib) })
	drivertest.CloseAtEnd(t, d)
	return d, lib
}

// RequireEmpty fails t unless the stand-in holds nothing: no
// reservation, allocation, mapping, stream, event, pinned host buffer,
// context or exported token.
func RequireEmpty(t testing.TB, lib *Lib) {
	t.Helper()
	lib.RequireEmpty(t)
}

// OpenFile loads the stand-in file a test built (Lib.Path), configured as
// cfg, and opens the AscendCL driver over it: for a child process that a
// test starts, which has no testing.TB and must share the parent's file
// (a token is resolved by the stand-in of the same vendor in the other
// process). The caller closes the driver.
func OpenFile(path string, cfg Config, opts acl.Options) (*acl.Driver, *Lib, error) {
	lib, err := standin.OpenPath(path, cfg)
	if err != nil {
		return nil, nil, err
	}
	opts.Library = path
	d, err := acl.Open(opts)
	if err != nil {
		return nil, nil, err
	}
	return d, lib, nil
}
