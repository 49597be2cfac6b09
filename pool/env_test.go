package pool

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

const g = 64 * units.KiB // test granularity

// env is a small stack over one driver: two devices of capacity bytes
// each (drivers_test.go lists the drivers).
type env struct {
	drv   testDriver
	space *vaspace.Space
	mem   *physical.Memory
}

// newEnv is an env on the host driver, for the tests that stay host-only.
func newEnv(t testing.TB, capacity uint64) *env {
	t.Helper()
	drv := openHost(t, 2, capacity)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// used is how much of dev's memory is committed.
func (e *env) used(t testing.TB, dev driver.DeviceID) uint64 {
	u, err := e.mem.Usage(dev)
	require.NoError(t, err)
	return u.Used
}

// reserved is the pool's ReservedMemCurrent.
func reserved(t testing.TB, p *Pool) uint64 {
	v, err := p.Attribute(ReservedMemCurrent)
	require.NoError(t, err)
	return v
}

// allocations is how many live allocations the pool's allocator holds.
func allocations(p *Pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return alLive(p.al)
}

// destroyAtEnd registers a cleanup that frees whatever a test left live in
// p (on s), drops the imports it recorded and destroys p: the driver
// refuses to close while the pool's memory is mapped.
func destroyAtEnd(t testing.TB, p *Pool, s *stream.Stream) {
	t.Cleanup(func() {
		p.mu.Lock()
		destroyed := p.destroyed
		var live []driver.Addr
		for ptr := range p.live {
			live = append(live, ptr)
		}
		imports := map[driver.Addr]int{}
		for ptr, n := range p.imports {
			imports[ptr] = n
		}
		p.mu.Unlock()
		if destroyed {
			return
		}
		for ptr, n := range imports {
			for range n {
				assert.NoError(t, p.ReleaseImport(ptr))
			}
		}
		for _, ptr := range live {
			assert.NoError(t, p.FreeAsync(ptr, s))
		}
		if err := p.Destroy(); err != nil && !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("destroying the pool at the end of the test: %v", err)
		}
	})
}
