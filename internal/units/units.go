// Package units formats and parses byte sizes the way vmarena prints them:
// binary units (KiB, MiB, GiB, TiB), exact where the value is a whole number
// of the unit, so an error message never hides a byte.
package units

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
)

const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
	TiB uint64 = 1 << 40
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

// Parse reads a size such as "2MiB", "80 GiB", "4096" or "64k" (k, m, g, t
// are taken as binary units too). It refuses negative, fractional and
// overflowing values.
func Parse(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	lower := strings.ToLower(t)
	for _, u := range []struct {
		suf  string
		size uint64
	}{
		{"tib", TiB}, {"gib", GiB}, {"mib", MiB}, {"kib", KiB},
		{"tb", TiB}, {"gb", GiB}, {"mb", MiB}, {"kb", KiB},
		{"t", TiB}, {"g", GiB}, {"m", MiB}, {"k", KiB}, {"b", 1},
	} {
		if strings.HasSuffix(lower, u.suf) {
			mult = u.size
			t = strings.TrimSpace(t[:len(t)-len(u.suf)])
			break
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, errors.Newf("units: %q is not a size (examples: 4096, 64KiB, 2MiB, 80GiB)", s)
	}
	if v != 0 && mult > 1 && v > ^uint64(0)/mult {
		return 0, errors.Newf("units: %q overflows 64 bits", s)
	}
	return v * mult, nil
}
