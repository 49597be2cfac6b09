package kvevents

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// TestOffsetEndpoint: the endpoints of a data-parallel rank, as vLLM's
// ZmqEventPublisher.offset_endpoint_port gives them (tcp: the port plus
// the rank; ipc: the path with _dpRANK appended; rank 0: unchanged), and
// the two places this publisher differs: port 0 stays 0, a port past
// 65535 is an error where vLLM's older code would bind it modulo nothing.
func TestOffsetEndpoint(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://127.0.0.1:5557", 1, "tcp://127.0.0.1:5558"},
		{"tcp://[::1]:5557", 3, "tcp://[::1]:5560"},
		{"tcp://localhost:5557", 1, "tcp://localhost:5558"},
		{"tcp://127.0.0.1:0", 5, "tcp://127.0.0.1:0"},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv"},
		{"ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2"},
		{"ipc://@kv", 1, "ipc://@kv_dp1"},
	} {
		got, err := OffsetEndpoint(c.ep, c.rank)
		require.NoError(t, err, "%s rank %d", c.ep, c.rank)
		require.Equal(t, c.want, got, "%s rank %d", c.ep, c.rank)
	}
	for _, c := range []struct {
		ep   string
		rank int
		says string
	}{
		{"tcp://*:65535", 1, "past 65535"},
		{"tcp://*:5557", -1, "want 0 or more"},
		{"inproc://kv", 1, "same process"},
		{"ipc://" + "/" + string(make([]byte, maxIPCPath-4)), 100, "holds at most"},
	} {
		_, err := OffsetEndpoint(c.ep, c.rank)
		require.ErrorIs(t, err, driver.ErrInvalid, "%s rank %d", c.ep, c.rank)
		require.Contains(t, err.Error(), c.says)
	}
}

// TestIPCEndpoints: a publisher on ipc:// endpoints (offset by its
// rank) serves a subscriber and a replay client over Unix sockets, and
// Close removes both socket files; a socket file left by a listener
// gone is taken over, one a live publisher listens on is ErrBusy, and a
// path that is not a socket is ErrInvalid and left as it was.
func TestIPCEndpoints(t *testing.T) {
	dir := shortDir(t)
	goroutines := runtime.NumGoroutine()
	one := 1
	serve := func() {
		p, err := New(Options{Endpoint: "ipc://" + filepath.Join(dir, "pub"), ReplayEndpoint: "ipc://" + filepath.Join(dir, "replay"), Rank: &one})
		require.NoError(t, err)
		require.Equal(t, "ipc://"+filepath.Join(dir, "pub_dp1"), p.Endpoint())
		require.Equal(t, "ipc://"+filepath.Join(dir, "replay_dp1"), p.ReplayEndpoint())
		sub := zmq4.NewSub(context.Background())
		require.NoError(t, sub.Dial(p.Endpoint()))
		require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
		for p.Stats().Subscribers == 0 {
			time.Sleep(time.Millisecond)
		}
		for i := range 3 {
			p.Publish(makeBatch(i, 0))
		}
		for i := range 3 {
			m, err := sub.Recv()
			require.NoError(t, err)
			require.Len(t, m.Frames, 3)
			require.Equal(t, seq8(int64(i)), m.Frames[1])
			require.NoError(t, checkPayload(m.Frames[2], i, 0, &one, Array))
		}
		d := zmq4.NewDealer(context.Background())
		require.NoError(t, d.Dial(p.ReplayEndpoint()))
		require.Equal(t, []int64{1, 2}, replayFrom(t, d, nil, seq8(1)))

		// A second publisher on the same paths: busy, nothing changed.
		_, err = New(Options{Endpoint: p.Endpoint()})
		require.ErrorIs(t, err, driver.ErrBusy)
		_, err = New(Options{Endpoint: "ipc://" + filepath.Join(dir, "other"), ReplayEndpoint: p.ReplayEndpoint()})
		require.ErrorIs(t, err, driver.ErrBusy)
		require.NoFileExists(t, filepath.Join(dir, "other"), "the PUB socket of a refused publisher is closed")
		require.Equal(t, 3, p.Stats().Batches)

		require.NoError(t, d.Close())
		require.NoError(t, sub.Close())
		require.NoError(t, p.Close())
		require.NoFileExists(t, filepath.Join(dir, "pub_dp1"))
		require.NoFileExists(t, filepath.Join(dir, "replay_dp1"))
	}
	before, after, same, err := leakcheck.Compare(3, serve)
	require.NoError(t, err)
	require.True(t, same, "before %s, after %s", before, after)
	for runtime.NumGoroutine() > goroutines {
		time.Sleep(time.Millisecond)
	}

	// A stale socket file (its listener closed without removing it) is
	// taken over.
	stale := filepath.Join(dir, "stale")
	ln, err := net.Listen("unix", stale)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	require.FileExists(t, stale)
	q, err := New(Options{Endpoint: "ipc://" + stale})
	require.NoError(t, err)
	require.NoError(t, q.Close())
	require.NoFileExists(t, stale)

	// A file that is not a socket is left alone.
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(plain, []byte("keep me"), 0o600))
	_, err = New(Options{Endpoint: "ipc://" + plain})
	require.ErrorIs(t, err, driver.ErrInvalid)
	b, err := os.ReadFile(plain)
	require.NoError(t, err)
	require.Equal(t, "keep me", string(b))
}

// shortDir is a directory for Unix sockets whose paths fit: t.TempDir
// under a long TMPDIR may not.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvev")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
