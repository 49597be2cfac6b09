// Package input is how replay and serving read what a caller hands them: a
// file by name, opened only if it is a regular file; a whole file, refused
// past a size; a stream, refused past a total and a line length; and the
// sentinel, ErrMalformed, that marks every error about the content.
//
// It owns no format and no bound of its own: each caller states its bounds
// (their names appear in the messages: MaxTraceBytes, MaxTraceLineBytes)
// and its package's name, which starts each message (Prefix). It never
// reads past a bound by more than the read in progress, and never opens a
// device, directory, FIFO or socket (opening a FIFO would wait for its
// writer; reading /dev/zero would never end).
package input

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"strconv"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
)

// ErrMalformed marks every error about the content of a trace; replay and
// serving export it as their own ErrMalformed (one value).
var ErrMalformed = errors.New("malformed trace")

// Prefix is the name of the package whose messages an error starts with
// ("replay", "serving").
type Prefix string

// Malformed is an error marked ErrMalformed about line line of a trace.
func (p Prefix) Malformed(line int, format string, args ...any) error {
	return sentinel.Mark(errors.Newf(string(p)+": line %d: "+format, append([]any{line}, args...)...), ErrMalformed)
}

// RangeNote is " (out of range)" for a strconv error of a number too large
// for its type, "" otherwise: what a message adds to "is not an integer".
func RangeNote(err error) string {
	if errors.Is(err, strconv.ErrRange) {
		return " (out of range)"
	}
	return ""
}

// Open opens the named file for reading, what is a file in the messages
// ("a trace", "a model config"). Anything but a regular file (a directory,
// a device such as /dev/zero, a FIFO, a socket) is refused with an error
// marked driver.ErrInvalid: a reader expects an end.
func (p Prefix) Open(name, what string) (*os.File, error) {
	// Stat before opening: opening a FIFO waits for its writer.
	st, err := os.Stat(name)
	if err == nil && !st.Mode().IsRegular() {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %s: %s is %s, not a regular file", p, what, name, fileKind(st.Mode()))
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "%s: %s", p, what), driver.ErrInvalid)
	}
	// And after: the name may have changed between the two.
	if st, err = f.Stat(); err != nil || !st.Mode().IsRegular() {
		_ = f.Close()
		if err != nil {
			return nil, sentinel.Mark(errors.Wrapf(err, "%s: %s", p, what), driver.ErrInvalid)
		}
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %s: %s is %s, not a regular file", p, what, name, fileKind(st.Mode()))
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

// ReadFile reads the whole of the named regular file, refusing one of
// more than most bytes before reading it (and a file that grows past most
// while read).
func (p Prefix) ReadFile(name, what string, most int64) ([]byte, error) {
	f, err := p.Open(name, what)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "%s: %s", p, what), driver.ErrInvalid)
	}
	if st.Size() > most {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %s: %s is %d bytes, more than the %d a %s may have", p, what, name, st.Size(), most, what)
	}
	data, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "%s: %s", p, what), driver.ErrInvalid)
	}
	if int64(len(data)) > most {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %s: %s holds more than the %d bytes a %s may have", p, what, name, most, what)
	}
	return data, nil
}

// Reader reads r, failing with an error marked ErrMalformed once more
// than total bytes in all (the caller's MaxTraceBytes), or a line (up to
// and with its '\n') of more than line bytes (its MaxTraceLineBytes),
// would be read: csv.Reader and a whole-stream read have no bound of their
// own. line 0 means lines are not bounded here. The error stays: every
// later Read returns it.
func (p Prefix) Reader(r io.Reader, total, line int64) io.Reader {
	return &bounded{p: p, r: r, total: total, line: line}
}

type bounded struct {
	p           Prefix
	r           io.Reader
	total, line int64
	read        int64 // bytes read so far
	inLine      int64 // bytes read since the last '\n'
	lines       int   // '\n's read so far: the current line is lines+1
	err         error
}

func (b *bounded) Read(p []byte) (int, error) {
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
		b.err = sentinel.Mark(errors.Newf("%s: more than %d bytes (MaxTraceBytes)", b.p, b.total), ErrMalformed)
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
func (b *bounded) countLines(q []byte) (int, error) {
	done := 0
	for len(q) > 0 {
		seg := len(q)
		i := bytes.IndexByte(q, '\n')
		if i >= 0 {
			seg = i + 1
		}
		if b.line > 0 && b.inLine+int64(seg) > b.line {
			b.err = b.p.Malformed(b.lines+1, "longer than %d bytes (MaxTraceLineBytes)", b.line)
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
