package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/errors"
)

// TestNotLiveNamesTheCall: Free, Size, Bytes and Export of an address
// that is not a live allocation's start (freed, inside one, foreign)
// are ErrNotAllocated, and each error and its hints name the call that
// was made, never another.
func TestNotLiveNamesTheCall(t *testing.T) {
	e := newEnv(t, 16*g)
	al := e.fine(t, 12*g, PolicyDefault)
	small, err := al.Alloc(1000, 0) // in a bin
	require.NoError(t, err)
	big, err := al.Alloc(3*g, 0) // a block of its own
	require.NoError(t, err)
	freed, err := al.Alloc(100, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(freed))
	defer func() {
		require.NoError(t, al.Free(small))
		require.NoError(t, al.Free(big))
	}()
	calls := map[string]func(driver.Addr) error{
		"free": al.Free,
		"size": func(p driver.Addr) error { _, err := al.Size(p); return err },
		"bytes": func(p driver.Addr) error {
			_, err := al.Bytes(p)
			return err
		},
		"export": func(p driver.Addr) error { _, err := al.Export(p); return err },
	}
	for op, call := range calls {
		for what, c := range map[string]struct {
			p        driver.Addr
			mentions string
		}{
			"freed":               {freed, "that memory is free"},
			"inside a bin's slot": {small + 256, "inside the allocation at " + small.String()},
			"inside a block":      {big + driver.Addr(g), "inside the allocation at " + big.String()},
			"foreign":             {0x1000, "not in this allocator's memory"},
		} {
			err := call(c.p)
			drivertest.RequireIs(t, err, driver.ErrNotAllocated, "arena: "+op+" "+c.p.String(), c.mentions)
			msg := err.Error() + "\n" + errors.FlattenHints(err)
			for _, other := range []string{"free", "size", "bytes", "export"} {
				if other != op {
					require.NotContains(t, msg, "arena: "+other+" ", "%s of %s (%s)", op, c.p, what)
					require.NotContains(t, msg, other+" takes its start", "%s of %s (%s)", op, c.p, what)
				}
			}
			if op != "free" {
				require.NotContains(t, msg, "freed twice", "%s of %s (%s)", op, c.p, what)
				require.NotContains(t, msg, "free each allocation once", "%s of %s (%s)", op, c.p, what)
			}
		}
	}
}
