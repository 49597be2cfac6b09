package progress

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQuietOffTerminal: on a writer that is not a terminal — a buffer, a
// pipe, nothing at all — New returns a nil bar, and every method of it
// does nothing and writes nothing.
func TestQuietOffTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()

	var buf bytes.Buffer
	for _, out := range []io.Writer{&buf, w, nil} {
		require.False(t, IsTerminal(out))
		b := New(out, 100, "replay")
		require.Nil(t, b)
		b.Set(10)
		b.Add(5)
		b.Describe("other")
		b.Done()
		b.Close()
	}
	require.Empty(t, buf.String())

	require.NoError(t, w.Close())
	piped, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Empty(t, piped)
}

// TestBarOnTerminal: a bar forced on (as on a terminal) writes its
// description, reaches 100% with its count, and ends its line once,
// whether it filled itself or Done filled it; Close after Done adds
// nothing.
func TestBarOnTerminal(t *testing.T) {
	for _, tc := range []struct {
		name string
		step func(b *Bar)
	}{
		{"filled by Set", func(b *Bar) { b.Set(250) }},
		{"filled by Done", func(b *Bar) { b.Set(100) }},
		{"filled by Add", func(b *Bar) { b.Add(200); b.Add(50) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			b := NewWithOptions(&buf, 250, "replay big.csv", Options{Terminal: true})
			require.NotNil(t, b)
			tc.step(b)
			b.Done()
			out := buf.String()
			b.Close()
			b.Done()
			require.Equal(t, out, buf.String(), "nothing is drawn after Done")
			require.Contains(t, out, "replay big.csv")
			require.Contains(t, out, "100%")
			require.Contains(t, out, "(250/250")
			require.True(t, strings.HasSuffix(out, "\n"), "the bar ends its line: %q", out)
			require.Equal(t, 1, strings.Count(out, "\n"), "one line ended, once: %q", out)
		})
	}
}

// TestCloseEndsLineEarly: Close on a bar that did not reach its total
// (the work stopped on an error) ends the line where the bar stands,
// without claiming 100%; a relabelled bar shows its new label. (Drawn at
// every update: the default throttle would skip updates this close
// together.)
func TestCloseEndsLineEarly(t *testing.T) {
	var buf bytes.Buffer
	b := NewWithOptions(&buf, 1000, "first", Options{Terminal: true, Throttle: time.Nanosecond})
	b.Describe("second")
	b.Set(300)
	b.Close()
	out := buf.String()
	require.Contains(t, out, "second")
	require.Contains(t, out, "30%")
	require.NotContains(t, out, "100%")
	require.True(t, strings.HasSuffix(out, "\n"), "%q", out)
	b.Set(1000)
	b.Done()
	require.Equal(t, out, buf.String(), "nothing is drawn after Close")
}

// TestSpinner: a total below 1 is a count of unknown length; Done and
// Close both end it (and stop the library's redrawing goroutine).
func TestSpinner(t *testing.T) {
	for _, end := range []func(*Bar){(*Bar).Done, (*Bar).Close} {
		var buf bytes.Buffer
		b := NewWithOptions(&buf, 0, "benchmarks", Options{Terminal: true})
		b.Add(3)
		end(b)
		out := buf.String()
		require.Contains(t, out, "benchmarks")
		require.True(t, strings.HasSuffix(out, "\n"), "%q", out)
	}
}
