package ipc

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag, ipc's locks are in the
// library's order (internal/lockrank): a connection's lock taken while an
// exported pool's is held, or an imported pool's receive order while its
// lock is held, is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var c Conn
	var ep ExportedPool
	var ip ImportedPool
	require.Regexp(t, `IPCConn .* while holding IPCExportedPool`, lockrank.Violation(&ep.mu, &c.mu))
	require.Regexp(t, `IPCReceive .* while holding IPCImportedPool`, lockrank.Violation(&ip.mu, &ip.recv))
}

// TestStalledExporterStopsNoCall: a RecvPointer waiting for an exporter
// that sends nothing holds no lock the imported pool's other calls take:
// Chunks, Check, Free and Close of the pool answer meanwhile (they all
// waited for the peer once), and the receive, its connection closed,
// ends with ErrClosed. Descriptors and mappings are back where they
// started.
func TestStalledExporterStopsNoCall(t *testing.T) {
	before, err := leakcheck.Take()
	require.NoError(t, err)
	func() {
		sp := sendPointer(t)
		defer sp.p.close()
		defer sp.l.Close()
		defer sp.s.Destroy()
		waiting := make(chan struct{})
		var once sync.Once
		recvWaiting = func() { once.Do(func() { close(waiting) }) }
		defer func() { recvWaiting = nil }()
		recvd := make(chan error, 1)
		go func() {
			_, err := sp.tx.RecvPointer(sp.ip)
			recvd <- err
		}()
		<-waiting // the receive waits for the peer, which sends nothing
		require.Len(t, sp.ip.Chunks(), 1)
		require.NoError(t, sp.ip.Check())
		require.NoError(t, sp.ip.Free(sp.got))
		require.NoError(t, sp.ip.Close())
		require.NoError(t, sp.tx.Close())
		drivertest.RequireIs(t, <-recvd, driver.ErrClosed)
		require.NoError(t, sp.rx.Close(), "the release the peer sent is applied at Close")
		require.Zero(t, sp.rx.Holds())
		require.NoError(t, sp.pl.FreeAsync(sp.ptr, sp.s))
		require.NoError(t, sp.s.Synchronize())
		require.NoError(t, sp.pl.Destroy())
	}()
	after, err := leakcheck.Take()
	require.NoError(t, err)
	require.Equal(t, before.FDs, after.FDs, "descriptors: %s, then %s", before, after)
	require.Equal(t, before.VmarenaMaps, after.VmarenaMaps, "memfd mappings: %s, then %s", before, after)
}
