package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkIPCShare: a 2 MiB and a 1 GiB chunk handed to a receiver over
// a Unix socket in one process — export, send the descriptor, import, map,
// grant, HostBytes — beside the same bytes copied over a SOCK_STREAM socket
// pair in 1 MiB writes, in the same loop. Reports share-us/op (a receiver
// that fills page tables on first touch), copy-us/op and copy/share (how
// many times faster sharing is); touch-us/op, that receiver's first read
// of every page afterwards (not in share-us/op); share-populate-us/op, the
// share with a receiver on the host driver's default, which fills the page
// tables when access is granted; and for 1 GiB the 2 MiB share in the same
// loop and share-to-2MiB, ≈ 1 when the share costs the same at any size.
// bare-us/op is the same share made with the host driver's and the ipc
// package's system calls alone (lib/bare: share-us/op over it), and
// bare-to-2MiB their own growth from 2 MiB to 1 GiB: the kernel's part of
// share-to-2MiB. Before each timed share, library or bare, the benchmark
// writes a byte to each page of a buffer as large as the largest chunk,
// so that every share starts from caches and a TLB as cold as the 1 GiB
// producer's writes leave them.
// The 1 GiB case commits 1 GiB at a time, beside two 1 GiB buffers for the
// copy.
func BenchmarkIPCShare(b *testing.B) {
	b.ReportAllocs()
	for _, size := range []uint64{IPCSmall, units.GiB} {
		b.Run(units.Bytes(size), func(b *testing.B) {
			b.ReportAllocs()
			t, err := IPCShare(b.Loop, size)
			skipTooLarge(b, err)
			if err != nil {
				b.Fatal(err)
			}
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(t.N) }
			b.ReportMetric(us(t.Share), "share-us/op")
			b.ReportMetric(us(t.Copy), "copy-us/op")
			b.ReportMetric(float64(t.Copy)/float64(t.Share), "copy/share")
			b.ReportMetric(us(t.Touch), "touch-us/op")
			b.ReportMetric(us(t.SharePopulate), "share-populate-us/op")
			b.ReportMetric(us(t.Bare), "bare-us/op")
			b.ReportMetric(float64(t.Share)/float64(t.Bare), "lib/bare")
			if size > IPCSmall {
				b.ReportMetric(us(t.ShareSmall), "share-2MiB-us/op")
				b.ReportMetric(float64(t.Share)/float64(t.ShareSmall), "share-to-2MiB")
				b.ReportMetric(float64(t.Bare)/float64(t.BareSmall), "bare-to-2MiB")
			}
			b.ReportMetric(0, "ns/op") // the loop also creates and releases the chunks; the figures above are the ones that matter
		})
	}
}

// TestIPCBenchmarkBodies runs the IPC body once at 2 MiB and at 4 MiB (the
// size that also times the 2 MiB share), and checks that a round leaves no
// descriptor open (the bare share's included: it checks the receiver sees
// the sender's bytes, and fails otherwise).
func TestIPCBenchmarkBodies(t *testing.T) {
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(es)
	}
	_, err := IPCShare(Rounds(1), IPCSmall) // the first use of sockets opens the runtime's poller for good
	require.NoError(t, err)
	for _, size := range []uint64{IPCSmall, 4 * units.MiB} {
		before := fds()
		p, err := IPCShare(Rounds(1), size)
		require.NoError(t, err)
		require.Equal(t, 1, p.N)
		require.Positive(t, p.Share)
		require.Positive(t, p.Copy)
		require.Positive(t, p.Touch)
		require.Positive(t, p.SharePopulate)
		require.Positive(t, p.Bare)
		if size > IPCSmall {
			require.Positive(t, p.ShareSmall)
			require.Positive(t, p.BareSmall)
		} else {
			require.Zero(t, p.ShareSmall)
			require.Zero(t, p.BareSmall)
		}
		require.Equal(t, before, fds(), "every descriptor the body opened is closed")
	}
	_, err = IPCShare(Rounds(1), 3*units.MiB)
	require.Error(t, err, "not a multiple of 2 MiB")
}
