package acl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/acl/acltest"
)

// TestACLTestOpen uses the driver as other packages' tests do: through
// acltest, whose cleanup closes it and then requires the stand-in empty,
// contexts and devices included.
func TestACLTestOpen(t *testing.T) {
	d, lib := acltest.Open(t, acltest.Small(), acl.Options{})
	g := d.Granularity()
	require.Equal(t, uint64(64<<10), g)
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 1, driver.AccessReadWrite))
	require.NoError(t, d.Write(base, []byte("npu")))
	got := make([]byte, 3)
	require.NoError(t, d.Read(base, got))
	require.Equal(t, "npu", string(got))
	require.Equal(t, 3, lib.Access(uint64(base), 1))
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(base, g))
}
