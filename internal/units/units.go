// Package units formats and parses byte sizes the way vmarena prints them:
// binary units (KiB, MiB, GiB, TiB), exact where the value is a whole number
// of the unit, so an error message never hides a byte.
package units

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"
)

const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
	TiB uint64 = 1 << 40
)

// The decimal (SI) units Parse reads: a GB is 10^9 bytes, as disk and
// network vendors, and NVIDIA's product names ("H100 80GB"), use it.
const (
	kB uint64 = 1000
	mB        = 1000 * kB
	gB        = 1000 * mB
	tB        = 1000 * gB
)

var suffixes = []struct {
	name string
	size uint64
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}}

// Bytes formats n with the largest binary unit that divides it exactly
// ("2 MiB", "1536 KiB", "4097 B"), so the figure is never rounded.
func Bytes(n uint64) string {
	for _, s := range suffixes {
		if n >= s.size && n%s.size == 0 {
			return fmt.Sprintf("%d %s", n/s.size, s.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// parseUnits are the units Parse reads, matched case-insensitively,
// longest first. The binary ones are KiB..TiB (and Kubernetes' Ki..Ti);
// the two-letter SI ones KB..TB are decimal (10^3..10^12), as the SI and
// IEC define them; the one-letter k, m, g, t stay binary, as Linux's
// memparse (kernel command line sizes), dd and Docker read them.
var parseUnits = []struct {
	suf  string
	size uint64
}{
	{"tib", TiB}, {"gib", GiB}, {"mib", MiB}, {"kib", KiB},
	{"ti", TiB}, {"gi", GiB}, {"mi", MiB}, {"ki", KiB},
	{"tb", tB}, {"gb", gB}, {"mb", mB}, {"kb", kB},
	{"t", TiB}, {"g", GiB}, {"m", MiB}, {"k", KiB}, {"b", 1},
}

// maxLen bounds what Parse reads: no size needs more characters, and a
// bound keeps the exact arithmetic of a fraction cheap.
const maxLen = 64

// Parse reads a size: a whole or decimal number, then an optional unit,
// with or without a space: "4096", "64 MiB", "1.5GiB", "80GB", "64k".
// KiB, MiB, GiB, TiB (and Ki, Mi, Gi, Ti) are binary; KB, MB, GB, TB are
// decimal (1 GB = 10^9 bytes); k, m, g, t alone are binary; B is a byte;
// case does not matter. A fraction must come to a whole number of bytes
// ("1.5GiB" is 1610612736; "0.1KiB", 102.4 bytes, is refused), and
// negative, overflowing and malformed values are refused.
func Parse(s string) (uint64, error) {
	if len(s) > maxLen {
		return 0, errors.Newf("units: %q is not a size: longer than %d characters", s[:maxLen]+"...", maxLen)
	}
	t := strings.TrimSpace(s)
	mult := uint64(1)
	lower := strings.ToLower(t)
	for _, u := range parseUnits {
		if strings.HasSuffix(lower, u.suf) {
			mult = u.size
			t = strings.TrimSpace(t[:len(t)-len(u.suf)])
			break
		}
	}
	whole, frac, dot := strings.Cut(t, ".")
	if !digits(whole) || dot && !digits(frac) {
		return 0, errors.WithHint(errors.Newf("units: %q is not a size", s),
			"write a number and an optional unit: 4096, 64KiB, 2 MiB, 1.5GiB (binary), 80GB (10^9 bytes)")
	}
	// n / den is the number exactly; the size is n × mult / den.
	n, ok := new(big.Int).SetString(whole+frac, 10)
	if !ok {
		return 0, errors.AssertionFailedf("units: %q: digits %q not read", s, whole+frac)
	}
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	n.Mul(n, new(big.Int).SetUint64(mult))
	q, r := new(big.Int).QuoRem(n, den, new(big.Int))
	if r.Sign() != 0 {
		return 0, errors.WithHint(errors.Newf("units: %q is not a whole number of bytes", s),
			"give the size in a smaller unit, or with fewer decimals")
	}
	if !q.IsUint64() {
		return 0, errors.Newf("units: %q overflows 64 bits", s)
	}
	return q.Uint64(), nil
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
