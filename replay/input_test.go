package replay

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// endless reads as the byte c forever, counting what it gave: a line that
// never ends, as /dev/zero is.
type endless struct {
	c    byte
	gave int64
}

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = e.c
	}
	e.gave += int64(len(p))
	return len(p), nil
}

// TestBoundedReads: a line with no end is an error once the bound is
// passed, having read no more than the bound (and a read buffer) of it
// (replay/input's tests check the reader's totals).
func TestBoundedReads(t *testing.T) {
	t.Run("a CSV trace line with no end", func(t *testing.T) {
		src := &endless{c: '1'}
		_, err := Parse(io.MultiReader(strings.NewReader(header), src))
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "replay: line 2: longer than 65536 bytes (MaxTraceLineBytes)")
		require.Less(t, src.gave, int64(MaxTraceLineBytes+64<<10), "read no more than the line's bound and a buffer")
	})
	t.Run("a CSV trace of zeros", func(t *testing.T) {
		src := &endless{c: 0}
		_, err := Parse(src)
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "replay: line 1: longer than 65536 bytes")
	})
}

// TestTraceTotals: past MaxTraceEvents a trace is refused (the bound
// lowered here, to keep the test small).
func TestTraceTotals(t *testing.T) {
	defer func(e int) { maxTraceEvents = e }(maxTraceEvents)
	maxTraceEvents = 3

	csv := header + "0,0,alloc,512,0,0,0,,\n1,0,free_completed,512,0,0,0,,\n2,0,alloc,512,0,1,0,,\n"
	events, err := Parse(strings.NewReader(csv))
	require.NoError(t, err)
	require.Len(t, events, 3)
	_, err = Parse(strings.NewReader(csv + "3,0,free_completed,512,0,1,0,,\n"))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "replay: line 5: more than 3 events (MaxTraceEvents)")

	four := []map[string]any{entry("alloc", 512, 0), entry("free_completed", 512, 0), entry("alloc", 512, 0), entry("free_completed", 512, 0)}
	_, err = Parse(bytes.NewReader(pk(four[:3])))
	require.NoError(t, err)
	_, err = Parse(bytes.NewReader(pk(four[:2], four[2:])))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "replay: snapshot: 4 trace entries, more than 3 (MaxTraceEvents)")
}
