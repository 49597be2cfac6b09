package transfer_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/transfer"
)

// TestNoLeaks: an engine that registered, connected, served, moved bytes
// and closed leaves no file descriptor, mapping or goroutine behind,
// even when a peer and the registration were left open for Close to
// end.
func TestNoLeaks(t *testing.T) {
	h := mustHostMem(t, 16<<20)
	r, err := newRegion(h.a, 64<<10, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.end()) }()
	goroutines := runtime.NumGoroutine()
	work := func() {
		e, err := transfer.New(transfer.Config{})
		require.NoError(t, err)
		reg, err := e.Register(r.t)
		require.NoError(t, err)
		d, err := reg.Descriptor()
		require.NoError(t, err)
		p, err := e.Connect(context.Background(), e.Addr())
		require.NoError(t, err)
		op := transfer.Op{Local: reg, Remote: d, RemoteOff: 4096, Len: 4096}
		require.NoError(t, p.Put(context.Background(), op))
		require.NoError(t, p.Get(context.Background(), op))
		p2, err := e.Connect(context.Background(), e.Addr()) // left open
		require.NoError(t, err)
		_ = p2
		require.NoError(t, p.Close())
		require.NoError(t, e.Close())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %s, after %s", before, after)
	for runtime.NumGoroutine() > goroutines { // ending ones take their time; a leak hangs to -timeout
		time.Sleep(5 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), goroutines, "every goroutine of the engines ended")
}
