package transfer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/transfer"
)

// processCPU is the CPU time this process has used (both engines run in
// it, so it counts the initiator's and the target's work, and not what
// other processes of a shared machine take).
func processCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkDevicePut: a 4 MiB put between two engines of this process
// over loopback, from a device tensor on the CUDA stand-in's device 0
// into one on its device 1 (both staged), against the same put between
// two host tensors (no staging), alternating, in the same run. The
// stand-in's copies are memcpy, so device÷host is the staging's overhead:
// two more copies of every byte, and a piece at a time instead of one
// write. Reported for the default staging buffer (8 MiB: 4 MiB pieces,
// one per put) and for 1 MiB (512 KiB pieces), in wall time and in the
// process's CPU time.
func BenchmarkDevicePut(b *testing.B) {
	for _, staging := range []uint64{transfer.DefaultStagingSize, units.MiB} {
		b.Run(fmt.Sprintf("staging=%s", units.Bytes(staging)), func(b *testing.B) { benchDevicePut(b, staging) })
	}
}

func benchDevicePut(b *testing.B, staging uint64) {
	cfg := devStandin()
	cfg.Capacity = 256 << 20
	drv, _ := cudatest.Open(b, cfg, cuda.Options{})
	benchDevicePutOn(b, drv, 0, 1, staging)
}

// BenchmarkDevicePutHardware is BenchmarkDevicePut on the machine's
// first GPU (both engines staging through it: a device-to-device put of
// one GPU), with pinned host memory and real DMA copies; it skips where
// the CUDA driver cannot be opened.
func BenchmarkDevicePutHardware(b *testing.B) {
	drv, err := cuda.Open(cuda.Options{})
	if err != nil {
		b.Skipf("no usable GPU on this machine: %v", err)
	}
	defer func() { require.NoError(b, drv.Close()) }()
	for _, staging := range []uint64{transfer.DefaultStagingSize, units.MiB} {
		b.Run(fmt.Sprintf("staging=%s", units.Bytes(staging)), func(b *testing.B) { benchDevicePutOn(b, drv, 0, 0, staging) })
	}
}

func benchDevicePutOn(b *testing.B, drv driver.Driver, dev0, dev1 driver.DeviceID, staging uint64) {
	const size = 4 << 20
	m0, m1 := mustDevMem(b, drv, dev0, 16<<20), mustDevMem(b, drv, dev1, 16<<20)
	e0 := mustEngine(b, transfer.Config{Staging: transfer.Staging{Driver: drv, Device: dev0, Size: staging}})
	e1 := mustEngine(b, transfer.Config{Staging: transfer.Staging{Driver: drv, Device: dev1, Size: staging}})
	rx, _ := mustRegister(b, e0, mustDevTensor(b, m0, size, 1))
	_, dy := mustRegister(b, e1, mustDevTensor(b, m1, size, 2))
	pd := connect(b, e0, e1.Addr())
	defer func() { require.NoError(b, pd.Close()) }()

	h := mustHostMem(b, 64<<20)
	hx, err := newRegion(h.a, size, 1)
	require.NoError(b, err)
	defer func() { require.NoError(b, hx.end()) }()
	hy, err := newRegion(h.a, size, 2)
	require.NoError(b, err)
	defer func() { require.NoError(b, hy.end()) }()
	h0, h1 := mustEngine(b, transfer.Config{}), mustEngine(b, transfer.Config{})
	rhx, _ := mustRegister(b, h0, hx.t)
	_, dhy := mustRegister(b, h1, hy.t)
	ph := connect(b, h0, h1.Addr())
	defer func() { require.NoError(b, ph.Close()) }()

	ctx := context.Background()
	device := func() { require.NoError(b, pd.Put(ctx, transfer.Op{Local: rx, Remote: dy, Len: size})) }
	host := func() { require.NoError(b, ph.Put(ctx, transfer.Op{Local: rhx, Remote: dhy, Len: size})) }
	device() // warm both paths
	host()
	var dWall, hWall, dCPU, hCPU time.Duration
	timed := func(f func(), wall, cpu *time.Duration) {
		c0, t0 := processCPU(), time.Now()
		f()
		*wall += time.Since(t0)
		*cpu += processCPU() - c0
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			timed(device, &dWall, &dCPU)
			timed(host, &hWall, &hCPU)
		} else {
			timed(host, &hWall, &hCPU)
			timed(device, &dWall, &dCPU)
		}
	}
	b.StopTimer()
	moved := float64(size * b.N)
	b.ReportMetric(float64(dWall)/float64(hWall), "device/host")
	b.ReportMetric(float64(dCPU)/float64(hCPU), "device/host-cpu")
	b.ReportMetric(moved/dWall.Seconds()/1e9, "device-GB/s")
	b.ReportMetric(moved/hWall.Seconds()/1e9, "host-GB/s")
}

// BenchmarkDevicePutConcurrent: peers of one engine putting 1 MiB each
// at once between device tensors, all through the engine's one staging
// buffer (8 MiB: 4 MiB halves, so each put is one piece) and the
// target's, against the same puts one peer after another, alternating,
// in the same run: concurrent÷serial is what the lock per half costs or
// gains (below 1: the pieces of one op overlap the others' socket I/O on
// the other side; about 1: the half serializes them).
func BenchmarkDevicePutConcurrent(b *testing.B) {
	const size, peers = 1 << 20, 4
	cfg := devStandin()
	cfg.Capacity = 256 << 20
	drv, _ := cudatest.Open(b, cfg, cuda.Options{})
	m0, m1 := mustDevMem(b, drv, 0, 16<<20), mustDevMem(b, drv, 1, 16<<20)
	e0 := mustEngine(b, transfer.Config{Staging: transfer.Staging{Driver: drv, Device: 0}})
	e1 := mustEngine(b, transfer.Config{Staging: transfer.Staging{Driver: drv, Device: 1}})
	ops := make([]transfer.Op, peers)
	ps := make([]*transfer.Peer, peers)
	for i := range peers {
		rx, _ := mustRegister(b, e0, mustDevTensor(b, m0, size, uint64(i)))
		_, dy := mustRegister(b, e1, mustDevTensor(b, m1, size, uint64(10+i)))
		ops[i] = transfer.Op{Local: rx, Remote: dy, Len: size}
		ps[i] = connect(b, e0, e1.Addr())
		defer func() { require.NoError(b, ps[i].Close()) }()
	}
	ctx := context.Background()
	serial := func() {
		for i := range peers {
			require.NoError(b, ps[i].Put(ctx, ops[i]))
		}
	}
	concurrent := func() {
		errs := make(chan error, peers)
		for i := range peers {
			go func() { errs <- ps[i].Put(ctx, ops[i]) }()
		}
		for range peers {
			require.NoError(b, <-errs)
		}
	}
	serial()
	concurrent()
	var sWall, cWall, sCPU, cCPU time.Duration
	timed := func(f func(), wall, cpu *time.Duration) {
		c0, t0 := processCPU(), time.Now()
		f()
		*wall += time.Since(t0)
		*cpu += processCPU() - c0
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			timed(serial, &sWall, &sCPU)
			timed(concurrent, &cWall, &cCPU)
		} else {
			timed(concurrent, &cWall, &cCPU)
			timed(serial, &sWall, &sCPU)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cWall)/float64(sWall), "concurrent/serial")
	b.ReportMetric(float64(cCPU)/float64(sCPU), "concurrent/serial-cpu")
	b.ReportMetric(float64(size*peers*b.N)/cWall.Seconds()/1e9, "concurrent-GB/s")
}
