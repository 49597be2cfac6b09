package apitest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// tagged is a wrapper driver a caller might write: a struct value that
// holds a slice, so == cannot compare two of them (it panics).
type tagged struct {
	*host.Driver
	tags []string
}

// TestUncomparableDriverRefused: every constructor that takes an address
// space and a physical memory checks that both are on one driver. Six of
// them compared the drivers with ==, which panics on a wrapper driver of a
// type == cannot compare; they answer ErrInvalid naming the type, and the
// driver is left as it was.
func TestUncomparableDriverRefused(t *testing.T) {
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	var d driver.Driver = tagged{Driver: drv, tags: []string{"a"}}
	space, mem := vaspace.New(d), physical.New(d)
	res, err := space.Reserve(4<<20, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, res.Free()) })

	used := drv.Used(0)
	kv := kvcache.Config{Layers: 1, KVHeads: 1, HeadDim: 8, DType: tensor.Float16, MaxSeqs: 1, MaxContext: 64}
	calls := map[string]func() error{
		"arena.New":       func() error { _, err := arena.New(space, mem, arena.Options{Max: 4 << 20}); return err },
		"arena.NewSparse": func() error { _, err := arena.NewSparse(space, mem, arena.SparseOptions{Max: 4 << 20}); return err },
		"arena.NewAllocator": func() error {
			_, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Max: 4 << 20})
			return err
		},
		"mapping.New":  func() error { _, err := mapping.New(res, mem); return err },
		"multidev.New": func() error { _, err := multidev.New(space, mem, multidev.Options{Max: 4 << 20}); return err },
		"kvcache.New":  func() error { _, err := kvcache.New(space, mem, kv); return err },
		"pool.New":     func() error { _, err := pool.New(space, mem, pool.Props{}); return err },
	}
	for name, call := range calls {
		var err error
		require.NotPanicsf(t, func() { err = call() }, "%s panicked", name)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not comparable")
		require.Equal(t, used, drv.Used(0), name)
		require.NoError(t, drv.Check(), name)
	}
}
