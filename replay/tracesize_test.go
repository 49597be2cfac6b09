package replay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/replay/internal/pickle"
)

// TestParseFileRefusesBySize: a trace file over its kind's bound — a
// snapshot pickle over the decoder's input limit, a CSV over
// MaxTraceBytes — is refused from its size, before it is read (the files
// are sparse: reading one would take a gigabyte or four), with an error
// marked ErrMalformed that gives the size and the bound. The file is
// left as it was.
func TestParseFileRefusesBySize(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name  string
		first byte
		size  int64
		want  string
	}{
		{"snapshot.pickle", pickleProto, pickle.DefaultMaxInput + 1, "more than the 1073741824 a snapshot pickle"},
		{"trace.csv", 'a', MaxTraceBytes + 1, "more than the 4294967296 a CSV trace"},
	} {
		name := filepath.Join(dir, c.name)
		f, err := os.Create(name)
		require.NoError(t, err)
		_, err = f.Write([]byte{c.first})
		require.NoError(t, err)
		require.NoError(t, f.Truncate(c.size))
		require.NoError(t, f.Close())
		events, err := ParseFile(name)
		drivertest.RequireIs(t, err, ErrMalformed, c.want)
		require.Nil(t, events)
		st, err := os.Stat(name)
		require.NoError(t, err)
		require.Equal(t, c.size, st.Size())
	}
}
