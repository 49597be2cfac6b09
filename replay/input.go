package replay

// The bounds on every file and stream this package reads, and the one
// place that opens a file: what a reader may take in, line by line and in
// all, so that a corrupt or hostile input (/dev/zero, a line with no end,
// a trace of a billion rows) is a clear error, never memory of its own
// making.

import (
	"bytes"
	"io"
	"io/fs"
	"os"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
)

const (
	// MaxConfigBytes bounds a model's config.json: the largest Hugging
	// Face config in testdata/models is 4.6 KiB.
	MaxConfigBytes = 4 << 20
	// MaxTraceBytes bounds what one allocator or request trace may hold in
	// all, read as a stream: the largest real trace here is 3.9 MB.
	MaxTraceBytes = 1 << 32
	// MaxTraceLineBytes bounds a line of an allocator trace's CSV, its
	// line ending included: nine numbers of 20 digits or less take 200.
	MaxTraceLineBytes = 64 << 10
	// MaxTraceEvents bounds the events of an allocator trace (CSV or
	// snapshot): an Event is 112 bytes, so 1.9 GB at the most; the largest
	// real trace here has 22,332.
	MaxTraceEvents = 1 << 24
	// MaxRequests bounds the requests of a request trace; the real traces
	// here have at most 19,366 (an hour of Azure's chat service).
	MaxRequests = 1 << 24
	// MaxRequestBlocks bounds the hash ids a Mooncake trace names in all
	// (8 bytes each); the real one names 94,112.
	MaxRequestBlocks = 1 << 26
)

// The bounds the readers check, variables so that a test can lower them.
var (
	maxTraceEvents   = MaxTraceEvents
	maxRequests      = MaxRequests
	maxRequestBlocks = MaxRequestBlocks
)

// openRegular opens the named file for reading, what is a file in the
// messages ("a trace", "a model config"). Anything but a regular file (a
// directory, a device such as /dev/zero, a FIFO, a socket) is refused
// with an error marked driver.ErrInvalid: a reader expects an end.
func openRegular(name, what string) (*os.File, error) {
	// Stat before opening: opening a FIFO waits for its writer.
	st, err := os.Stat(name)
	if err == nil && !st.Mode().IsRegular() {
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: %s: %s is %s, not a regular file", what, name, fileKind(st.Mode()))
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "replay: %s", what), driver.ErrInvalid)
	}
	// And after: the name may have changed between the two.
	if st, err = f.Stat(); err != nil || !st.Mode().IsRegular() {
		_ = f.Close()
		if err != nil {
			return nil, sentinel.Mark(errors.Wrapf(err, "replay: %s", what), driver.ErrInvalid)
		}
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: %s: %s is %s, not a regular file", what, name, fileKind(st.Mode()))
	}
	return f, nil
}

// fileKind names what a mode is, for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file (mode " + m.String() + ")"
}

// readRegular reads the whole of the named regular file, refusing one of
// more than most bytes before reading it (and a file that grows past most
// while read).
func readRegular(name, what string, most int64) ([]byte, error) {
	f, err := openRegular(name, what)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "replay: %s", what), driver.ErrInvalid)
	}
	if st.Size() > most {
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: %s: %s is %d bytes, more than the %d a %s may have", what, name, st.Size(), most, what)
	}
	data, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "replay: %s", what), driver.ErrInvalid)
	}
	if int64(len(data)) > most {
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: %s: %s holds more than the %d bytes a %s may have", what, name, most, what)
	}
	return data, nil
}

// boundedReader reads r, failing with an error marked ErrMalformed once
// more than total bytes in all, or a line (up to and with its '\n') of
// more than line bytes, would be read: csv.Reader and a whole-stream read
// have no bound of their own. line 0 means lines are not bounded here.
type boundedReader struct {
	r           io.Reader
	total, line int64
	read        int64 // bytes read so far
	inLine      int64 // bytes read since the last '\n'
	lines       int   // '\n's read so far: the current line is lines+1
	err         error
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if left := b.total - b.read + 1; int64(len(p)) > left {
		p = p[:left] // one past the bound: enough to see it passed
	}
	n, err := b.r.Read(p)
	if b.read+int64(n) > b.total {
		k := int(b.total - b.read)
		b.read = b.total
		b.err = sentinel.Mark(errors.Newf("replay: more than %d bytes (MaxTraceBytes)", b.total), ErrMalformed)
		if k, lerr := b.countLines(p[:k]); lerr != nil {
			return k, lerr
		}
		return k, b.err
	}
	b.read += int64(n)
	if k, lerr := b.countLines(p[:n]); lerr != nil {
		return k, lerr
	}
	return n, err
}

// countLines counts the lines in q, just read, and fails at the first byte
// past the line bound: the bytes before it are returned as read.
func (b *boundedReader) countLines(q []byte) (int, error) {
	done := 0
	for len(q) > 0 {
		seg := len(q)
		i := bytes.IndexByte(q, '\n')
		if i >= 0 {
			seg = i + 1
		}
		if b.line > 0 && b.inLine+int64(seg) > b.line {
			b.err = malformed(b.lines+1, "longer than %d bytes (MaxTraceLineBytes)", b.line)
			return done + int(b.line-b.inLine), b.err
		}
		if i >= 0 {
			b.inLine = 0
			b.lines++
		} else {
			b.inLine += int64(seg)
		}
		done += seg
		q = q[seg:]
	}
	return done, nil
}
