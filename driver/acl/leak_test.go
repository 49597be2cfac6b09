package acl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// TestCloseLeavesNothing: a driver opened, used for everything it does
// (chunks mapped and granted, bytes moved both ways, a stream's copies, a
// pinned buffer, a token exported and imported back) and closed
// leaves the process as it found it — descriptors and kernel mappings —
// and the library holding nothing. The stand-in is loaded once, before:
// its own code is the library's, not the driver's.
func TestCloseLeavesNothing(t *testing.T) {
	lib := standin.Open(t, standin.ACL, small)
	work := func() {
		d, err := Open(Options{Library: lib.Path()})
		require.NoError(t, err)
		base, err := d.Reserve(4*g, 0, 0)
		require.NoError(t, err)
		h, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
		require.NoError(t, err)
		require.NoError(t, d.Map(base, h))
		require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
		require.NoError(t, d.Write(base, []byte("leak?")))
		s, err := d.CreateStream(0)
		require.NoError(t, err)
		buf, err := d.HostAlloc(4096)
		require.NoError(t, err)
		require.NoError(t, d.CopyDtoH(buf[:64], base, s))
		require.NoError(t, d.SyncStream(s))
		require.Equal(t, "leak?", string(buf[:5]))
		x, err := d.Export(h)
		require.NoError(t, err)
		imp, err := d.Import(x, 1)
		require.NoError(t, err)
		require.Equal(t, driver.HandleToken, x.Type)
		require.NoError(t, d.Map(base+driver.Addr(2*g), imp))
		require.NoError(t, d.Unmap(base+driver.Addr(2*g), g))
		require.NoError(t, d.Release(imp))
		require.NoError(t, d.HostFree(buf))
		require.NoError(t, d.DestroyStream(s))
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Close(), "the reservation goes with Close")
		require.Empty(t, lib.Leaks())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "%v before, %v after", before, after)
}
