package vmarena

import (
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Binary byte-size units: 64 * vmarena.MiB.
const (
	KiB = units.KiB
	MiB = units.MiB
	GiB = units.GiB
	TiB = units.TiB
)

// ParseSize reads a byte size: a whole or decimal number and an optional
// unit, with or without a space ("4096", "64 MiB", "1.5GiB", "80GB").
// KiB, MiB, GiB, TiB (and Ki..Ti) are binary; KB, MB, GB, TB are decimal
// (1 GB = 10^9 bytes); k, m, g, t alone are binary, as Linux's memparse
// reads them; case does not matter. A fraction must come to a whole number
// of bytes ("0.1KiB" is refused). Refusals are ErrInvalid.
func ParseSize(s string) (uint64, error) {
	n, err := units.Parse(s)
	if err != nil {
		return 0, sentinel.Mark(err, driver.ErrInvalid)
	}
	return n, nil
}

// FormatSize prints n bytes with the largest binary unit that divides it
// exactly ("2 MiB", "1536 KiB", "4097 B"): never rounded, and ParseSize
// reads it back.
func FormatSize(n uint64) string { return units.Bytes(n) }
