package units

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
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
		"0": 0, "4096": 4096, "2MiB": 2 * MiB, "80 GiB": 80 * GiB, "64 MiB": 64 * MiB, "1TiB": TiB, "7b": 7,
		" 12 ": 12, "2mib": 2 * MiB, "3 B": 3,
		// fractions that come to whole bytes
		"1.5GiB": 3 * GiB / 2, "0.5KiB": 512, "2.0": 2, "0.25 MiB": MiB / 4, "1.000GiB": GiB,
		"0.001KB": 1, "2.5GB": 2_500_000_000,
		// decimal (SI) units
		"1KB": 1000, "64MB": 64_000_000, "80GB": 80_000_000_000, "1 TB": 1_000_000_000_000, "1gb": 1_000_000_000,
		// binary: Kubernetes' Ki..Ti and one letter, as Linux's memparse
		"80Gi": 80 * GiB, "64Ki": 64 * KiB, "64k": 64 * KiB, "4g": 4 * GiB, "2M": 2 * MiB, "1t": TiB,
		// the largest size
		"18446744073709551615": 1<<64 - 1, "16777215.5TiB": 1<<64 - 1<<39,
	} {
		got, err := Parse(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for s, want := range map[string]string{
		"":                      `units: "" is not a size`,
		"-1":                    `units: "-1" is not a size`,
		"MiB":                   `units: "MiB" is not a size`,
		"2 XiB":                 `units: "2 XiB" is not a size`,
		"1.":                    `units: "1." is not a size`,
		".5GiB":                 `units: ".5GiB" is not a size`,
		"1e9":                   `units: "1e9" is not a size`,
		"+1":                    `units: "+1" is not a size`,
		"1_000":                 `units: "1_000" is not a size`,
		"1.2.3":                 `units: "1.2.3" is not a size`,
		"1.5":                   `units: "1.5" is not a whole number of bytes`,
		"0.1KiB":                `units: "0.1KiB" is not a whole number of bytes`,
		"0.0001KB":              `units: "0.0001KB" is not a whole number of bytes`,
		"99999999999TiB":        `units: "99999999999TiB" overflows 64 bits`,
		"18446744073709551616":  `units: "18446744073709551616" overflows 64 bits`,
		"16EiB":                 `units: "16EiB" is not a size`,
		strings.Repeat("1", 65): "longer than 64 characters",
	} {
		_, err := Parse(s)
		require.ErrorContains(t, err, want, s)
	}
	_, err := Parse("1.2.3")
	require.Contains(t, errors.FlattenHints(err), "1.5GiB")
	_, err = Parse("0.1KiB")
	require.Contains(t, errors.FlattenHints(err), "smaller unit")
}

// FuzzParse: Parse never panics; what it accepts, Bytes prints as a size
// it reads back to the same value; a plain number of bytes is read as
// itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"4096", "1.5GiB", "64 MiB", "80GB", "0.1KiB", "64k", "80Gi", "", "-1", "1e9", "18446744073709551615"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			require.Zero(t, n)
			return
		}
		back, err := Parse(Bytes(n))
		require.NoError(t, err, "Bytes(%d) = %q", n, Bytes(n))
		require.Equal(t, n, back)
		if plain, ok := strings.CutSuffix(Bytes(n), " B"); ok {
			back, err = Parse(plain)
			require.NoError(t, err)
			require.Equal(t, n, back)
		}
	})
}
