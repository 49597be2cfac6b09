package kvcache

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// rowPattern is the bytes a test writes at layer l's K (kv 0) or V (kv
// 1) row of position p: n bytes, each naming (l, kv, p).
func rowPattern(l, kv, p, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(l)<<48|uint64(kv)<<40|uint64(p)<<8|uint64(i/8%256))
	}
	return b
}

// rowAt is position p's row of a K or V tensor as Append or K hands it
// out: [n, heads, dim] (PerLayer, Contiguous, a TokenMajor group's run)
// or [groups, tpg, heads, dim] (K in TokenMajor), from position from.
func rowAt(t *testing.T, x *tensor.Tensor, p, from, tpg int) *tensor.Tensor {
	t.Helper()
	var err error
	if x.Dims() == 4 {
		x, err = x.Narrow(0, p/tpg, 1)
		require.NoError(t, err)
		x, err = x.Narrow(1, p%tpg, 1)
	} else {
		x, err = x.Narrow(0, p-from, 1)
	}
	require.NoError(t, err)
	return x
}

// TestDeviceTensorsOnEveryDriver: on the CUDA and AscendCL drivers over
// their stand-ins, whose memory the process does not address, Append's
// rows, K and V, and UnitBytes are device tensors (an address and a
// length, no bytes), in every layout; on the host driver they are host
// tensors over the same addresses. Bytes written at a row's address
// (the driver's Write, as a kernel's store) read back at the same
// position of K and V, and lie in the unit's extent UnitBytes hands out
// at the offset the row's address says. A sharer's shared rows and units
// refuse a write access (ErrAccessDenied) and change nothing; the sim
// driver's refusal is ErrUnsupported, with nothing changed.
func TestDeviceTensorsOnEveryDriver(t *testing.T) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		for _, layout := range []Layout{PerLayer, TokenMajor, Contiguous} {
			t.Run(layout.String(), func(t *testing.T) {
				drv := b.Open(t, testdrivers.Machine{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
				c, err := New(vaspace.New(drv), physical.New(drv), microConfig(layout, 4096, 2))
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close() })
				checkDeviceTensors(t, b.Name, drv, c)
				require.NoError(t, c.Close())
			})
		}
	})
}

func checkDeviceTensors(t *testing.T, backend string, drv testdrivers.Driver, c *Cache) {
	cfg, g := c.Config(), c.g
	host := backend == "host"
	rowBytes := cfg.KVHeads * cfg.HeadDim * cfg.DType.Size()
	unit := g.tpg // tokens a unit holds
	if g.layout != TokenMajor {
		unit = int(g.page / g.stride)
	}
	prompt := seqTokens(2*unit+5, 2*unit+5, 0)
	a, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	step, err := a.Append(prompt)
	require.NoError(t, err)
	require.Len(t, step.Layers, cfg.Layers)
	// Write every row at its address, through a write hold on its tensor.
	for l, runs := range step.Layers {
		for _, r := range runs {
			for kv, x := range [2]*tensor.Tensor{r.K, r.V} {
				require.Equal(t, host, x.Addressable(), "layer %d's rows at %d: a host tensor on the host driver alone", l, r.Pos)
				for i := range x.Shape()[0] {
					p := r.Pos + i
					require.NoError(t, rowAt(t, x, p, r.Pos, 0).AccessDevice(true, func(addr driver.Addr, n uint64) error {
						require.Equal(t, uint64(rowBytes), n)
						return drv.Write(addr, rowPattern(l, kv, p, rowBytes))
					}))
				}
			}
		}
	}
	require.NoError(t, a.MarkWritten(a.Len()))

	// K and V read them back at every position.
	rowAddr := map[[3]int]driver.Addr{}
	for l := range cfg.Layers {
		for kv, get := range [2]func(int) (*tensor.Tensor, error){a.K, a.V} {
			x, err := get(l)
			require.NoError(t, err)
			require.Equal(t, host, x.Addressable())
			for p := range a.Len() {
				got := make([]byte, rowBytes)
				require.NoError(t, rowAt(t, x, p, 0, g.tpg).AccessDevice(false, func(addr driver.Addr, n uint64) error {
					rowAddr[[3]int{l, kv, p}] = addr
					return drv.Read(addr, got)
				}))
				require.Equal(t, rowPattern(l, kv, p, rowBytes), got, "layer %d's %s at %d", l, [2]string{"K", "V"}[kv], p)
			}
		}
	}

	// Each unit's extents hold its positions' rows where their addresses
	// say.
	for u := range c.UnitsFor(a.Len()) {
		xs, err := a.UnitBytes(u)
		require.NoError(t, err)
		type extent struct {
			addr  driver.Addr
			bytes []byte
		}
		var exts []extent
		for _, x := range xs {
			require.Equal(t, host, x.Addressable())
			require.NoError(t, x.AccessDevice(false, func(addr driver.Addr, n uint64) error {
				e := extent{addr, make([]byte, n)}
				exts = append(exts, e)
				return drv.Read(addr, e.bytes)
			}))
		}
		for p := u * unit; p < min((u+1)*unit, a.Len()); p++ {
			for l := range cfg.Layers {
				for kv := range 2 {
					at, found := rowAddr[[3]int{l, kv, p}], false
					for _, e := range exts {
						if at >= e.addr && uint64(at-e.addr)+uint64(rowBytes) <= uint64(len(e.bytes)) {
							off := at - e.addr
							require.Equal(t, rowPattern(l, kv, p, rowBytes), e.bytes[off:off+driver.Addr(rowBytes)], "unit %d, position %d", u, p)
							found = true
						}
					}
					require.True(t, found, "unit %d's extents hold position %d's row of layer %d", u, p, l)
				}
			}
		}
	}

	// A sharer's shared rows refuse a write and change nothing.
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	require.Equal(t, 2*unit, s.Matched())
	_, err = s.Append(prompt[s.Len():])
	require.NoError(t, err)
	before := c.Stats()
	xs, err := s.UnitBytes(0)
	require.NoError(t, err)
	for _, x := range xs {
		drivertest.RequireIs(t, x.AccessDevice(true, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrAccessDenied)
	}
	k, err := s.K(0)
	require.NoError(t, err)
	drivertest.RequireIs(t, rowAt(t, k, 0, 0, g.tpg).AccessDevice(true, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrAccessDenied)
	got := make([]byte, rowBytes)
	require.NoError(t, rowAt(t, k, 0, 0, g.tpg).AccessDevice(false, func(addr driver.Addr, _ uint64) error { return drv.Read(addr, got) }))
	require.Equal(t, rowPattern(0, 0, 0, rowBytes), got, "the sharer reads the owner's row")
	require.Equal(t, before, c.Stats())
	require.NoError(t, c.Check())

	// Freed, its tensors answer ErrClosed.
	row := rowAt(t, k, 0, 0, g.tpg)
	require.NoError(t, s.Free())
	drivertest.RequireIs(t, row.AccessDevice(false, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrClosed)
	require.NoError(t, a.Free())
	require.NoError(t, c.Check())
	require.Zero(t, c.Stats().Running, fmt.Sprintf("%s: every sequence freed", backend))
}
