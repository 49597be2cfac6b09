package units

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1: "1 B", 4097: "4097 B", 4096: "4 KiB", 3 * MiB: "3 MiB",
		1536 * KiB: "1536 KiB", 64 * GiB: "64 GiB", 2 * TiB: "2 TiB",
	} {
		require.Equal(t, want, Bytes(n), "Bytes(%d)", n)
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]uint64{
		"4096": 4096, "2MiB": 2 * MiB, "80 GiB": 80 * GiB, "64k": 64 * KiB, "1TiB": TiB, "7b": 7,
	} {
		got, err := Parse(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "-1", "1.5GiB", "MiB", "99999999999TiB", "2 XiB"} {
		_, err := Parse(s)
		require.Error(t, err, s)
	}
}
