package replay

// The bounds on every file and stream this package reads, and the one
// place that opens a file (through replay/input): what a reader may take
// in, line by line and in all, so that a corrupt or hostile input
// (/dev/zero, a line with no end, a trace of a billion rows) is a clear
// error, never memory of its own making.

import "github.com/vmarena/vmarena/replay/input"

const (
	// MaxTraceBytes bounds what one allocator trace may hold in all, read
	// as a stream: the largest real trace here is 3.9 MB.
	MaxTraceBytes = 1 << 32
	// MaxTraceLineBytes bounds a line of an allocator trace's CSV, its
	// line ending included: nine numbers of 20 digits or less take 200.
	MaxTraceLineBytes = 64 << 10
	// MaxTraceEvents bounds the events of an allocator trace (CSV or
	// snapshot): an Event is 112 bytes, so 1.9 GB at the most; the largest
	// real trace here has 22,332.
	MaxTraceEvents = 1 << 24
)

// maxTraceEvents is the bound the readers check, a variable so that a test
// can lower it.
var maxTraceEvents = MaxTraceEvents

// in starts this package's messages and reads its inputs.
const in = input.Prefix("replay")

// malformed is an error marked ErrMalformed about line line of a trace.
func malformed(line int, format string, args ...any) error {
	return in.Malformed(line, format, args...)
}
