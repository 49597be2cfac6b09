package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// page is the tests' page size on the host driver: small, so that a few
// tokens cross pages.
const page = 64 * units.KiB

// env is a driver with its address space and physical memory.
type env struct {
	drv   driver.Driver
	space *vaspace.Space
	mem   *physical.Memory
}

// hostEnv is a host driver of one device of capacity bytes and 64 KiB
// granularity.
func hostEnv(t testing.TB, capacity uint64) *env {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 1, Capacity: capacity, Granularity: page})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// simEnv is a sim driver of one device of capacity bytes and granularity
// gran (0: 2 MiB).
func simEnv(t testing.TB, capacity, gran uint64) *env {
	t.Helper()
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: gran})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return &env{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
}

// tinyConfig is the tiny preset (4 layers x 8 KV heads x 64, float32: a
// row of 2 KiB, 32 tokens a page per region in PerLayer, 4 tokens a page
// in TokenMajor) with 64 KiB pages.
func tinyConfig(layout Layout, maxCtx, maxSeqs int) Config {
	cfg, err := Preset("tiny")
	if err != nil {
		panic(err)
	}
	cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize, cfg.Layout = maxCtx, maxSeqs, page, layout
	cfg.MapAhead = -1 // tests of mapping ahead turn it on
	return cfg
}

func (e *env) cache(t testing.TB, cfg Config) *Cache {
	t.Helper()
	c, err := New(e.space, e.mem, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// used is the memory committed on device 0.
func (e *env) used(t testing.TB) uint64 {
	u, err := e.mem.Usage(0)
	require.NoError(t, err)
	return u.Used
}

// value is what the tests write as element (h, d) of the key (kv 0) or
// value (kv 1) of layer l at a position whose prefix (tokens up to and
// including it, under extra) hashes to prefix: the same prefix gives the
// same keys and values, as a real model's would. Small integers, exact in
// float32.
func value(prefix uint64, l, kv, h, d int) float32 {
	x := prefix ^ uint64(l*1_000_003+kv*7_919+h*131+d)*0x9e3779b97f4a7c15
	x ^= x >> 29
	return float32(x % 4099)
}

// prefixes returns, for every position of tokens, a hash of tokens up to
// it under extra.
func prefixes(tokens []int, extra uint64) []uint64 {
	out := make([]uint64, len(tokens))
	h := extra*0x100000001b3 + 1469598103934665603
	for i, t := range tokens {
		h = (h ^ uint64(t+1)) * 0x100000001b3
		out[i] = h
	}
	return out
}

// writeStep writes, through step's views, the keys and values of the
// positions it covers; all is the sequence's tokens (at least through the
// step's end).
func writeStep(t testing.TB, step Step, all []int, extra uint64) {
	t.Helper()
	pre := prefixes(all, extra)
	covered := 0
	for l, runs := range step.Layers {
		for _, r := range runs {
			for kv, ten := range []*tensor.Tensor{r.K, r.V} {
				sh := ten.Shape()
				for p := r.Pos; p < r.Pos+sh[0]; p++ {
					// A position at a time: the Contiguous layout's rows
					// are a token's bytes apart.
					row, err := ten.Narrow(0, p-r.Pos, 1)
					require.NoError(t, err)
					data, err := tensor.Data[float32](row)
					require.NoError(t, err)
					i := 0
					for h := 0; h < sh[1]; h++ {
						for d := 0; d < sh[2]; d++ {
							data[i] = value(pre[p], l, kv, h, d)
							i++
						}
					}
				}
			}
			if l == 0 {
				covered += r.K.Shape()[0]
			}
		}
	}
	if step.Layers != nil {
		require.Equal(t, step.N, covered, "the runs cover the step")
	}
}

// checkSeq reads every layer's K and V of s and compares each element of
// positions [from, to) with what writeStep wrote for tokens.
func checkSeq(t testing.TB, s *Seq, tokens []int, extra uint64, from, to int) {
	t.Helper()
	pre := prefixes(tokens, extra)
	layers := s.c.cfg.Layers
	for l := 0; l < layers; l++ {
		for kv, get := range []func(int) (*tensor.Tensor, error){s.K, s.V} {
			ten, err := get(l)
			require.NoError(t, err)
			require.NoError(t, ten.Check())
			sh := ten.Shape()
			rowAt := func(p int) []float32 {
				var row *tensor.Tensor
				if len(sh) == 3 {
					row, err = ten.Narrow(0, p, 1)
				} else {
					row, err = ten.Narrow(0, p/sh[1], 1)
					require.NoError(t, err)
					row, err = row.Narrow(1, p%sh[1], 1)
				}
				require.NoError(t, err)
				data, err := tensor.Data[float32](row)
				require.NoError(t, err)
				return data
			}
			for p := from; p < to; p++ {
				data := rowAt(p)
				heads, dim := s.c.cfg.KVHeads, s.c.cfg.HeadDim
				for h := 0; h < heads; h++ {
					for d := 0; d < dim; d++ {
						if got, want := data[h*dim+d], value(pre[p], l, kv, h, d); got != want {
							require.Equal(t, want, got, "layer %d %s position %d head %d dim %d", l, [2]string{"K", "V"}[kv], p, h, d)
						}
					}
				}
			}
		}
	}
}

// firstAddr is the device address of layer l's K element 0 of s.
func firstAddr(t testing.TB, s *Seq, l int) driver.Addr {
	t.Helper()
	k, err := s.K(l)
	require.NoError(t, err)
	return k.Addr() + driver.Addr(k.Offset()*k.DType().Size())
}

// bounded runs call, a wait that must end (what names it for a reader),
// and returns what it returns. It sets no clock of its own: a loaded
// machine is slow, not broken, and a call that never returns is bounded
// by go test's -timeout, which fails the binary with every goroutine's
// stack.
func bounded[T any](t testing.TB, what string, call func() T) T {
	t.Helper()
	_ = what
	return call()
}

// waitMapperIdle waits until the mapper has nothing to do (tests: bound
// the wait).
func (c *Cache) waitMapperIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if _, pending := c.findJobLocked(); !pending && c.inflight == 0 {
			return
		}
		c.wakeMapper()
		c.cond.Wait()
	}
}
