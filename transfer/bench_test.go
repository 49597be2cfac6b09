package transfer_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// BenchmarkLoopback: 64 MiB Put then Get between this process and the
// re-executed peer over loopback, through the engine, and in the same
// run the baseline: a plain TCP socket moving the same 64 MiB between the
// same two processes and the same memory (the peer's "sock" server,
// under the same tensor access). It reports engine÷socket (the time of
// a put and a get through the engine over the socket's: the engine's
// overhead; target ≤ 1.2) and each one's GB/s (bytes moved both ways over
// the time), and engine-cpu÷socket-cpu: the CPU time (user and system)
// of both processes together, the engine's over the socket's. The ucx
// kind runs when the build has UCX, with UCX_TLS=tcp
// and UCX_TLS=sm,tcp for both processes. (sm,self alone cannot connect:
// the engine's endpoints ask for peer error handling, which UCX 1.13's
// shared-memory transports lack — "no peer failure handler" — so tcp
// carries the wireup and cma, in sm, what it can of the data.)
func BenchmarkLoopback(b *testing.B) {
	b.Run("tcp", func(b *testing.B) { benchLoopback(b, "tcp") })
	for _, tls := range []string{"tcp", "sm,tcp"} {
		b.Run("ucx/UCX_TLS="+tls, func(b *testing.B) {
			if !ucx.Available {
				b.Skip("this build has no UCX (build with -tags ucx, cgo and libucx-dev)")
			}
			b.Setenv("UCX_TLS", tls) // this process's worker reads it at New
			benchLoopback(b, "ucx", "UCX_TLS="+tls)
		})
	}
}

func benchLoopback(b *testing.B, kind string, env ...string) {
	const size = 64 << 20
	peer := startPeer(b, kind, env...)
	h := mustHostMem(b, 256<<20)
	e, err := transfer.New(transfer.Config{Kind: kind})
	require.NoError(b, err)
	defer func() { require.NoError(b, e.Close()) }()
	local, err := newRegion(h.a, size, 1)
	require.NoError(b, err)
	defer func() { require.NoError(b, local.end()) }()
	reg, err := e.Register(local.t)
	require.NoError(b, err)
	remote := peer.desc(peer.do("lease B %d 2", size))
	p := connect(b, e, peer.addr)
	defer func() { require.NoError(b, p.Close()) }()
	sock, err := net.Dial("tcp", peer.do("sock B"))
	require.NoError(b, err)
	defer sock.Close()

	ctx := context.Background()
	op := transfer.Op{Local: reg, Remote: remote, Len: size}
	viaEngine := func() {
		require.NoError(b, p.Put(ctx, op))
		require.NoError(b, p.Get(ctx, op))
	}
	viaSocket := func() {
		var h [9]byte
		h[0] = 'P'
		binary.BigEndian.PutUint64(h[1:], size)
		require.NoError(b, local.t.Access(false, func(m []byte) error {
			if _, err := (&net.Buffers{h[:], m}).WriteTo(sock); err != nil {
				return err
			}
			_, err := io.ReadFull(sock, h[:1])
			return err
		}))
		h[0] = 'G'
		require.NoError(b, local.t.Access(true, func(m []byte) error {
			if _, err := sock.Write(h[:]); err != nil {
				return err
			}
			_, err := io.ReadFull(sock, m)
			return err
		}))
	}
	viaEngine() // warm both paths: page faults, socket buffers
	viaSocket()
	var engine, socket, engineCPU, socketCPU time.Duration
	peerCPU := func() time.Duration {
		ns, err := strconv.ParseInt(peer.do("cpu"), 10, 64)
		require.NoError(b, err)
		return time.Duration(ns)
	}
	b.ResetTimer()
	timed := func(f func(), cpu *time.Duration) time.Duration {
		c0, p0 := cpuTime(), peerCPU()
		t0 := time.Now()
		f()
		d := time.Since(t0)
		*cpu += cpuTime() - c0 + peerCPU() - p0
		return d
	}
	for i := 0; i < b.N; i++ {
		// Alternate which goes first, so neither gets the other's
		// leftovers (warm caches, a drained socket buffer) every time.
		if i%2 == 0 {
			engine += timed(viaEngine, &engineCPU)
			socket += timed(viaSocket, &socketCPU)
		} else {
			socket += timed(viaSocket, &socketCPU)
			engine += timed(viaEngine, &engineCPU)
		}
	}
	b.StopTimer()
	moved := float64(2 * size * b.N)
	b.ReportMetric(float64(engine)/float64(socket), "engine/socket")
	b.ReportMetric(float64(engineCPU)/float64(socketCPU), "engine-cpu/socket-cpu")
	b.ReportMetric(moved/engine.Seconds()/1e9, "engine-GB/s")
	b.ReportMetric(moved/socket.Seconds()/1e9, "socket-GB/s")
}
