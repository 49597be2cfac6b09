package physical

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/acl/acltest"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestAllowListReachesTheDriver: on a driver that keeps an allow-list of
// its own (AscendCL), Export and SetAllowedPIDs hand it the processes,
// once each; a refusal there leaves the chunk exported with nobody
// allowed, and SetAllowedPIDs can retry.
func TestAllowListReachesTheDriver(t *testing.T) {
	d, lib := acltest.Open(t, acltest.Small(), acl.Options{})
	m := New(d)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	g := d.Devices()[0].MinGranularity
	c, err := m.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Release()) }()

	const set = "aclrtMemSetPidToShareableHandle"
	before := lib.Calls(set)
	sh, err := c.Export(4242, 4343)
	require.NoError(t, err)
	require.Equal(t, driver.HandleToken, sh.Type)
	require.Equal(t, before+1, lib.Calls(set), "one call naming both processes")
	require.True(t, c.Allowed(4242))

	require.NoError(t, c.SetAllowedPIDs(4343, 4444))
	require.Equal(t, before+2, lib.Calls(set), "only 4444 is new to the driver")
	require.False(t, c.Allowed(4242), "the sender's list shrinks; the runtime's cannot")
	require.NoError(t, c.SetAllowedPIDs(4343))
	require.Equal(t, before+2, lib.Calls(set), "nobody new: no call")

	lib.Fail(set, 1, 1, 107000)
	err = c.SetAllowedPIDs(5555)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "ACL_ERROR_RT_PARAM_INVALID (107000)")
	require.True(t, c.Allowed(4343), "a refused change keeps the list")
	require.False(t, c.Allowed(5555))
	require.NoError(t, c.SetAllowedPIDs(5555), "the retry succeeds")
	require.True(t, c.Allowed(5555))

	c2, err := m.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, c2.Release()) }()
	lib.Fail(set, 1, 1, 107000)
	_, err = c2.Export(6666)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "exported, but no process is allowed to import it")
	_, exported := c2.Exported()
	require.True(t, exported, "the runtime exported it and cannot take that back")
	require.False(t, c2.Allowed(6666))
	require.NoError(t, c2.SetAllowedPIDs(6666))
	require.True(t, c2.Allowed(6666))
}
