package disagg

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/testdrivers"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/transfer"
)

// deviceMachine is the device tests' stand-in machine: n devices of 64
// MiB, pages of 4 KiB.
func deviceMachine(n int) testdrivers.Machine {
	return testdrivers.Machine{Devices: n, Capacity: 64 * units.MiB, Granularity: page}
}

// deviceStaging is the staging of the device tests' engines: 4 KiB in
// two halves, so that every unit extent (a page, 4 KiB) moves in pieces.
func deviceStaging(d driver.Driver, dev driver.DeviceID) transfer.Staging {
	return transfer.Staging{Driver: d, Device: dev, Size: 4096}
}

// TestDeviceMatchesOneProcess: both caches in device memory the process
// does not address — the CUDA and AscendCL drivers over their stand-ins,
// the prefill cache on device 0 and the decode cache on device 1 — and
// the sides joined by two tcp engines, each staging through one pinned
// buffer on its cache's device. The model (on the host) reaches the rows
// through the driver's copies; the units move device to device over the
// wire. The tokens and logits are one process's, bit for bit; the units
// the decode cache holds are not sent again; the engines move the bytes
// the decode side counts. Local, whose copies need host memory, refuses
// device extents (ErrUnsupported) and leaves both caches as they were.
// The stand-ins hold nothing at the end.
func TestDeviceMatchesOneProcess(t *testing.T) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		if b.Name == "host" {
			t.Skip("the host driver's memory is addressed in place: TestEngineMatchesLocal")
		}
		for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
			t.Run(layout.String(), func(t *testing.T) {
				drv := b.Open(t, deviceMachine(2))
				deviceSides(t, drv, layout)
			})
		}
	})
}

func deviceSides(t *testing.T, drv driver.Driver, layout kvcache.Layout) {
	ctx := context.Background()
	s := newSidesOn(t, drv, layout, 256, 4)
	rng := rand.New(rand.NewPCG(11, uint64(layout)))
	prompts := sharingPrompts(rng, layout)

	// Local cannot copy device memory: refused, nothing held after.
	h, err := s.prefill.Prefill(prompts[0], 0)
	require.NoError(t, err)
	dstats := s.dc.Stats()
	_, err = s.decode.Decode(ctx, s.prefill, h, 2)
	drivertest.RequireIs(t, err, driver.ErrUnsupported)
	require.Equal(t, dstats.Running, s.dc.Stats().Running, "the decode cache holds no new sequence")
	require.Zero(t, s.prefill.Stats().Held, "the prefill side let the request go")
	require.Zero(t, s.link.Stats().Live)
	require.NoError(t, s.dc.Check())
	require.NoError(t, s.pc.Check())
	require.NoError(t, s.prefill.Close())

	pe, err := transfer.New(transfer.Config{Staging: deviceStaging(drv, 0)})
	require.NoError(t, err)
	defer func() { require.NoError(t, pe.Close()) }()
	de, err := transfer.New(transfer.Config{Staging: deviceStaging(drv, 1)})
	require.NoError(t, err)
	defer func() { require.NoError(t, de.Close()) }()
	peer, err := de.Connect(ctx, pe.Addr())
	require.NoError(t, err)
	defer func() { require.NoError(t, peer.Close()) }()
	s.prefill, err = NewPrefill(s.pc, s.model, EngineExporter(pe))
	require.NoError(t, err)
	s.decode, err = NewDecode(s.dc, s.model, EngineFetcher(de, peer))
	require.NoError(t, err)

	prefill := func(p []int) (Handoff, error) { return s.prefill.Prefill(p, 0) }
	total := s.decodeAll(t, layout, prompts, prefill, s.prefill, s.decode)
	require.Positive(t, total)
	require.Equal(t, total, de.Stats().BytesIn, "the decode engine took the bytes the decode side counted")
	require.Equal(t, total, pe.Stats().BytesOut)
	require.NoError(t, s.prefill.Close())
	for _, c := range []*kvcache.Cache{s.pc, s.dc} {
		require.NoError(t, c.Check())
		require.NoError(t, c.Close())
	}
}
