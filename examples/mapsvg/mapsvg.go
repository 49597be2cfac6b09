// Package mapsvg lets the examples (their -svg DIR flag) and vmarena demo
// (--svg DIR) draw their memory map at their key steps: Record wraps the
// program's driver so that every reservation, chunk, mapping and grant it
// is asked for is kept in a memsvg.Book, and Save writes the picture of
// the moment as DIR/step-NN-slug.svg. It draws what the driver holds, so
// it shows the memory of an arena, an allocator's stitch range or a KV
// cache without reaching into them.
//
// It is not under examples/internal because the command imports it too;
// it sits in the examples' layer (8) because it wraps a driver, which the
// renderer (internal/memsvg, layer 0) may not import.
package mapsvg

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/memsvg"
)

// Recorder is the book of a recorded driver and the directory its pictures
// go to. A nil Recorder (no -svg) saves nothing.
type Recorder struct {
	book *memsvg.Book
	dir  string
	step int
}

// Record returns d wrapped so that its memory map is kept, and the
// Recorder that draws it into dir, which it creates. With dir "" it
// returns d itself and a nil Recorder: the example runs as without the
// flag. The wrapper keeps d's streams and host mapping (the optional
// interfaces the layers look for); it does not export or import chunks.
func Record(d driver.Driver, dir string) (driver.Driver, *Recorder, error) {
	if isnil.Is(d) {
		return nil, nil, errors.Wrap(driver.ErrInvalid, "mapsvg: record: the driver is nil")
	}
	if dir == "" {
		return d, nil, nil
	}
	if err := Writable(dir); err != nil {
		return nil, nil, err
	}
	gran := d.Granularity()
	for _, dev := range d.Devices() {
		gran = min(gran, dev.MinGranularity)
	}
	r := &recorder{Driver: d, book: memsvg.NewBook(len(d.Devices()), gran)}
	return wrap(r, d), &Recorder{book: r.book, dir: dir}, nil
}

// Writable makes dir and checks that a file can be written there, so that
// a bad picture directory fails before the program runs.
func Writable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errors.Wrapf(err, "the picture directory %s: cannot make it", dir)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return errors.Wrapf(err, "the picture directory %s: cannot write there", dir)
	}
	return errors.CombineErrors(f.Close(), os.Remove(f.Name()))
}

// Picture is the memory map now, titled title: every live reservation.
// An example may rename its ranges, mark offsets or add notes, then Write
// it.
func (r *Recorder) Picture(title string) memsvg.Picture {
	if r == nil {
		return memsvg.Picture{}
	}
	return r.book.Picture(title)
}

// Save writes the memory map now as the next step's picture, slug naming
// the file, with title and notes.
func (r *Recorder) Save(slug, title string, notes ...string) error {
	if r == nil {
		return nil
	}
	p := r.Picture(title)
	p.Notes = notes
	return r.Write(slug, p)
}

// Write writes p as the next step's picture: DIR/step-NN-slug.svg.
func (r *Recorder) Write(slug string, p memsvg.Picture) error {
	if r == nil {
		return nil
	}
	r.step++
	return r.WriteStep(r.step, slug, p)
}

// WriteStep writes p as step's picture, DIR/step-NN-slug.svg, for a
// program that numbers its steps itself (the demo).
func (r *Recorder) WriteStep(step int, slug string, p memsvg.Picture) error {
	if r == nil {
		return nil
	}
	return memsvg.WriteFile(filepath.Join(r.dir, fmt.Sprintf("step-%02d-%s.svg", step, slug)), p)
}

// recorder is a driver that tells its book every change of its memory map
// that succeeded.
type recorder struct {
	driver.Driver
	book *memsvg.Book
}

// wrap gives r the optional interfaces of d that the layers look for.
func wrap(r *recorder, d driver.Driver) driver.Driver {
	st, streams := d.(driver.Streams)
	hm, host := d.(driver.HostMapper)
	switch {
	case streams && host:
		return &struct {
			*recorder
			driver.Streams
			driver.HostMapper
		}{r, st, hm}
	case streams:
		return &struct {
			*recorder
			driver.Streams
		}{r, st}
	case host:
		return &struct {
			*recorder
			driver.HostMapper
		}{r, hm}
	}
	return r
}

func (r *recorder) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	a, err := r.Driver.Reserve(size, align, hint)
	if err == nil {
		r.book.Reserve(uint64(a), size)
	}
	return a, err
}

func (r *recorder) Unreserve(base driver.Addr, size uint64) error {
	err := r.Driver.Unreserve(base, size)
	if err == nil {
		r.book.Unreserve(uint64(base))
	}
	return err
}

func (r *recorder) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	h, err := r.Driver.Create(dev, size, opts)
	if err == nil {
		r.book.Create(uint64(h), int(dev), size)
	}
	return h, err
}

func (r *recorder) Release(h driver.Handle) error {
	err := r.Driver.Release(h)
	if err == nil {
		r.book.Release(uint64(h))
	}
	return err
}

func (r *recorder) Map(addr driver.Addr, h driver.Handle) error {
	err := r.Driver.Map(addr, h)
	if err == nil {
		r.book.Map(uint64(addr), uint64(h))
	}
	return err
}

func (r *recorder) Unmap(addr driver.Addr, size uint64) error {
	err := r.Driver.Unmap(addr, size)
	if err == nil {
		r.book.Unmap(uint64(addr))
	}
	return err
}

func (r *recorder) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	err := r.Driver.SetAccess(addr, size, dev, a)
	if err == nil {
		r.book.SetAccess(uint64(addr), size, int(dev), access(a))
	}
	return err
}

// access is a's picture.
func access(a driver.Access) memsvg.Access {
	switch a {
	case driver.AccessRead:
		return memsvg.Read
	case driver.AccessReadWrite:
		return memsvg.ReadWrite
	}
	return memsvg.NoAccess
}

// Main parses an example's flags (-svg DIR, the only one), runs it, and
// returns its exit status: 2 for a flag it cannot use (one line on
// stderr), 1 when run fails, 0 otherwise. name prefixes the messages.
func Main(name string, args []string, stdout, stderr io.Writer, run func(w io.Writer, svgDir string) error) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package's complaint is one line; its usage goes out only
	// when asked for (-h).
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	dir := fs.String("svg", "", "write the memory map at each key step as an SVG picture into `DIR` (made if need be)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stderr.Write(usage.Bytes())
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q; the one flag is -svg DIR\n", name, fs.Arg(0))
		return 2
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "svg" })
	if set && *dir == "" {
		fmt.Fprintf(stderr, "%s: -svg needs a directory\n", name)
		return 2
	}
	if err := run(stdout, *dir); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
