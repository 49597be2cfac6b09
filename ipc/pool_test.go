package ipc

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/stream"
)

// poolChild is the importing side of TestSharePoolWithChild.
func poolChild(conn *Conn) error {
	p, err := newProc()
	if err != nil {
		return err
	}
	defer p.close()
	ip, err := conn.RecvPool(p.space, p.mem, 0)
	if err != nil {
		return err
	}
	var ptrs []driver.Addr
	for i := 0; i < 2; i++ {
		ptr, err := conn.RecvPointer(ip)
		if err != nil {
			return err
		}
		got := make([]byte, 6)
		if err := ip.Table().Read(0, ptr, got); err != nil {
			return err
		}
		fmt.Println("read", string(got))
		ptrs = append(ptrs, ptr)
	}
	_, err = ip.MallocAsync(64)
	fmt.Println("malloc", strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
	fmt.Println("close-early", drivertestIs(ip.Close(), driver.ErrBusy))
	if err := ip.Table().Write(0, ptrs[1], []byte("child!")); err != nil {
		return err
	}
	for _, ptr := range ptrs {
		if err := ip.Free(ptr); err != nil {
			return err
		}
	}
	fmt.Println("double-free", drivertestIs(ip.Free(ptrs[0]), driver.ErrNotAllocated))
	return ip.Close()
}

func drivertestIs(err, target error) bool { return errors.Is(err, target) }

// TestSharePoolWithChild: a pool and two of its allocations go to a child;
// the child reads them, cannot allocate from the imported pool, writes,
// and frees first; the exporter cannot free before the child released.
func TestSharePoolWithChild(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	pool, err := arena.NewPool(p.space, p.mem, arena.PoolProps{Shareable: true, MaxSize: 16 * chunkSize})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	a, err := pool.MallocAsync(3*chunkSize/2, s) // spans chunks
	require.NoError(t, err)
	b, err := pool.MallocAsync(100, s)
	require.NoError(t, err)
	require.NoError(t, s.CopyHtoD(a, []byte("first!")))
	require.NoError(t, s.CopyHtoD(b, []byte("second")))
	require.NoError(t, s.Synchronize())

	l := listen(t)
	conn, cmd, out := spawn(t, l, "pool")
	ep, err := ExportPool(pool, cmd.Process.Pid)
	require.NoError(t, err)
	require.NoError(t, conn.SendPool(ep))
	require.NoError(t, conn.SendPointer(ep, a))
	require.NoError(t, conn.SendPointer(ep, b))
	drivertest.RequireIs(t, pool.FreeAsync(a, s), driver.ErrBusy, "have not released it")
	got, err := conn.RecvRelease(ep)
	require.NoError(t, err, out.String())
	require.Equal(t, a, got)
	require.NoError(t, pool.FreeAsync(a, s), "released by the importer: the exporter may free")
	got, err = conn.RecvRelease(ep)
	require.NoError(t, err, out.String())
	require.Equal(t, b, got)
	back := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(back, b))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "child!", string(back), "the exporter sees the importer's write")
	require.NoError(t, pool.FreeAsync(b, s))
	require.NoError(t, cmd.Wait(), out.String())
	kv := lines(out.String())
	require.Equal(t, []string{"first!", "second"}, kv["read"])
	require.Contains(t, kv["malloc"][0], "an imported pool cannot allocate")
	require.Equal(t, []string{"true"}, kv["close-early"])
	require.Equal(t, []string{"true"}, kv["double-free"])
	require.NoError(t, s.Synchronize())
	require.NoError(t, pool.Destroy())
}

// TestPoolProtocolErrors: in one process, unknown pools and pointers, a
// pool that is not shareable, and a peer not on the pool's allow-list.
func TestPoolProtocolErrors(t *testing.T) {
	p, err := newProc()
	require.NoError(t, err)
	defer p.close()
	l := listen(t)
	tx, err := Dial(l.Path())
	require.NoError(t, err)
	defer tx.Close()
	rx, err := l.Accept()
	require.NoError(t, err)
	defer rx.Close()
	before := fdCount()

	plain, err := arena.NewPool(p.space, p.mem, arena.PoolProps{MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	defer plain.Destroy()
	_, err = ExportPool(plain)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "without PoolProps.Shareable")

	pool, err := arena.NewPool(p.space, p.mem, arena.PoolProps{Shareable: true, MaxSize: 4 * chunkSize})
	require.NoError(t, err)
	s, err := stream.New(p.drv, 0)
	require.NoError(t, err)
	defer s.Destroy()
	ptr, err := pool.MallocAsync(64, s)
	require.NoError(t, err)

	other, err := ExportPool(pool, 1) // not this process
	require.NoError(t, err)
	drivertest.RequireIs(t, rx.SendPool(other), driver.ErrAccessDenied, "not on the allow-list")
	_, err = tx.RecvPool(p.space, p.mem, 0)
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "refused")

	ep, err := ExportPool(pool, os.Getpid())
	require.NoError(t, err)
	require.NoError(t, rx.SendPool(ep))
	ip, err := tx.RecvPool(p.space, p.mem, 0)
	require.NoError(t, err)
	drivertest.RequireIs(t, rx.SendPointer(ep, ptr+64), driver.ErrNotAllocated, "not a live allocation")

	// A pointer of another pool, and one whose chunks never came.
	require.NoError(t, rx.send(KindPointer, 0, u64s(ep.id+1, 0, 64)))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "unknown here")
	require.NoError(t, rx.send(KindPointer, 0, u64s(ep.id, 0, 64)))
	_, err = tx.RecvPointer(ip)
	drivertest.RequireIs(t, err, driver.ErrNotMapped, "its chunks never came")
	// A release of something never imported.
	require.NoError(t, tx.send(KindRelease, 0, u64s(ep.id, 4096)))
	_, err = rx.RecvRelease(ep)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated, "no process imported it")
	require.NoError(t, tx.send(KindRelease, 0, u64s(ep.id+7, 0)))
	_, err = rx.RecvRelease(ep)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "unknown here")

	// The real thing, in one process.
	require.NoError(t, rx.SendPointer(ep, ptr))
	got, err := tx.RecvPointer(ip)
	require.NoError(t, err)
	require.NoError(t, ip.Table().Write(0, got, bytes.Repeat([]byte{9}, 8)))
	require.NoError(t, ip.Free(got))
	_, err = rx.RecvRelease(ep)
	require.NoError(t, err)
	require.NoError(t, ip.Close())
	require.NoError(t, pool.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, pool.Destroy())
	require.Equal(t, before, fdCount(), "no descriptor left behind")
}
