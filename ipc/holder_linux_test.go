package ipc

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/leakcheck"
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
		sp := sendPointer(t)
		defer sp.p.close()
		defer sp.l.Close()
		defer sp.tx.Close()
		defer sp.rx.Close()
		defer sp.s.Destroy()
		l, rx, pl, s, ptr, ep, ip, got := sp.l, sp.rx, sp.pl, sp.s, sp.ptr, sp.ep, sp.ip, sp.got
		var err error
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

// TestReleaseUnreadAtClose: the exact sequence of a careless exporter.
// A by-hand release of an import is refused; the peer frees its pointer
// (its release is sent) and closes its imported pool and its end; the
// exporter never calls RecvRelease and closes its end. The release was
// already on the exporter's socket: Close reads and applies what the
// peer sent before it closes, so the pool frees the pointer and is
// destroyed, and the process's descriptors and mappings are back where
// they started (the peer's pidfd and the pool's memory files included).
// A forged release among them is refused, in Close's error.
func TestReleaseUnreadAtClose(t *testing.T) {
	before, err := leakcheck.Take()
	require.NoError(t, err)
	func() {
		sp := sendPointer(t)
		defer sp.p.close()
		defer sp.l.Close()
		defer sp.s.Destroy()
		tx, rx, pl, s, ptr, ip, got := sp.tx, sp.rx, sp.pl, sp.s, sp.ptr, sp.ip, sp.got
		drivertest.RequireIs(t, pl.ReleaseImport(ptr), driver.ErrBusy, "kept by their holders")

		// A forged release of an offset never sent comes first: Close
		// refuses it, says so, and still applies the true one after it.
		require.NoError(t, tx.send(KindRelease, 0, u64s(ip.id, 3*chunkSize)))
		require.NoError(t, ip.Free(got))
		require.NoError(t, ip.Close())
		require.NoError(t, tx.Close())
		drivertest.RequireIs(t, rx.Close(), driver.ErrNotAllocated, "holds no import of it")
		require.Zero(t, rx.Holds(), "the release the peer sent is applied at Close")
		drivertest.RequireIs(t, rx.Close(), driver.ErrClosed)
		require.NoError(t, pl.FreeAsync(ptr, s))
		require.NoError(t, s.Synchronize())
		require.NoError(t, pl.Destroy())
		require.NoError(t, pl.Check())
	}()
	after, err := leakcheck.Take()
	require.NoError(t, err)
	require.Equal(t, before.FDs, after.FDs, "descriptors: %s, then %s", before, after)
	require.Equal(t, before.VmarenaMaps, after.VmarenaMaps, "memfd mappings: %s, then %s", before, after)
}

// sentPointer is a pool pointer exported over a connection to this very
// process and imported there: what the tests of imports' holders start
// from. The test closes what it needs closed.
type sentPointer struct {
	p      *proc
	l      *Listener
	tx, rx *Conn // the importer's end, the exporter's
	pl     *pool.Pool
	s      *stream.Stream
	ptr    driver.Addr // in pl
	ep     *ExportedPool
	ip     *ImportedPool
	got    driver.Addr // ptr, imported into ip
}

func sendPointer(t *testing.T) *sentPointer {
	t.Helper()
	var sp sentPointer
	var err error
	sp.p, err = newProc()
	require.NoError(t, err)
	sp.l = listen(t)
	sp.tx, err = Dial(sp.l.Path())
	require.NoError(t, err)
	sp.rx, err = sp.l.Accept()
	require.NoError(t, err)
	sp.pl, err = pool.New(sp.p.space, sp.p.mem, pool.Props{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	sp.s, err = stream.New(sp.p.drv, 0)
	require.NoError(t, err)
	sp.ptr, err = sp.pl.MallocAsync(64, sp.s)
	require.NoError(t, err)
	sp.ep, err = ExportPool(sp.pl, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, sp.rx.SendPool(sp.ep))
	sp.ip, err = sp.tx.RecvPool(sp.p.space, sp.p.mem, 0)
	require.NoError(t, err)
	require.NoError(t, sp.rx.SendPointer(sp.ep, sp.ptr))
	sp.got, err = sp.tx.RecvPointer(sp.ip)
	require.NoError(t, err)
	return &sp
}

// TestCloseReadsABoundedQueue: a peer that floods its end with forged
// releases cannot keep Close reading: Close reads at most one message per
// import held plus maxQueuedOther, reports the refusals, and leaves the
// import held (the true release queued behind the flood is not reached).
func TestCloseReadsABoundedQueue(t *testing.T) {
	sp := sendPointer(t)
	defer sp.p.close()
	defer sp.l.Close()
	defer sp.s.Destroy()
	for range 2 * maxQueuedOther {
		require.NoError(t, sp.tx.send(KindRelease, 0, u64s(sp.ip.id, 3*chunkSize)))
	}
	require.NoError(t, sp.ip.Free(sp.got))
	require.NoError(t, sp.ip.Close())
	require.NoError(t, sp.tx.Close())
	drivertest.RequireIs(t, sp.rx.Close(), driver.ErrNotAllocated, "holds no import of it")
	require.Equal(t, 1, sp.rx.Holds(), "the release behind the flood is not read")

	// The peer is this process, which lives on: release its hold by hand
	// so that the pool goes and the pidfd closes.
	require.NoError(t, sp.pl.ReleaseImportFor(sp.rx.holder, sp.ptr))
	sp.rx.mu.Lock()
	sp.rx.holds = nil
	sp.rx.mu.Unlock()
	sp.rx.dropPeerIfDone()
	require.NoError(t, sp.pl.FreeAsync(sp.ptr, sp.s))
	require.NoError(t, sp.s.Synchronize())
	require.NoError(t, sp.pl.Destroy())
}
