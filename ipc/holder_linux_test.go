package ipc

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
)

// TestReleaseImportByHandRefused: an import a connection sent is the
// connection's to release. pool.ReleaseImport of it by hand is refused
// (ErrBusy, naming the connection and the calls that release it), and
// changes nothing: the connection still counts the peer's hold, the pool
// still refuses to free the pointer. Once the peer frees it and the
// release comes, the holds are gone, and closing everything leaves no
// descriptor open (the pidfd of the peer included). (Before, the by-hand
// release went through: the pool could free, and hand to a new
// allocation, memory the peer still mapped, Holds stayed at 1, the peer's
// own release was then refused, and the pidfd of the peer stayed open for
// the life of the process.)
func TestReleaseImportByHandRefused(t *testing.T) {
	before := fdCount()
	func() {
		p, err := newProc()
		require.NoError(t, err)
		defer p.close()
		l := listen(t)
		defer l.Close()
		tx, err := Dial(l.Path())
		require.NoError(t, err)
		defer tx.Close()
		rx, err := l.Accept()
		require.NoError(t, err)
		defer rx.Close()
		pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
		require.NoError(t, err)
		s, err := stream.New(p.drv, 0)
		require.NoError(t, err)
		defer s.Destroy()
		ptr, err := pl.MallocAsync(64, s)
		require.NoError(t, err)
		ep, err := ExportPool(pl, os.Getpid())
		require.NoError(t, err)
		require.NoError(t, rx.SendPool(ep))
		ip, err := tx.RecvPool(p.space, p.mem, 0)
		require.NoError(t, err)
		require.NoError(t, rx.SendPointer(ep, ptr))
		got, err := tx.RecvPointer(ip)
		require.NoError(t, err)
		require.Equal(t, 1, rx.Holds())

		err = pl.ReleaseImport(ptr)
		drivertest.RequireIs(t, err, driver.ErrBusy, "kept by their holders",
			fmt.Sprintf("1 by the ipc connection to process %d on %s", os.Getpid(), l.Path()))
		require.Contains(t, fmt.Sprintf("%+v", err), "RecvRelease", "the hint names the calls that release it")
		require.Equal(t, 1, rx.Holds(), "the refusal changes nothing")
		drivertest.RequireIs(t, pl.FreeAsync(ptr, s), driver.ErrBusy, "have not released it", "kept: 1 by the ipc connection")
		require.NoError(t, pl.Check())
		// Another holder cannot release it either, nor can a nil one.
		drivertest.RequireIs(t, pl.ReleaseImportFor(pool.NewImportHolder("someone else"), ptr), driver.ErrNotAllocated, "someone else", "keeps none")
		drivertest.RequireIs(t, pl.ReleaseImportFor(nil, ptr), driver.ErrInvalid, "holder is nil")
		_, err = pl.ExportPointerFor(nil, ptr)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "holder is nil")
		require.Equal(t, 1, rx.Holds())

		// The peer frees: the release comes, and the connection's hold
		// goes with the pool's import.
		require.NoError(t, ip.Free(got))
		released, err := rx.RecvRelease(ep)
		require.NoError(t, err)
		require.Equal(t, ptr, released)
		require.Zero(t, rx.Holds())
		drivertest.RequireIs(t, pl.ReleaseImport(ptr), driver.ErrNotAllocated, "no process imported it")
		require.NoError(t, ip.Close())
		require.NoError(t, pl.FreeAsync(ptr, s))
		require.NoError(t, s.Synchronize())
		require.NoError(t, pl.Destroy())
		require.NoError(t, pl.Check())
	}()
	require.Equal(t, before, fdCount(), "every descriptor is closed: sockets, memfds, pidfds")
}

// TestImportedPoolKeepsItsReservation: the reservation an imported pool
// maps into is the pool's: freeing it through the Space, or closing the
// Space, is refused (ErrBusy, naming the owner) and changes nothing; the
// pool's Close frees it.
func TestImportedPoolKeepsItsReservation(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	defer pl.Destroy()
	ep, err := ExportPool(pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	var kept []string
	for _, r := range p.space.Reservations() {
		kept = append(kept, r.KeptBy())
		if r.Range() == ip.res.Range() {
			drivertest.RequireIs(t, r.Free(), driver.ErrBusy, "kept by an imported pool")
		}
	}
	require.ElementsMatch(t, []string{"", "an arena range", "an imported pool"}, kept, "the test's own, the exporting pool's, the imported pool's")
	drivertest.RequireIs(t, p.space.Close(), driver.ErrBusy, "kept by an imported pool", "kept by an arena range")
	require.False(t, ip.res.Freed())
	require.NoError(t, ip.Check())
	require.NoError(t, ip.Close())
	require.True(t, ip.res.Freed())
}
