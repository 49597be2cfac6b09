package apitest

import (
	stderrors "errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/ipc"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/replay"
	"github.com/vmarena/vmarena/serving"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// TestSentinelsSeenByBothIs: failing calls of every package that returns
// sentinels, each error tested with the standard library's errors.Is and
// internal/errors': both must find the one sentinel of every call.
func TestSentinelsSeenByBothIs(t *testing.T) {
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	space, mem := vaspace.New(drv), physical.New(drv)
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Max: 16 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, al.Close()) })
	sd, err := sim.New(sim.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sd.Close() })

	sock := filepath.Join(t.TempDir(), "s")
	l, err := ipc.Listen(sock, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	client, err := ipc.Dial(sock)
	require.NoError(t, err)
	server, err := l.Accept()
	require.NoError(t, err)
	require.NoError(t, server.Close())
	t.Cleanup(func() { _ = client.Close() })

	type call struct {
		name string
		want error
		run  func() error
	}
	calls := []call{
		{"tensor.Empty of shape -1", driver.ErrInvalid, func() error { _, err := tensor.Empty(al, tensor.Float32, -1); return err }},
		{"tensor.New on nil", driver.ErrInvalid, func() error { _, err := tensor.New(nil, tensor.Float32, 1); return err }},
		{"host reserve of 1 EiB", driver.ErrOutOfMemory, func() error { _, err := drv.Reserve(1<<60, 0, 0); return err }},
		{"host create over capacity", driver.ErrOutOfMemory, func() error { _, err := drv.Create(0, 1<<30, driver.ChunkOptions{}); return err }},
		{"sim create of size 0", driver.ErrInvalid, func() error { _, err := sd.Create(0, 0, driver.ChunkOptions{}); return err }},
		{"vaspace reserve of 0", driver.ErrInvalid, func() error { _, err := space.Reserve(0, 0); return err }},
		{"physical create on device 9", driver.ErrNoDevice, func() error { _, err := mem.Create(9, 2<<20, driver.ChunkOptions{}); return err }},
		{"mapping.New of no reservation", driver.ErrInvalid, func() error { _, err := mapping.New(nil, mem); return err }},
		{"arena free of a stray pointer", driver.ErrNotAllocated, func() error { return al.Free(12345) }},
		{"multidev.New of no space", driver.ErrInvalid, func() error { _, err := multidev.New(nil, mem, multidev.Options{}); return err }},
		{"pool.New of no space", driver.ErrInvalid, func() error { _, err := pool.New(nil, mem, pool.Props{}); return err }},
		{"stream.New on no driver", driver.ErrInvalid, func() error { _, err := stream.New(nil, 0); return err }},
		{"kvcache.New of an empty config", driver.ErrInvalid, func() error { _, err := kvcache.New(space, mem, kvcache.Config{}); return err }},
		{"metrics of no arena", driver.ErrInvalid, func() error { _, err := metrics.NewArenaCollector("a", nil); return err }},
		{"replay parse of nothing", replay.ErrMalformed, func() error { _, err := replay.Parse(strings.NewReader("")); return err }},
		{"replay granularity 3", driver.ErrInvalid, func() error { return replay.Options{Granularity: 3}.Check() }},
		{"replay random lifetimes of -1 events", driver.ErrInvalid, func() error { return replay.RandomLifetimes{Events: -1}.Check() }},
		{"serving parse of nothing", serving.ErrMalformed, func() error { _, err := serving.ParseAzure(strings.NewReader("")); return err }},
		{"serving config of an empty model", driver.ErrInvalid, func() error { _, err := serving.NewBlockTable(serving.Config{}); return err }},
		{"ipc receive from a closed peer", driver.ErrClosed, func() error { _, err := client.RecvChunk(mem, 0); return err }},
		{"ipc receive on a closed conn", driver.ErrClosed, func() error { _, err := server.RecvChunk(mem, 0); return err }},
	}
	for _, c := range calls {
		err := c.run()
		require.Errorf(t, err, "%s: no error", c.name)
		require.Truef(t, errors.Is(err, c.want), "%s: internal/errors' Is misses %q in %v", c.name, c.want, err)
		require.Truef(t, stderrors.Is(err, c.want), "%s: the standard library's errors.Is misses %q in %v", c.name, c.want, err)
	}
}
