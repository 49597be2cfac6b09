package serving

// The bounds on every file and stream this package reads, and the one
// place that opens a file (through replay/input): what a reader may take
// in, line by line and in all, so that a corrupt or hostile input
// (/dev/zero, a line with no end, a trace of a billion rows) is a clear
// error, never memory of its own making.

import (
	"math"
	"math/rand/v2"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/replay/input"
)

const (
	// MaxConfigBytes bounds a model's config.json: the largest Hugging
	// Face config in testdata/models is 4.6 KiB.
	MaxConfigBytes = 4 << 20
	// MaxTraceBytes bounds what one request trace may hold in all, read as
	// a stream: the largest real trace here is 3.9 MB.
	MaxTraceBytes = 1 << 32
	// MaxRequests bounds the requests of a request trace; the real traces
	// here have at most 19,366 (an hour of Azure's chat service).
	MaxRequests = 1 << 24
	// MaxRequestBlocks bounds the hash ids a Mooncake or Bailian trace
	// names in all, 8 bytes each in the requests' Blocks; the Mooncake
	// reader also indexes each distinct id (the id before it: about 125
	// bytes of heap each), so a trace at the bound whose ids are all
	// distinct takes about 8 GiB to read. The bundled Mooncake trace
	// names 94,112.
	MaxRequestBlocks = 1 << 26
)

// The bounds the readers check, variables so that a test can lower them.
var (
	maxRequests      = MaxRequests
	maxRequestBlocks = MaxRequestBlocks
)

// ErrMalformed marks every error about the content of a request trace
// (the same value as replay.ErrMalformed); a model config's errors are
// marked driver.ErrInvalid.
var ErrMalformed = input.ErrMalformed

// in starts this package's messages and reads its inputs.
const in = input.Prefix("serving")

// malformed is an error marked ErrMalformed about line line of a trace.
func malformed(line int, format string, args ...any) error {
	return in.Malformed(line, format, args...)
}

func rangeNote(err error) string { return input.RangeNote(err) }

// hook calls fn, the caller's hook named name, and turns a panic in it
// into an error (driver.ErrInvalid): the hook is the caller's code, and a
// simulation must stop cleanly, closing what it made, not unwind half-done.
func hook(name string, fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.Wrapf(driver.ErrInvalid, "%s: the %s hook panicked: %v", in, name, r)
		}
	}()
	fn()
	return nil
}

// logUniform draws from [lo, hi] with a uniform logarithm.
func logUniform(rng *rand.Rand, lo, hi uint64) uint64 {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return min(hi, max(lo, uint64(math.Exp(l+rng.Float64()*(h-l)))))
}
