package ipc

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// Fuzzing the borders: every decoder of what another process sends — the
// message reader (recv: header, body, descriptors), RecvChunk, the pool
// protocol's RecvPool and RecvPointer, and RecvRelease — fed raw packets
// through a real SOCK_SEQPACKET socket pair, with descriptors attached or
// not, so the bytes take the path a peer's would. After every input the
// process holds exactly the descriptors it held before, and every
// structure passes its Check.
//
//	go test ./ipc -run '^$' -fuzz FuzzRecv$ -fuzztime 60s
//
// (and FuzzRecvChunk, FuzzRecvPool, FuzzRecvRelease). The seed corpora are
// in testdata/fuzz/<Name>; VMARENA_WRITE_CORPUS=1 go test ./ipc -run
// TestSeedCorpora writes them afresh.

// fuzzGran is the granularity of the fuzzing driver: small, so a chunk
// costs little.
const fuzzGran = 64 * units.KiB

// fuzzProc is one host-driver stack per fuzzing process, made once: the
// inputs leave it as they found it.
var fuzzProc = sync.OnceValues(func() (*proc, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * fuzzGran, Granularity: fuzzGran})
	if err != nil {
		return nil, err
	}
	p := &proc{drv: drv, mem: physical.New(drv), space: vaspace.New(drv)}
	if p.res, err = p.space.Reserve(4*fuzzGran, 0); err != nil {
		return nil, err
	}
	if p.tab, err = mapping.New(p.res, p.mem); err != nil {
		return nil, err
	}
	return p, nil
})

// maxPacket bounds a fuzzed packet: room for the largest message and then
// some, well inside a socket's buffer.
const maxPacket = 2 * (headerSize + MaxPayload)

// fdKinds are the descriptors an input may attach, by index.
var fdKinds = []func(t *testing.T) int{
	func(t *testing.T) int { return fuzzMemfd(t, fuzzGran, true) },   // a chunk as the host driver exports one
	func(t *testing.T) int { return fuzzMemfd(t, fuzzGran, false) },  // unsealed: any holder could resize it
	func(t *testing.T) int { return fuzzMemfd(t, 2*fuzzGran, true) }, // sealed, of two granules
	func(t *testing.T) int { // no memory at all
		fd, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		return fd
	},
	func(t *testing.T) int { // a pipe's read end
		var p [2]int
		require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
		require.NoError(t, unix.Close(p[1]))
		return p[0]
	},
}

func fuzzMemfd(t *testing.T, size uint64, sealed bool) int {
	flags := unix.MFD_CLOEXEC
	if sealed {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate("fuzz", flags)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	if sealed { // committed and sealed, as the host driver's exports are
		require.NoError(t, unix.Fallocate(fd, 0, 0, int64(size)))
		_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
		require.NoError(t, err)
	}
	return fd
}

// fdSpec makes the descriptors one spec byte names: spec&7 of them, of the
// kinds (spec>>3 + i) mod len(fdKinds). Up to 7, more than any message
// may carry (maxFDs).
func fdSpec(t *testing.T, spec byte) []int {
	fds := make([]int, int(spec&7))
	for i := range fds {
		fds[i] = fdKinds[(int(spec>>3)+i)%len(fdKinds)](t)
	}
	return fds
}

// socketPair returns the two ends of a fresh connection in this process:
// the peer writes raw packets, the other end decodes them.
func socketPair(t *testing.T) (peer, c *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conns := make([]*Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fuzz")
		nc, err := net.FileConn(f) // a duplicate of fd
		require.NoError(t, f.Close())
		require.NoError(t, err)
		if conns[i], err = newConn(nc.(*net.UnixConn), "socketpair"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { // after a failure: the next inputs must not inherit anything
		for _, c := range conns {
			_ = c.c.Close()
			c.peer.close()
		}
	})
	return conns[0], conns[1]
}

// rawSend writes one packet with fds attached, then closes the sender's
// copies of the descriptors.
func rawSend(t *testing.T, c *Conn, packet []byte, fds []int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.c.WriteMsgUnix(packet, oob, nil)
	require.NoError(t, err)
	closeAll(fds)
}

// packet builds a well-framed message.
func packet(kind Kind, htype driver.HandleType, nfds int, payload []byte) []byte {
	return append(header{kind: kind, htype: htype, nfds: uint8(nfds), payload: uint32(len(payload))}.encode(), payload...)
}

// closeConns closes both ends.
func closeConns(t *testing.T, cs ...*Conn) {
	t.Helper()
	for _, c := range cs {
		require.NoError(t, c.Close())
	}
}

// openFDs lists this process's open descriptors, each with what it
// refers to (its link in /proc/self/fd, and the device and inode of the
// file), so that a descriptor closed and a new one given its number are
// told apart.
func openFDs(t *testing.T) map[int]string {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	fds := map[int]string{}
	for _, e := range es {
		n, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		path := filepath.Join("/proc/self/fd", e.Name())
		target, lerr := os.Readlink(path)
		var st unix.Stat_t
		if lerr != nil || unix.Stat(path, &st) != nil {
			continue // the directory's own descriptor, closed by now
		}
		fds[n] = fmt.Sprintf("%s dev %d ino %d", target, st.Dev, st.Ino)
	}
	return fds
}

// requireNoNewFDs fails if the process holds a descriptor it did not hold
// before: one an input left open. (A descriptor that went away meanwhile
// is no leak: the runtime's finalizers close what earlier tests dropped
// when they please.)
func requireNoNewFDs(t *testing.T, before map[int]string, what string) {
	t.Helper()
	for n, target := range openFDs(t) {
		require.Equal(t, before[n], target, "%s: descriptor %d (%s) is left open", what, n, target)
	}
}

// fuzzRecvSeeds are messages of every kind, well formed and broken.
func fuzzRecvSeeds() [][]byte {
	chunk := packet(KindChunk, driver.HandlePOSIXFD, 1, append(u64s(uint64(fuzzGran)), 0, 0, 0, 0))
	return [][]byte{
		append([]byte{1}, chunk...),                                            // a chunk, one sealed memfd
		append([]byte{0}, chunk...),                                            // no descriptor came
		append([]byte{2}, chunk...),                                            // two came
		append([]byte{6}, chunk...),                                            // six: more than any message carries
		append([]byte{1 | 3<<3}, chunk[:7]...),                                 // truncated header, /dev/null attached
		append([]byte{1}, append([]byte("XXXX"), chunk[4:]...)...),             // bad magic
		append([]byte{0}, packet(KindRefused, 0, 0, []byte("not allowed"))...), // a refusal
		append([]byte{0}, packet(KindPool, 0, 0, u64s(7, 1<<20))...),           // a pool
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(7, 0))...),            // a release
		append([]byte{1 | 4<<3}, packet(KindPoolChunk, driver.HandlePOSIXFD, 1, u64s(7, 0, fuzzGran, 9))...),
		append([]byte{0}, append(packet(KindPointer, 0, 0, u64s(7, 0, 64)), make([]byte, MaxPayload)...)...), // oversized
		{0}, // an empty packet
		append([]byte{0}, packet(KindChunk, driver.HandleToken, 0, append(append(u64s(uint64(fuzzGran)), 0, 0, 0, 0), u64s(0xfeed)...))...), // a token
		append([]byte{0}, packet(KindPoolChunk, driver.HandleToken, 0, u64s(7, 0, fuzzGran, 9, 0xfeed))...),                                 // a pool chunk's token
	}
}

// FuzzRecv: the message reader alone. Whatever comes, recv either returns
// a message whose header agrees with what arrived — a known magic and
// version, as many payload bytes and descriptors as it announces, at most
// MaxPayload and maxFDs — or an error having closed every descriptor that
// came.
func FuzzRecv(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > maxPacket+1 {
			t.Skip()
		}
		before := openFDs(t)
		peer, c := socketPair(t)
		rawSend(t, peer, data[1:], fdSpec(t, data[0]))
		m, err := c.recv()
		if err == nil {
			require.Equal(t, magic, [3]byte(data[1:4]))
			require.Equal(t, byte(version), data[4])
			require.Equal(t, int(m.payload), len(m.body))
			require.Equal(t, len(data)-1-headerSize, len(m.body))
			require.LessOrEqual(t, len(m.body), MaxPayload)
			require.Equal(t, int(m.nfds), len(m.fds))
			require.LessOrEqual(t, len(m.fds), maxFDs)
			closeAll(m.fds)
		} else {
			require.True(t, errors.Is(err, ErrProtocol) || errors.Is(err, driver.ErrClosed), "%v", err)
		}
		closeConns(t, peer, c)
		requireNoNewFDs(t, before, "recv")
	})
}

// FuzzRecvChunk: RecvChunk imports only a well-framed chunk message with
// one memory file of the size it announces, sealed so no holder can resize
// it; anything else is an error that imports nothing and leaves no
// descriptor open.
func FuzzRecvChunk(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > maxPacket+1 {
			t.Skip()
		}
		p, err := fuzzProc()
		require.NoError(t, err)
		before, used := openFDs(t), p.used()
		peer, c := socketPair(t)
		rawSend(t, peer, data[1:], fdSpec(t, data[0]))
		ch, err := c.RecvChunk(p.mem, 0)
		if err == nil {
			require.True(t, ch.Imported())
			kind := int(data[0]>>3) % len(fdKinds) // 0 or 2: a sealed memfd, of one or two granules
			require.Equal(t, fuzzGran*uint64(1+kind/2), ch.Size(), "a sealed memfd of the size announced")
			require.NoError(t, p.mapRW(ch))
			require.NoError(t, p.tab.Write(0, p.res.Base()+driver.Addr(ch.Size()-4), []byte("last")))
			require.NoError(t, p.tab.Unmap(p.res.Base()))
			require.NoError(t, ch.Release())
		}
		require.Equal(t, used, p.used(), "nothing imported is left")
		require.NoError(t, p.mem.Check())
		closeConns(t, peer, c)
		requireNoNewFDs(t, before, "RecvChunk")
	})
}

// fuzzChunkSeeds are chunk messages with every kind of descriptor.
func fuzzChunkSeeds() [][]byte {
	chunk := func(size uint64) []byte {
		return packet(KindChunk, driver.HandlePOSIXFD, 1, append(u64s(size), 0, 0, 0, 0))
	}
	return [][]byte{
		append([]byte{1}, chunk(fuzzGran)...),                                                                // imported
		append([]byte{1 | 1<<3}, chunk(fuzzGran)...),                                                         // unsealed
		append([]byte{1 | 2<<3}, chunk(fuzzGran)...),                                                         // another size
		append([]byte{1 | 2<<3}, chunk(2*fuzzGran)...),                                                       // two granules: imported
		append([]byte{1 | 3<<3}, chunk(fuzzGran)...),                                                         // /dev/null
		append([]byte{1 | 4<<3}, chunk(fuzzGran)...),                                                         // a pipe
		append([]byte{1}, chunk(fuzzGran+1)...),                                                              // misaligned
		append([]byte{1}, chunk(1<<62)...),                                                                   // huge
		append([]byte{2}, packet(KindChunk, driver.HandlePOSIXFD, 2, append(u64s(fuzzGran), 0, 0, 0, 0))...), // two descriptors
		append([]byte{1}, packet(KindChunk, driver.HandleToken, 1, append(u64s(fuzzGran), 0, 0, 0, 0))...),   // a token type
		append([]byte{0}, packet(KindRefused, 0, 0, []byte("no"))...),
		append([]byte{1}, packet(KindPoolChunk, driver.HandlePOSIXFD, 1, u64s(7, 0, fuzzGran, 9))...),
		append([]byte{0}, token(fuzzGran)...),                                                                                       // a token: the host driver shares descriptors only
		append([]byte{1}, packet(KindChunk, driver.HandleToken, 1, append(append(u64s(fuzzGran), 0, 0, 0, 0), u64s(0xfeed)...))...), // a token with a descriptor
		append([]byte{0}, packet(KindChunk, driver.HandleToken, 0, append(u64s(fuzzGran), 0, 0, 0, 0))...),                          // a token without its token
	}
}

// token is a KindChunk message carrying a token for size bytes.
func token(size uint64) []byte {
	return packet(KindChunk, driver.HandleToken, 0, append(append(u64s(size), 0, 0, 0, 0), u64s(0xfeed)...))
}

// records splits a FuzzRecvPool input into packets, each with its
// descriptors: a spec byte (fdSpec), a 2-byte big-endian length, then that
// many bytes (fewer if the input ends first).
func records(t *testing.T, data []byte) (packets [][]byte, fds [][]int) {
	for len(data) >= 3 {
		spec, n := data[0], min(int(data[1])<<8|int(data[2]), len(data)-3, maxPacket)
		packets = append(packets, data[3:3+n])
		fds = append(fds, fdSpec(t, spec))
		data = data[3+n:]
	}
	return packets, fds
}

// record is records' inverse for one packet.
func record(spec byte, p []byte) []byte {
	return append([]byte{spec, byte(len(p) >> 8), byte(len(p))}, p...)
}

// FuzzRecvPool: the pool protocol's importing side. The first packet must
// make a pool (RecvPool), then RecvPointer takes the rest — chunks that
// map or replace memory at offsets, pointers into it — until one fails or
// the peer stops. Whatever came, the imported pool passes its Check, every
// pointer it accepted lies on chunks it maps, and once they are freed it
// closes, giving back every chunk and descriptor.
func FuzzRecvPool(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := fuzzProc()
		require.NoError(t, err)
		before, used := openFDs(t), p.used()
		peer, c := socketPair(t)
		packets, fds := records(t, data)
		for i, pk := range packets {
			rawSend(t, peer, pk, fds[i])
		}
		require.NoError(t, unix.Shutdown(fuzzFD(t, peer), unix.SHUT_WR)) // then the reader sees the end
		ip, err := c.RecvPool(p.space, p.mem, 0)
		if err == nil {
			// Each call takes one message or more; the end comes after
			// the last.
			ended := false
			for range len(packets) + 1 {
				if _, err := c.RecvPointer(ip); errors.Is(err, driver.ErrClosed) {
					ended = true
					break
				}
			}
			require.True(t, ended, "RecvPointer read past %d packets", len(packets))
			require.NoError(t, ip.Check())
			ip.mu.Lock()
			ptrs := make([]driver.Addr, 0, len(ip.ptrs))
			for ptr := range ip.ptrs {
				ptrs = append(ptrs, ptr)
			}
			ip.mu.Unlock()
			for _, ptr := range ptrs {
				b := make([]byte, 1)
				require.NoError(t, ip.Read(0, ptr, b), "an imported pointer is readable")
				require.NoError(t, ip.Free(ptr))
			}
			require.NoError(t, ip.Close())
		}
		require.Equal(t, used, p.used(), "every imported chunk was released")
		require.NoError(t, p.mem.Check())
		closeConns(t, peer, c)
		requireNoNewFDs(t, before, "RecvPool and RecvPointer")
	})
}

// fuzzFD is the descriptor of c's socket, for shutdown.
func fuzzFD(t *testing.T, c *Conn) int {
	t.Helper()
	raw, err := c.c.SyscallConn()
	require.NoError(t, err)
	var fd int
	require.NoError(t, raw.Control(func(s uintptr) { fd = int(s) }))
	return fd
}

// fuzzPoolSeeds are pool conversations: a pool of 16 granules (id 7),
// chunks at offsets, pointers on them and beside them.
func fuzzPoolSeeds() [][]byte {
	const id = 7
	g := uint64(fuzzGran)
	pool := record(0, packet(KindPool, 0, 0, u64s(id, 16*g)))
	chunk := func(spec byte, off, size, cid uint64) []byte {
		return record(spec, packet(KindPoolChunk, driver.HandlePOSIXFD, 1, u64s(id, off, size, cid)))
	}
	ptr := func(off, size uint64) []byte { return record(0, packet(KindPointer, 0, 0, u64s(id, off, size))) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	return [][]byte{
		cat(pool),
		cat(pool, chunk(1, 0, g, 1), ptr(0, 100)),                                                                // a pointer on a chunk
		cat(pool, chunk(1, 0, g, 1), ptr(0, 2*g)),                                                                // one that reaches past it
		cat(pool, chunk(1, 0, g, 1), ptr(16, ^uint64(0)-8)),                                                      // one whose end overflows
		cat(pool, chunk(1, 0, g, 1), ptr(0, 0)),                                                                  // an empty one
		cat(pool, chunk(1, 0, g, 1), chunk(1, g, g, 2), ptr(g/2, g)),                                             // across two chunks
		cat(pool, chunk(1|2<<3, 0, 2*g, 3), ptr(g, 64), chunk(1, 0, g, 4), ptr(0, 8)),                            // a replacement refused under a pointer
		cat(pool, chunk(1, 0, g, 1), chunk(1, 0, g, 1), ptr(0, 8)),                                               // the same chunk twice
		cat(pool, chunk(1|1<<3, 0, g, 1), ptr(0, 8)),                                                             // an unsealed memfd
		cat(pool, chunk(1, 16*g, g, 1)),                                                                          // outside the pool
		cat(pool, chunk(1, ^uint64(0)-g+1, g, 1)),                                                                // an offset that overflows
		cat(pool, chunk(2, 0, g, 1)),                                                                             // two descriptors
		cat(record(0, packet(KindPool, 0, 0, u64s(id, 1<<62)))),                                                  // a pool too large to reserve
		cat(record(0, packet(KindRefused, 0, 0, []byte("no")))),                                                  // refused
		cat(pool, record(0, packet(KindPointer, 0, 0, u64s(id+1, 0, 8)))),                                        // another pool's pointer
		cat(pool, chunk(1, 0, g, 1), record(0, packet(KindRelease, 0, 0, u64s(id, 0)))),                          // a kind that has no place here
		cat(pool, record(0, packet(KindPoolChunk, driver.HandleToken, 0, u64s(id, 0, g, 1, 0xfeed))), ptr(0, 8)), // a token: refused by the host driver
		cat(pool, record(0, packet(KindPoolChunk, driver.HandleToken, 0, u64s(id, 0, g, 1)))),                    // a token message without its token
	}
}

// FuzzRecvRelease: the exporting side. A pool pointer is sent on a fresh
// connection; the peer answers with anything. Only a release of that very
// pointer, of that pool, releases it; whatever else comes leaves the
// import held and counted, and the pool passes its Check. An id of zero in
// a release stands for the pool's own (which differs in every process),
// so inputs can name it.
func FuzzRecvRelease(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > maxPacket+1 {
			t.Skip()
		}
		x, err := fuzzExporter()
		require.NoError(t, err)
		before := openFDs(t)
		peer, c := socketPair(t)
		noWait := time.Duration(0) // the peer is this process: it will not exit
		c.testExitWait = &noWait
		require.NoError(t, c.SendPool(x.ep))
		require.NoError(t, c.SendPointer(x.ep, x.ptr))
		pk := append([]byte(nil), data[1:]...)
		if m := pk; len(m) == headerSize+16 && Kind(m[4]) == KindRelease && string(m[headerSize:headerSize+8]) == string(make([]byte, 8)) {
			copy(m[headerSize:], u64s(x.ep.id))
		}
		rawSend(t, peer, pk, fdSpec(t, data[0]))
		ptr, err := c.RecvRelease(x.ep)
		if err == nil {
			require.Equal(t, x.ptr, ptr)
			require.Zero(t, c.Holds())
		} else {
			require.Equal(t, 1, c.Holds(), "a release refused releases nothing: %v", err)
			drop(t, c)
		}
		requireNoImport(t, x)
		require.NoError(t, x.pl.Check())
		closeConns(t, peer, c)
		requireNoNewFDs(t, before, "RecvRelease")
	})
}

// fuzzReleaseSeeds are answers to a pointer: its release and others.
func fuzzReleaseSeeds() [][]byte {
	return [][]byte{
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(0, 0))...),          // the release
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(0, 64))...),         // of another pointer
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(99, 0))...),         // of another pool
		append([]byte{1}, packet(KindRelease, 0, 1, u64s(0, 0))...),          // with a descriptor
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(0))...),             // short
		append([]byte{0}, packet(KindPointer, 0, 0, u64s(0, 0, 8))...),       // another kind
		append([]byte{0}, packet(KindRelease, 0, 0, u64s(0, ^uint64(0)))...), // an offset past everything
		{0},
	}
}

// exporter is a shareable pool with one allocation, made once per
// fuzzing process.
type exporter struct {
	pl  *pool.Pool
	s   *stream.Stream
	ep  *ExportedPool
	ptr driver.Addr
}

// Its host driver is its own: the importing targets find fuzzProc's
// memory as they left it.
var fuzzExporter = sync.OnceValues(func() (*exporter, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 16 * fuzzGran, Granularity: fuzzGran})
	if err != nil {
		return nil, err
	}
	p := &proc{drv: drv, mem: physical.New(drv), space: vaspace.New(drv)}
	pl, err := pool.New(p.space, p.mem, pool.Props{Shareable: true, MaxSize: 4 * fuzzGran, ChunkSize: fuzzGran})
	if err != nil {
		return nil, err
	}
	s, err := stream.New(p.drv, 0)
	if err != nil {
		return nil, err
	}
	ptr, err := pl.MallocAsync(256, s)
	if err != nil {
		return nil, err
	}
	ep, err := ExportPool(pl, os.Getpid())
	if err != nil {
		return nil, err
	}
	// The first export of a pointer exports its chunk, whose descriptor
	// the chunk keeps from then on: done here, before any input counts
	// descriptors.
	if _, err := pl.ExportPointer(ptr); err != nil {
		return nil, err
	}
	if err := pl.ReleaseImport(ptr); err != nil {
		return nil, err
	}
	return &exporter{pl: pl, s: s, ep: ep, ptr: ptr}, nil
})

// drop releases the imports c's peer holds, as the test's own peer: as
// the connection's holder, since nobody else may.
func drop(t *testing.T, c *Conn) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for ep, ptrs := range c.holds {
		for ptr, n := range ptrs {
			for range n {
				require.NoError(t, ep.p.ReleaseImportFor(c.holder, ptr))
			}
		}
	}
	c.holds = nil
}

// requireNoImport checks that the pool counts no import of its
// allocation any more (FreeAsync would accept it; it stays allocated for
// the next input).
func requireNoImport(t *testing.T, x *exporter) {
	t.Helper()
	drivertest.RequireIs(t, x.pl.ReleaseImport(x.ptr), driver.ErrNotAllocated, "no process imported it")
}

// TestSeedCorpora: the committed seed corpora are the seeds above, so
// they cannot drift from the wire format. With VMARENA_WRITE_CORPUS=1 it
// writes them afresh.
func TestSeedCorpora(t *testing.T) {
	for name, seeds := range map[string][][]byte{
		"FuzzRecv":        fuzzRecvSeeds(),
		"FuzzRecvChunk":   fuzzChunkSeeds(),
		"FuzzRecvPool":    fuzzPoolSeeds(),
		"FuzzRecvRelease": fuzzReleaseSeeds(),
	} {
		dir := filepath.Join("testdata", "fuzz", name)
		if os.Getenv("VMARENA_WRITE_CORPUS") == "1" {
			require.NoError(t, os.RemoveAll(dir))
			require.NoError(t, os.MkdirAll(dir, 0o755))
			for i, s := range seeds {
				body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
				require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644))
			}
		}
		for i, s := range seeds {
			body, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)))
			require.NoError(t, err, "%s: run with VMARENA_WRITE_CORPUS=1 to write the corpus", name)
			lines := strings.SplitN(string(body), "\n", 3)
			require.Equal(t, "go test fuzz v1", lines[0])
			got, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
			require.NoError(t, err)
			require.Equal(t, s, []byte(got), "%s seed %d", name, i)
		}
	}
}
