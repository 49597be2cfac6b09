// Grow appends rows to a tensor one at a time, from one row to a hundred
// thousand (or -rows), inside an arena: the tensor's base address never
// moves and no row is ever copied, so a growth step costs the row (and,
// once per chunk, mapping a fresh chunk), never the tensor's size. In the
// same loop it grows a Go []float32 with append, which copies everything
// each time it outgrows its capacity, and prints the time per step of
// both, decade by decade. It prints the memory it will use before it
// starts: the tensor's bytes in the arena, and up to about four times as
// much on the Go heap for append (the old slice, the larger new one, and
// what the collector has not yet reclaimed), and the peak it measured
// when it ends. On a terminal, a bar on standard error counts the rows.
//
//	go run ./examples/grow [-rows 100000]
//
// A flag it cannot use is a one-line error and exit status 2.
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/progress"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// rowLen float32 elements make one row: 1 KiB, so the default 100,000 rows
// are 98 MiB.
const rowLen = 256

// rowBytes is the size of one row.
const rowBytes = rowLen * 4

// progressRows rows pass between two updates of the progress bar, made
// outside the timed steps.
const progressRows = 1 << 10

// defaultRows fits a laptop: about 100 MiB in the arena and up to 400 MiB
// for append (measured: 470 MiB resident at the peak).
const defaultRows = 100_000

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr)) }

// realMain parses args, runs, and returns the exit status: 2 for a flag
// it cannot use, 1 for a failure.
func realMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("grow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rows := fs.Int("rows", defaultRows, "rows to grow the tensor to (1 KiB each)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package printed the problem and the usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "grow: unexpected argument %q; the only flag is -rows N\n", fs.Arg(0))
		return 2
	}
	if err := checkRows(*rows); err != nil {
		fmt.Fprintf(stderr, "grow: %v\n", err)
		return 2
	}
	if err := run(stdout, stderr, *rows); err != nil {
		fmt.Fprintf(stderr, "grow: %v\n", err)
		return 1
	}
	return 0
}

// checkRows refuses a row count no run could use: below one, or more
// bytes than the address space holds.
func checkRows(n int) error {
	if n < 1 {
		return errors.Newf("-rows %d: at least 1 row is needed", n)
	}
	if uint64(n) > math.MaxUint64/(4*rowBytes) {
		return errors.Newf("-rows %d: %d rows of %s do not fit in the address space", n, n, units.Bytes(rowBytes))
	}
	return nil
}

// decade is the figures of the steps (prev, upto] of one side.
type decade struct {
	total, slowest time.Duration
}

func (d *decade) add(t time.Duration) {
	d.total += t
	d.slowest = max(d.slowest, t)
}

// run grows to n rows, printing to w; a bar on progressTo, when it is a
// terminal, counts the rows.
func run(w, progressTo io.Writer, n int) (err error) {
	if err := checkRows(n); err != nil {
		return err
	}
	maxBytes := uint64(n) * rowBytes
	fmt.Fprintf(w, "This run needs about %s of memory: %s committed in the arena, and up to about %s on the Go heap for append.\n\n",
		mib(5*maxBytes), mib(maxBytes), mib(4*maxBytes))
	drv, err := host.New(host.Options{Devices: 1})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	if c := drv.Devices()[0].Capacity; c < maxBytes {
		return errors.Newf("%d rows need %s, the host driver's device has %s (half of MemAvailable); ask for fewer -rows",
			n, units.Bytes(maxBytes), units.Bytes(c))
	}
	// Address space is cheap: reserve room for the whole tensor up front,
	// commit it 2 MiB at a time as rows arrive.
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: maxBytes})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, a.Close()) }()
	g, err := tensor.NewGrowable(a, tensor.Float32, rowLen)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, g.Release()) }()

	fmt.Fprintf(w, "Growing a float32 tensor of rows of %d elements (%s a row) from 1 row to %d rows (%s),\n",
		rowLen, units.Bytes(rowBytes), n, mib(maxBytes))
	fmt.Fprintf(w, "one row a step, in an arena on the host driver (%s chunks) and, in the same loop, with Go's append.\n\n",
		units.Bytes(a.ChunkSize()))

	row := make([]float32, rowLen)
	base := g.Base()
	var first *tensor.Tensor // row 0, as AppendRows returned it
	var slice []float32
	moves, copied := 0, uint64(0) // times append moved the slice, bytes it copied

	growArena := func(r int) error {
		t, err := g.AppendRows(1)
		if err != nil {
			return err
		}
		if g.Base() != base || t.Addr() != base+driver.Addr(uint64(r)*rowBytes) {
			return errors.AssertionFailedf("row %d is at %s, base %s: the tensor moved (base was %s)", r, t.Addr(), g.Base(), base)
		}
		d, err := tensor.Data[float32](t)
		if err != nil {
			return err
		}
		copy(d, row)
		if r == 0 {
			first = t
		}
		return nil
	}
	growSlice := func() {
		old := unsafe.SliceData(slice)
		oldLen := len(slice)
		slice = append(slice, row...)
		if unsafe.SliceData(slice) != old && oldLen > 0 {
			moves++
			copied += uint64(oldLen) * 4
		}
	}

	bar := progress.New(progressTo, int64(n), "grow")
	defer bar.Close() // ends the line before an error is printed
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rows\tarena ns/step\tappend ns/step\tappend/arena\tarena slowest step\tappend slowest step\t")
	var arenaAll, sliceAll time.Duration
	var ad, sd decade
	prev, next := 0, 1 // the line before ended at prev rows; the next ends at next
	for r := 0; r < n; r++ {
		for i := range row {
			row[i] = float32(r)
		}
		// Alternate which side goes first, so neither always meets a warm
		// cache.
		var ta, ts time.Duration
		if r%2 == 0 {
			t0 := time.Now()
			if err := growArena(r); err != nil {
				return err
			}
			t1 := time.Now()
			growSlice()
			ta, ts = t1.Sub(t0), time.Since(t1)
		} else {
			t0 := time.Now()
			growSlice()
			t1 := time.Now()
			if err := growArena(r); err != nil {
				return err
			}
			ts, ta = t1.Sub(t0), time.Since(t1)
		}
		ad.add(ta)
		sd.add(ts)
		if r+1 == next || r+1 == n {
			steps := int64(r + 1 - prev)
			fmt.Fprintf(tw, "%d\t%d\t%d\t%.3g\t%s\t%s\t\n", r+1,
				ad.total.Nanoseconds()/steps, sd.total.Nanoseconds()/steps,
				float64(sd.total)/float64(ad.total), ad.slowest, sd.slowest)
			arenaAll += ad.total
			sliceAll += sd.total
			ad, sd = decade{}, decade{}
			prev, next = r+1, next*10
		}
		if (r+1)%progressRows == 0 {
			bar.Set(int64(r + 1))
		}
	}
	bar.Done()
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(each line: the steps since the line before; append/arena is the ratio of their times.")
	fmt.Fprintln(w, " The arena's slowest steps map a fresh chunk; append's copy the whole slice into a larger one.)")

	st := a.Stats()
	fmt.Fprintf(w, "\nTotal: arena %s, append %s (append/arena %.2f).\n",
		arenaAll.Round(time.Millisecond), sliceAll.Round(time.Millisecond), float64(sliceAll)/float64(arenaAll))
	fmt.Fprintf(w, "The arena mapped %d chunks (%s committed) and moved nothing: its base stayed at %s for all %d steps.\n",
		st.ChunkMaps, units.Bytes(st.Committed), base, n)
	fmt.Fprintf(w, "append moved the slice %d times, copying %s in total.\n", moves, mib(copied))

	// Row 0, as the first AppendRows returned it, still reads what was
	// written a million steps ago: nothing was copied or remapped under it.
	d0, err := tensor.Data[float32](first)
	if err != nil {
		return err
	}
	all, err := g.Tensor()
	if err != nil {
		return err
	}
	last, err := all.At(n-1, rowLen-1)
	if err != nil {
		return err
	}
	if d0[0] != 0 || d0[rowLen-1] != 0 || first.Addr() != base || all.Addr() != base || last != float64(n-1) {
		return errors.AssertionFailedf("row 0 reads %v..%v at %s, row %d reads %v", d0[0], d0[rowLen-1], first.Addr(), n-1, last)
	}
	if slice[0] != 0 || slice[len(slice)-1] != float32(n-1) {
		return errors.AssertionFailedf("the slice's rows do not read back")
	}
	fmt.Fprintf(w, "Row 0, through the tensor the first step returned, still reads its values at %s; row %d reads %v.\n",
		first.Addr(), n-1, last)
	if peak, ok := peakResident(); ok {
		fmt.Fprintf(w, "The process's peak resident memory was %s.\n", mib(peak))
	}
	return g.Check()
}

// mib formats n in MiB, rounded, for figures that are not exact.
func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/float64(units.MiB)) }

// peakResident is the process's peak resident set (VmHWM), when the
// kernel reports it.
func peakResident() (uint64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * units.KiB, err == nil
		}
	}
	return 0, false
}
