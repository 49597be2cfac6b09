package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestImportHolder: imports counted for a holder (ExportPointerFor) are
// released only by that holder; the caller's own imports (ExportPointer)
// by ReleaseImport, which refuses the holder's, naming it, and changes
// nothing. FreeAsync waits for both kinds.
func TestImportHolder(t *testing.T) {
	pe := newPoolEnv(t, Props{Shareable: true, MaxSize: 8 * g}, true, true, true)
	a, err := pe.p.MallocAsync(100, pe.a)
	require.NoError(t, err)
	h := NewImportHolder("the test's peer")
	other := NewImportHolder("another peer")
	require.Equal(t, "the test's peer", h.String())
	require.Equal(t, "nobody", (*ImportHolder)(nil).String())

	_, err = pe.p.ExportPointerFor(h, a)
	require.NoError(t, err)
	_, err = pe.p.ExportPointer(a)
	require.NoError(t, err)
	drivertest.RequireIs(t, pe.p.FreeAsync(a, pe.a), driver.ErrBusy, "2 other process(es)", "kept: 1 by the test's peer")
	require.NoError(t, pe.p.ReleaseImport(a), "the caller's own import")

	counts := func() (int, int) {
		pe.p.mu.Lock()
		defer pe.p.mu.Unlock()
		return pe.p.imports[a], pe.p.held[a][h]
	}
	before1, before2 := counts()
	drivertest.RequireIs(t, pe.p.ReleaseImport(a), driver.ErrBusy, "its 1 import(s) are kept by their holders (1 by the test's peer)")
	drivertest.RequireIs(t, pe.p.ReleaseImportFor(other, a), driver.ErrNotAllocated, "another peer", "keeps none")
	drivertest.RequireIs(t, pe.p.ReleaseImportFor(nil, a), driver.ErrInvalid, "the holder is nil")
	_, err = pe.p.ExportPointerFor(nil, a)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the holder is nil")
	after1, after2 := counts()
	require.Equal(t, []int{before1, before2}, []int{after1, after2}, "refusals change nothing")
	require.NoError(t, pe.p.Check())
	drivertest.RequireIs(t, pe.p.FreeAsync(a, pe.a), driver.ErrBusy, "1 other process(es)")

	require.NoError(t, pe.p.ReleaseImportFor(h, a))
	drivertest.RequireIs(t, pe.p.ReleaseImportFor(h, a), driver.ErrNotAllocated, "no process imported it")
	require.NoError(t, pe.p.Check())
	require.NoError(t, pe.p.FreeAsync(a, pe.a))
	require.NoError(t, pe.a.Synchronize())
}
