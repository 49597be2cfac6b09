package ipc

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/acl/acltest"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// Chunks and pool pointers of the AscendCL driver cross as 64-bit tokens,
// with no descriptor: the importer's PID must be on the runtime's own
// allow-list, which physical.Chunk.Export (chunks) and
// pool.ExportPointer (the pool's chunks, for the peer a pointer goes to)
// fill. These tests run the AscendCL stand-in in both processes: the
// child loads the file the parent's test built (VMARENA_IPC_ACL).

const aclLibEnv = "VMARENA_IPC_ACL"

// aclProc is one process's stack on the AscendCL driver.
type aclProc struct {
	drv   *acl.Driver
	mem   *physical.Memory
	space *vaspace.Space
}

func (p *aclProc) close() error {
	return errors.CombineErrors(p.mem.Close(), p.drv.Close())
}

// spawnACL starts the test binary as a child in role over the stand-in
// file path, connected to l.
func spawnACL(t *testing.T, l *Listener, role, path string) (*Conn, *exec.Cmd, *syncBuffer) {
	t.Helper()
	t.Setenv(aclLibEnv, path) // inherited by the child through os.Environ
	return spawn(t, l, role)
}

// aclChild is the child's side: "acl-import" receives a chunk's token,
// maps it, reads the parent's bytes and writes its own; "acl-pool"
// receives a pool pointer, reads it, writes it and frees it.
func aclChild(role string, conn *Conn) error {
	d, _, err := acltest.OpenFile(os.Getenv(aclLibEnv), acltest.Small(), acl.Options{})
	if err != nil {
		return err
	}
	p := &aclProc{drv: d, mem: physical.New(d), space: vaspace.New(d)}
	switch role {
	case "acl-import":
		c, err := conn.RecvChunk(p.mem, 0)
		if err != nil {
			return errors.CombineErrors(err, p.close())
		}
		res, err := p.space.Reserve(c.Size(), 0)
		if err != nil {
			return err
		}
		tab, err := mapping.New(res, p.mem)
		if err != nil {
			return err
		}
		if err := tab.Map(res.Base(), c); err != nil {
			return err
		}
		if err := tab.SetAccess(res.Base(), c.Size(), 0, driver.AccessReadWrite); err != nil {
			return err
		}
		got := make([]byte, 6)
		if err := tab.Read(0, res.Base(), got); err != nil {
			return err
		}
		fmt.Println("read", string(got))
		if err := tab.Write(0, res.Base()+driver.Addr(c.Size()-5), []byte("child")); err != nil {
			return err
		}
		if err := errors.CombineErrors(tab.Close(), errors.CombineErrors(c.Release(), res.Free())); err != nil {
			return err
		}
	case "acl-pool":
		ip, err := conn.RecvPool(p.space, p.mem, 0)
		if err != nil {
			return errors.CombineErrors(err, p.close())
		}
		ptr, err := conn.RecvPointer(ip)
		if err != nil {
			return err
		}
		got := make([]byte, 6)
		if err := ip.Read(0, ptr, got); err != nil {
			return err
		}
		fmt.Println("read", string(got))
		if err := ip.Write(0, ptr, []byte("child!")); err != nil {
			return err
		}
		if err := ip.Free(ptr); err != nil {
			return err
		}
		if err := ip.Close(); err != nil {
			return err
		}
	default:
		return errors.Newf("unknown role %q", role)
	}
	if err := p.close(); err != nil {
		return err
	}
	return conn.send(KindRelease, 0, []byte("done"))
}

// waitChild waits for the child's "done" and its exit, and returns its
// output's lines.
func waitChild(t *testing.T, conn *Conn, cmd *exec.Cmd, out *syncBuffer) map[string][]string {
	t.Helper()
	m, err := conn.recv()
	require.NoError(t, err, "child output:\n%s", out.String())
	require.Equal(t, "done", string(m.body))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	err = <-done
	require.NoError(t, err, "child output:\n%s", out.String())
	return lines(out.String())
}

// TestTokenChunkToChild: a chunk of the AscendCL driver goes to a child as
// a token (no descriptor crosses); the child, on the chunk's allow-list,
// imports it and reads and writes the same memory.
func TestTokenChunkToChild(t *testing.T) {
	d, lib := acltest.Open(t, acltest.Small(), acl.Options{})
	mem, space := physical.New(d), vaspace.New(d)
	g := d.Devices()[0].MinGranularity
	res, err := space.Reserve(g, 0)
	require.NoError(t, err)
	tab, err := mapping.New(res, mem)
	require.NoError(t, err)
	c, err := mem.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, tab.Close())
		require.NoError(t, c.Release())
		require.NoError(t, res.Free())
		require.NoError(t, mem.Close())
	})
	require.NoError(t, tab.Map(res.Base(), c))
	require.NoError(t, tab.SetAccess(res.Base(), g, 0, driver.AccessReadWrite))
	require.NoError(t, tab.Write(0, res.Base(), []byte("token!")))

	conn, cmd, out := spawnACL(t, listen(t), "acl-import", lib.Path())
	sh, err := c.Export(conn.PeerPID())
	require.NoError(t, err)
	require.Equal(t, driver.HandleToken, sh.Type)
	require.NoError(t, conn.SendChunk(c))
	got := waitChild(t, conn, cmd, out)
	require.Equal(t, []string{"token!"}, got["read"])
	back := make([]byte, 5)
	require.NoError(t, tab.Read(0, res.Base()+driver.Addr(g-5), back))
	require.Equal(t, "child", string(back), "one memory in both processes")
}

// TestTokenPoolPointerToChild: a pointer of a shareable pool on the
// AscendCL driver goes to a child; its chunks cross as tokens that
// ExportPointer let the child import; the child reads, writes and frees
// it, and the exporter then frees it too.
func TestTokenPoolPointerToChild(t *testing.T) {
	d, lib := acltest.Open(t, acltest.Small(), acl.Options{})
	mem, space := physical.New(d), vaspace.New(d)
	pl, err := pool.New(space, mem, pool.Props{Shareable: true, MaxSize: 4 << 20, ChunkSize: d.Devices()[0].MinGranularity})
	require.NoError(t, err)
	s, err := stream.New(d, 0)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Destroy())
		require.NoError(t, pl.Destroy())
		require.NoError(t, mem.Close())
	})
	ptr, err := pl.MallocAsync(4096, s)
	require.NoError(t, err)
	buf, err := d.HostAlloc(64) // AscendCL's async copies need 64-byte aligned buffers
	require.NoError(t, err)
	defer func() { require.NoError(t, d.HostFree(buf)) }()
	copy(buf, "pooled")
	require.NoError(t, s.CopyHtoD(ptr, buf[:64]))
	require.NoError(t, s.Synchronize())

	conn, cmd, out := spawnACL(t, listen(t), "acl-pool", lib.Path())
	ep, err := ExportPool(pl, conn.PeerPID())
	require.NoError(t, err)
	require.NoError(t, conn.SendPool(ep))
	require.NoError(t, conn.SendPointer(ep, ptr))
	released, err := conn.RecvRelease(ep)
	require.NoError(t, err, "child output:\n%s", out.String())
	require.Equal(t, ptr, released)
	got := waitChild(t, conn, cmd, out)
	require.Equal(t, []string{"pooled"}, got["read"])
	require.NoError(t, s.CopyDtoH(buf[:64], ptr))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "child!", string(buf[:6]), "the child wrote the pool's memory")
	require.NoError(t, pl.FreeAsync(ptr, s))
	require.NoError(t, s.Synchronize())
}
