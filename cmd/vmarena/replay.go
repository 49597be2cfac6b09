package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/internal/trace"
	"github.com/vmarena/vmarena/internal/units"
)

const replayUsage = `usage: vmarena replay --trace FILE [--trace FILE ...] [--granularity 2MiB] [--capacity 80GiB] [--no-stitch]

Replays PyTorch allocator traces (CSV: seq,device,op,size,addr,alloc_id,stream,
time_us,device_free) through vmarena's allocator on the sim driver, one device
of the given capacity, and prints what it did beside what PyTorch did.
`

// sizeFlag is a byte size given as 2MiB, 80GiB, 4096.
type sizeFlag uint64

func (s *sizeFlag) String() string { return units.Bytes(uint64(*s)) }
func (s *sizeFlag) Set(v string) error {
	n, err := units.Parse(v)
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.Newf("%q is zero", v)
	}
	*s = sizeFlag(n)
	return nil
}

// filesFlag collects a flag given several times.
type filesFlag []string

func (f *filesFlag) String() string { return strings.Join(*f, ",") }
func (f *filesFlag) Set(v string) error {
	if v == "" {
		return errors.New("empty file name")
	}
	*f = append(*f, v)
	return nil
}

// replayCmd runs `vmarena replay`: 0 when every trace replayed, 1 when a
// trace could not be read or replayed, 2 on bad usage.
func replayCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, replayUsage+"\nflags:\n")
		fs.PrintDefaults()
	}
	var files filesFlag
	granularity, capacity := sizeFlag(trace.TargetGranularity), sizeFlag(80*units.GiB)
	fs.Var(&files, "trace", "an allocator trace `FILE` (CSV); give several to compare them side by side")
	fs.Var(&granularity, "granularity", "the device's granularity and the arena's chunk size, a `SIZE` such as 2MiB or 64KiB")
	fs.Var(&capacity, "capacity", "the device's capacity and the arena's maximum, a `SIZE` such as 80GiB")
	noStitch := fs.Bool("no-stitch", false, "turn the allocator's stitching of free chunks off")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package has said what was wrong
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vmarena replay: unexpected argument %q (traces are given with --trace)\n\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if len(files) == 0 {
		fmt.Fprintf(stderr, "vmarena replay: no trace given\n\n")
		fs.Usage()
		return 2
	}

	opts := trace.ReplayOptions{Capacity: uint64(capacity), Granularity: uint64(granularity), NoStitch: *noStitch,
		CheckEvery: 1000, Verify: true}
	var results []trace.Result
	for _, name := range files {
		res, err := replayFile(name, opts)
		if err != nil {
			fmt.Fprintf(stderr, "vmarena replay: %s: %v\n", name, err)
			return 1
		}
		results = append(results, res)
	}
	stitch := "on"
	if *noStitch {
		stitch = "off"
	}
	fmt.Fprintf(stdout, "vmarena replay: sim driver, one device of %s, granularity %s, allocator policy %s, stitching %s\n\n",
		units.Bytes(opts.Capacity), units.Bytes(opts.Granularity), opts.Policy, stitch)
	printReplay(stdout, files, results)
	return 0
}

func replayFile(name string, opts trace.ReplayOptions) (trace.Result, error) {
	f, err := os.Open(name)
	if err != nil {
		return trace.Result{}, err
	}
	defer f.Close()
	events, err := trace.Parse(f)
	if err != nil {
		return trace.Result{}, err
	}
	return trace.Replay(events, opts)
}

// printReplay prints one column per trace, one row per figure.
func printReplay(w io.Writer, files []string, results []trace.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label string, cell func(r trace.Result) string) {
		cells := []string{label}
		for _, r := range results {
			cells = append(cells, cell(r))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	names := []string{"trace"}
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".csv"))
	}
	fmt.Fprintln(tw, strings.Join(names, "\t"))
	count := func(n int) string { return fmt.Sprint(n) }
	row("events", func(r trace.Result) string { return count(r.Summary.Events) })
	row("allocs / frees replayed", func(r trace.Result) string { return fmt.Sprintf("%d / %d", r.Allocs, r.Frees) })
	row("frees of unknown alloc_id (skipped)", func(r trace.Result) string { return count(r.SkippedFrees) })
	row("peak allocated (trace)", func(r trace.Result) string { return approx(r.Summary.PeakAllocated) })
	row("peak committed (vmarena)", func(r trace.Result) string { return approx(r.Stats.PeakCommitted) })
	row("committed / allocated (vmarena)", func(r trace.Result) string { return fmt.Sprintf("%.3f", r.Ratio()) })
	row("reserved / allocated (PyTorch)", func(r trace.Result) string {
		if x, ok := r.Summary.PyTorchRatio(); ok {
			return fmt.Sprintf("%.3f", x)
		}
		return "—"
	})
	row("peak reserved (PyTorch)", func(r trace.Result) string {
		if r.Summary.SegmentEvents == 0 {
			return "—"
		}
		return approx(r.Summary.PeakReserved)
	})
	row("map calls", func(r trace.Result) string { return count(r.Stats.MapCalls) })
	row("unmap calls", func(r trace.Result) string { return count(r.Stats.UnmapCalls) })
	row("trace segment events", func(r trace.Result) string { return count(r.Summary.SegmentEvents) })
	row("stitches", func(r trace.Result) string { return count(r.Stats.Stitches) })
	row("grows", func(r trace.Result) string { return count(r.Stats.Grows) })
	row(fmt.Sprintf("target: ratio ≤ %.2f at %s", trace.TargetRatio, units.Bytes(trace.TargetGranularity)),
		func(r trace.Result) string { return string(r.RatioTarget()) })
	row("target: map calls ≤ segment events", func(r trace.Result) string { return string(r.MapCallsTarget()) })
	_ = tw.Flush()
}

// approx formats a byte count to two decimals of the largest binary unit it
// reaches (39.03 GiB): the table compares magnitudes, the ratios carry the
// precision.
func approx(n uint64) string {
	for _, u := range []struct {
		name string
		size uint64
	}{{"TiB", units.TiB}, {"GiB", units.GiB}, {"MiB", units.MiB}, {"KiB", units.KiB}} {
		if n >= u.size {
			return fmt.Sprintf("%.2f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
