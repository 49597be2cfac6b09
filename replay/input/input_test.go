package input

import (
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReaderBounds: past its total or a line's bound the reader fails with
// ErrMalformed, having given the bytes before the bound, and the error
// stays.
func TestReaderBounds(t *testing.T) {
	const p = Prefix("pkg")
	b := p.Reader(strings.NewReader("ab\ncd\nef\n"), 6, 3)
	data, err := io.ReadAll(b)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "pkg: more than 6 bytes (MaxTraceBytes)")
	require.Equal(t, "ab\ncd\n", string(data))
	_, err = b.Read(make([]byte, 4))
	require.ErrorIs(t, err, ErrMalformed, "the error stays")

	b = p.Reader(strings.NewReader("ab\ncdef\n"), 100, 3)
	data, err = io.ReadAll(b)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "pkg: line 2: longer than 3 bytes (MaxTraceLineBytes)")
	require.Equal(t, "ab\ncde", string(data))

	data, err = io.ReadAll(p.Reader(strings.NewReader("ab\ncdefgh\n"), 100, 0))
	require.NoError(t, err, "line 0: lines not bounded")
	require.Equal(t, "ab\ncdefgh\n", string(data))
}

// TestMalformed: the message names the package and the line, the sentinel
// is ErrMalformed, and RangeNote tells a number out of range.
func TestMalformed(t *testing.T) {
	err := Prefix("pkg").Malformed(7, "%q is bad", "x")
	require.ErrorIs(t, err, ErrMalformed)
	require.EqualError(t, err, `pkg: line 7: "x" is bad`)
	_, perr := strconv.ParseUint("99999999999999999999", 10, 64)
	require.Equal(t, " (out of range)", RangeNote(perr))
	_, perr = strconv.ParseUint("x", 10, 64)
	require.Empty(t, RangeNote(perr))
}
