// Package cudatest opens the CUDA driver over a C stand-in of libcuda.so.1
// that the test builds with the system C compiler: the same dynamic
// loading, calling convention, structs and error codes as the real
// library, implemented on host memory with CUDA's rules (granularity,
// no map over a mapping, access per device, refcounted release,
// descriptors for export). Tests of every layer use it to run on the CUDA
// driver without a GPU, and to make the library fail where a GPU would
// (out of memory at the n-th cuMemCreate, a refused cuMemMap in the middle
// of a grow) and see each layer roll back.
//
// What the stand-in cannot prove is how real GPUs time and order their
// work, or any rule NVIDIA does not document; docs/drivers.md (What has
// been proven where) says what has run on hardware.
package cudatest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// Config is the stand-in's configuration: its devices, their capacity and
// granularities, the features it lacks, and the symbol groups left out.
type Config = standin.Config

// Lib is one stand-in instance: fault injection and the counters of what
// it holds.
type Lib = standin.Lib

// Small is a configuration for layer tests: two devices of 64 granules of
// 64 KiB, the recommended granularity 2 MiB as on GPUs.
func Small() Config {
	return Config{Devices: 2, Capacity: 64 * 64 << 10, MinGranularity: 64 << 10, RecommendedGranularity: 2 << 20}
}

// Open builds (once) and loads a fresh stand-in configured with cfg and
// opens the CUDA driver over it with opts (Options.Library is set to the
// stand-in). The driver is closed when the test ends, and the test fails
// if it cannot be (something the test made still maps memory) or if the
// stand-in still holds anything afterwards. Without a C compiler the test
// is skipped, unless VMARENA_REQUIRE_STANDIN=1.
func Open(t testing.TB, cfg Config, opts cuda.Options) (*cuda.Driver, *Lib) {
	t.Helper()
	lib := standin.Open(t, standin.CUDA, cfg)
	opts.Library = lib.Path()
	d, err := cuda.Open(opts)
	require.NoError(t, err, "open the CUDA driver over the stand-in")
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
// cfg, and opens the CUDA driver over it: for a child process that a test
// starts, which has no testing.TB (its stand-in is its own instance, with
// its own devices, as another process's GPU view is). The caller closes
// the driver.
func OpenFile(path string, cfg Config, opts cuda.Options) (*cuda.Driver, *Lib, error) {
	lib, err := standin.OpenPath(path, cfg)
	if err != nil {
		return nil, nil, err
	}
	opts.Library = path
	d, err := cuda.Open(opts)
	if err != nil {
		return nil, nil, err
	}
	return d, lib, nil
}
