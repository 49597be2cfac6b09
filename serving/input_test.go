package serving

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
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

// TestBoundedReads: a line with no end, a config too large: each an error
// once the bound is passed, having read no more than the bound (and a read
// buffer) of it (replay/input's tests check the reader's totals).
func TestBoundedReads(t *testing.T) {
	t.Run("a request trace line with no end", func(t *testing.T) {
		src := &endless{c: '{'}
		_, err := ParseMooncake(src)
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorContains(t, err, "serving: line 1: longer than 1048576 bytes (MaxRequestLineBytes)")
		require.Less(t, src.gave, int64(MaxRequestLineBytes+128<<10))
	})
	t.Run("a config past MaxConfigBytes", func(t *testing.T) {
		name := filepath.Join(t.TempDir(), "config.json")
		require.NoError(t, os.WriteFile(name, bytes.Repeat([]byte(" "), MaxConfigBytes+1), 0o600))
		_, err := LoadModel(name)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, "is 4194305 bytes, more than the 4194304 a model config may have")
		_, err = ModelFromConfig("big", make([]byte, MaxConfigBytes+1))
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, "serving: big: a config of 4194305 bytes, more than 4194304 (MaxConfigBytes)")
	})
	t.Run("a directory without config.json", func(t *testing.T) {
		dir := t.TempDir()
		_, err := LoadModel(dir)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, "serving: model config: the directory "+dir+" has no config.json")
		require.NotContains(t, err.Error(), "preset")
	})
}

// TestTraceTotals: past MaxRequests or MaxRequestBlocks a trace is
// refused (the bounds lowered here, to keep the test small).
func TestTraceTotals(t *testing.T) {
	defer func(r, b int) { maxRequests, maxRequestBlocks = r, b }(maxRequests, maxRequestBlocks)
	maxRequests, maxRequestBlocks = 3, 4

	azure := azureHead + strings.Repeat("2023-11-16 18:15:46.6805900,374,44\n", 3)
	_, err := ParseAzure(strings.NewReader(azure))
	require.NoError(t, err)
	burst := burstHead + strings.Repeat("5,ChatGPT,472,18,490,Conversation log\n", 4)
	_, err = ParseBurstGPT(strings.NewReader(burst))
	requireMalformed(t, err, 5, "more than 3 requests (MaxRequests)")
	_, err = ParseAzure(strings.NewReader(azure + "2023-11-16 18:15:46.6805900,374,44\n"))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "serving: line 5: more than 3 requests (MaxRequests): serve the first N of a longer trace (kv simulate --limit N, ParseRequestsFileFirst)")
	name := filepath.Join(t.TempDir(), "long.csv")
	require.NoError(t, os.WriteFile(name, []byte(azure+"2023-11-16 18:15:46.6805900,374,44\n"), 0o600))
	reqs, err := ParseRequestsFileFirst(name, 3)
	require.NoError(t, err, "the first MaxRequests of a longer trace")
	require.Len(t, reqs, 3)

	line := func(ts int, ids string, n int) string {
		return `{"timestamp": ` + string(rune('0'+ts)) + `, "input_length": ` + string(rune('0'+n)) + `00, "output_length": 1, "hash_ids": [` + ids + "]}\n"
	}
	_, err = ParseMooncake(strings.NewReader(line(0, "0, 1", 6) + line(1, "0, 1", 6)))
	require.NoError(t, err)
	_, err = ParseMooncake(strings.NewReader(line(0, "0, 1", 6) + line(1, "0, 1", 6) + line(2, "2", 1)))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "serving: line 3: more than 4 hash_ids in the trace (MaxRequestBlocks)")
	require.False(t, errors.Is(err, driver.ErrInvalid))
}
