package mapsvg

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestRecord: the recorded driver keeps the optional interfaces the
// layers look for, and its pictures are the mapping table's own view: the
// same states and chunks at the same offsets, and the alias.
func TestRecord(t *testing.T) {
	hd, err := host.New(host.Options{Devices: 2, Capacity: 8 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	defer func() { require.NoError(t, hd.Close()) }()
	same, pics, err := Record(hd, "")
	require.NoError(t, err)
	require.Same(t, driver.Driver(hd), same, "without a directory, the driver itself")
	require.Nil(t, pics)
	require.NoError(t, pics.Save("nothing", "a nil recorder saves nothing"))
	var nilHost *host.Driver
	for _, d := range []driver.Driver{nil, nilHost} {
		_, _, err := Record(d, t.TempDir())
		require.ErrorIs(t, err, driver.ErrInvalid, "a nil driver is refused, not called")
	}

	dir := t.TempDir()
	drv, pics, err := Record(hd, dir)
	require.NoError(t, err)
	_, ok := drv.(driver.Streams)
	require.True(t, ok, "streams kept")
	_, ok = drv.(driver.HostMapper)
	require.True(t, ok, "host mapping kept")

	mem := physical.New(drv)
	res, err := vaspace.New(drv).Reserve(units.MiB, 0)
	require.NoError(t, err)
	tab, err := mapping.New(res, mem)
	require.NoError(t, err)
	c, err := mem.Create(1, 128*units.KiB, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, tab.Map(res.Base(), c))
	require.NoError(t, tab.Map(res.Base()+driver.Addr(512*units.KiB), c))
	require.NoError(t, tab.SetAccess(res.Base()+driver.Addr(64*units.KiB), 64*units.KiB, 0, driver.AccessRead))

	p := pics.Picture("now")
	require.Len(t, p.Ranges, 1)
	var want []memsvg.Span
	for s := range tab.Spans() {
		if s.State == mapping.Reserved {
			continue
		}
		acc := make([]memsvg.Access, len(s.Access))
		for d, a := range s.Access {
			acc[d] = access(a)
		}
		want = append(want, memsvg.Span{Offset: uint64(s.Range.Base - res.Base()), Size: s.Range.Size, State: memsvg.State(s.State),
			Chunk: uint64(s.Chunk.Handle()), Device: int(s.Chunk.Device()), ChunkOffset: s.ChunkOffset, Access: acc})
	}
	require.Equal(t, want, p.Ranges[0].Spans, "the book agrees with the table")

	require.NoError(t, pics.Save("aliased", "one chunk twice", "a note"))
	d := svgtest.ReadFile(t, filepath.Join(dir, "step-01-aliased.svg"))
	require.Equal(t, memsvg.Counts{Reserved: 12, Mapped: 3, Accessible: 1}, d.Counts(t))
	require.Len(t, d.Aliases(), 1)
	require.Equal(t, []string{"a note"}, d.Texts["note"])

	require.NoError(t, tab.Close())
	require.NoError(t, c.Release())
	require.NoError(t, res.Free())
	require.Empty(t, pics.Picture("freed").Ranges)
}

// TestMainFlags: -svg is the one flag; a bad one is one line and status 2, a
// directory that cannot be made is status 1 before the example runs, -h
// is the usage.
func TestMainFlags(t *testing.T) {
	ran := ""
	run := func(w io.Writer, dir string) error {
		ran = dir
		if dir == "" {
			return nil
		}
		return Writable(dir)
	}
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-svg"}, 2, "ex: flag needs an argument: -svg\n"},
		{[]string{"-svg", ""}, 2, "ex: -svg needs a directory\n"},
		{[]string{"-bogus"}, 2, "ex: flag provided but not defined: -bogus\n"},
		{[]string{"extra"}, 2, "ex: unexpected argument \"extra\"; the one flag is -svg DIR\n"},
		{[]string{"-svg", filepath.Join(file, "x")}, 1, "ex: the picture directory " + filepath.Join(file, "x") + ": cannot make it: mkdir " + file + ": not a directory\n"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, tc.code, Main("ex", tc.args, &stdout, &stderr, run), "%v", tc.args)
		require.Equal(t, tc.says, stderr.String(), "%v", tc.args)
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, Main("ex", []string{"-h"}, &stdout, &stderr, run))
	require.Contains(t, stderr.String(), "-svg DIR")
	ran = "unset"
	require.Equal(t, 0, Main("ex", nil, &stdout, &stderr, run))
	require.Empty(t, ran, "no -svg: no directory")
}
