package procmaps

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	e, err := parse("7f3a44000000-7f3a44200000 rw-s 00400000 00:01 1234                       /memfd:vmarena-host0-heap (deleted)")
	require.NoError(t, err)
	require.Equal(t, Entry{Start: 0x7f3a44000000, End: 0x7f3a44200000, Perms: "rw-s", Offset: 0x400000, Inode: 1234,
		Path: "/memfd:vmarena-host0-heap (deleted)"}, e)
	require.True(t, e.Readable() && e.Writable() && e.Shared())
	for _, bad := range []string{"", "zz-1 rw-p 0 0:0 0", "1-2 rw 0 0:0 0", "1-2 rw-p 0 0:0"} {
		_, err := parse(bad)
		require.Error(t, err, bad)
	}
}

func TestReadSeesAMapping(t *testing.T) {
	p, err := unix.MmapPtr(-1, 0, nil, 3<<12, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.MunmapPtr(p, 3<<12)
	es, err := Read()
	require.NoError(t, err)
	addr := uint64(uintptr(p))
	e, ok := Find(es, addr+4096)
	require.True(t, ok)
	require.Equal(t, "r--p", e.Perms)
	require.LessOrEqual(t, e.Start, addr)
	require.Len(t, Within(es, addr, addr+3<<12), 1)
}
