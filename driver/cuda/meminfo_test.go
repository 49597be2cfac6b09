package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
)

// TestMemInfo: MemInfo is cuMemGetInfo_v2's answer for the device asked
// (its context current): the total, and what the live chunks leave; an
// unknown device is ErrNoDevice, a refusal of libcuda its sentinel.
func TestMemInfo(t *testing.T) {
	cfg := cudatest.Small()
	d, lib := cudatest.Open(t, cfg, cuda.Options{})
	free, total, err := d.MemInfo(1)
	require.NoError(t, err)
	require.Equal(t, cfg.Capacity, total)
	require.Equal(t, cfg.Capacity, free)
	h, err := d.Create(1, 4*cfg.MinGranularity, driver.ChunkOptions{})
	require.NoError(t, err)
	free, _, err = d.MemInfo(1)
	require.NoError(t, err)
	require.Equal(t, cfg.Capacity-4*cfg.MinGranularity, free)
	free, _, err = d.MemInfo(0)
	require.NoError(t, err)
	require.Equal(t, cfg.Capacity, free, "the other device")
	require.NoError(t, d.Release(h))

	_, _, err = d.MemInfo(2)
	require.True(t, errors.Is(err, driver.ErrNoDevice), "%v", err)
	lib.Fail("cuMemGetInfo_v2", 1, 1, 999)
	_, _, err = d.MemInfo(0)
	require.True(t, errors.Is(err, driver.ErrDeviceFault), "%v", err)
	require.Contains(t, err.Error(), "cuMemGetInfo_v2")
	lib.Clear()
	_, _, err = d.MemInfo(0)
	require.NoError(t, err)
}
