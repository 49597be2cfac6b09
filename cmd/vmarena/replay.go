package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/progress"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/replay"
)

const replayUsage = `usage: vmarena replay --trace FILE|DIR [--trace FILE|DIR ...] [--synthetic random-lifetimes [--seed 1] [--events 100000]]
                      [--granularity 2MiB] [--capacity 80GiB]
                      [--policy default|ascend|ascend-media] [--no-stitch] [--slack-divisor 256]
                      [--driver sim|host|cuda|acl] [--library PATH] [--report FILE] [--json]

Replays PyTorch allocator traces (CSV: seq,device,op,size,addr,alloc_id,stream,
time_us,device_free; or the pickle torch.cuda.memory._dump_snapshot writes,
read without running any of it) through vmarena's allocator on the sim driver,
each device of a trace on a sim device of its own with the given capacity, and
prints what vmarena did beside what PyTorch did: one column per device of each
trace, then the largest allocations live at each device's peak. A directory
stands for every .csv and .pickle file in it, in name order. A trace that
fails stops the run; the table still shows what was replayed.

--synthetic random-lifetimes replays a workload generated from --seed, beside
the traces or alone: --events allocs and frees (100,000) of sizes log-uniform
from 512 B to 4 GiB with random lifetimes, about 56 GiB live and never more
than 80 GiB. Its PyTorch figures are a model's: the segments PyTorch's caching
allocator (CUDACachingAllocator.cpp's defaults, no expandable segments) makes
for the same events on a device of --capacity, and its oom events where that
device could not hold them; the column says "PyTorch modelled".

The table prices the driver calls of both sides per call by two tables:
published A100 figures (cuMemCreate 193.32 µs, cuMemMap 1.45 µs,
cuMemSetAccess 35.99 µs, cuMemUnmap 25.63 µs; cuMemRelease unpriced) and
figures measured on an H100 (cuMemCreate 16.71 µs, cuMemMap 4.02 µs,
cuMemSetAccess 31.29 µs, cuMemUnmap 22.25 µs, cuMemRelease 16.39 µs), and
gives vmarena's time over PyTorch's for each: vmarena's calls as the sim
driver counted them (n/a on another driver), PyTorch's from the trace's
segment events as expandable segments make them (2 MiB pages for a segment
of at most 2 MiB, else 20 MiB pages, one access grant an event). A trace
without segment events says nothing of PyTorch's calls: "unknown". A trace
that starts mid-run does not show the segments made before recording: its
ratio is n/a.

With --driver host, cuda or acl the trace's devices are real ones (the host
driver's logical devices, GPUs, NPUs) and their memory is committed: each
device holds what the device has (--capacity caps it), and a trace that needs
more fails. The sim driver (the default) replays devices of any capacity.
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

// policyFlag is the allocator's policy, by name.
type policyFlag replay.Policy

func (p *policyFlag) String() string { return replay.Policy(*p).String() }
func (p *policyFlag) Set(v string) error {
	pol, err := replay.ParsePolicy(v)
	*p = policyFlag(pol)
	return err
}

// replayCmd runs `vmarena replay`: 0 when every trace replayed, 1 when a
// trace could not be read or replayed, 2 on bad usage.
func replayCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("replay", stderr)
	var files filesFlag
	var policy policyFlag
	granularity, capacity := sizeFlag(replay.TargetGranularity), sizeFlag(80*units.GiB)
	drvName := driverFlag("sim")
	fs.Var(&files, "trace", "an allocator trace `FILE` (CSV, or a PyTorch snapshot pickle), or a directory of them; give several to compare them side by side")
	fs.Var(&granularity, "granularity", "the devices' granularity and the allocator's chunk size, a `SIZE` such as 2MiB or 64KiB")
	fs.Var(&capacity, "capacity", "each device's capacity and the allocator's maximum, a `SIZE` such as 80GiB (on host, cuda and acl: a cap on the device's own)")
	fs.Var(&policy, "policy", "the allocator's size and alignment `POLICY`: default, ascend or ascend-media")
	noStitch := fs.Bool("no-stitch", false, "turn the allocator's stitching of free chunks off")
	slackDiv := fs.Uint64("slack-divisor", 256, "the allocator keeps at most live/`N` (and at least a chunk) committed beyond what is live when it commits more")
	fs.Var(&drvName, "driver", "the `DRIVER` to replay on: "+orList(driverNames))
	library := fs.String("library", "", "the vendor library to load for --driver cuda or acl, a `PATH` or soname")
	report := fs.String("report", "", "also write an HTML report to `FILE`: each device's memory over its events and its allocator's memory map at the peak, and the table")
	synthetic := fs.String("synthetic", "", "also replay a synthetic `WORKLOAD` generated from --seed: "+orList(replay.Workloads))
	seed := fs.Uint64("seed", 1, "the `SEED` the --synthetic workload is drawn from")
	nEvents := fs.Int("events", replay.DefaultSyntheticEvents, "how many events (`N`) the --synthetic workload has")
	jsonOut := fs.Bool("json", false, jsonHelp)
	if code, ok := parseFlags(fs, "replay", replayUsage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vmarena replay: unexpected argument %q (traces are given with --trace)\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var synthFlags []string // those given of the flags only --synthetic uses
	for _, name := range []string{"seed", "events"} {
		if given[name] {
			synthFlags = append(synthFlags, "--"+name)
		}
	}
	synthVerb := "is"
	if len(synthFlags) > 1 {
		synthVerb = "are"
	}
	switch {
	case len(files) == 0 && *synthetic == "":
		fmt.Fprintf(stderr, "vmarena replay: no trace given (--trace FILE|DIR, or --synthetic WORKLOAD)\n")
		fs.Usage()
		return 2
	case len(synthFlags) > 0 && *synthetic == "":
		fmt.Fprintf(stderr, "vmarena replay: %s %s for --synthetic, and no synthetic workload is given\n", strings.Join(synthFlags, " and "), synthVerb)
		fs.Usage()
		return 2
	case *synthetic != "" && !slices.Contains(replay.Workloads, *synthetic):
		fmt.Fprintf(stderr, "vmarena replay: --synthetic %q: unknown workload, want %s\n", *synthetic, orList(replay.Workloads))
		fs.Usage()
		return 2
	case *synthetic != "" && (*nEvents < 1 || *nEvents > replay.MaxSyntheticEvents):
		fmt.Fprintf(stderr, "vmarena replay: --events %d: want 1 to %d\n", *nEvents, replay.MaxSyntheticEvents)
		fs.Usage()
		return 2
	}
	if err := (replay.Options{Capacity: uint64(capacity), Granularity: uint64(granularity)}).Check(); err != nil {
		fmt.Fprintf(stderr, "vmarena replay: --%v\n", err)
		fs.Usage()
		return 2
	}
	if *library != "" && !vendor(string(drvName)) {
		fmt.Fprintf(stderr, "vmarena replay: --library is for --driver cuda or acl; the %s driver loads no library\n", drvName)
		fs.Usage()
		return 2
	}
	if err := checkReport(*report); err != nil {
		fmt.Fprintf(stderr, "vmarena replay: --report %v\n", err)
		fs.Usage()
		return 2
	}
	names, err := traceFiles(files)
	if err != nil {
		fmt.Fprintf(stderr, "vmarena replay: %v\n", err)
		return 1
	}

	opts := replay.Options{Capacity: uint64(capacity), Granularity: uint64(granularity),
		Policy: replay.Policy(policy), NoStitch: *noStitch, SlackDivisor: *slackDiv, CheckEvery: 1000, Verify: true}
	if *slackDiv == 0 {
		fmt.Fprintf(stderr, "vmarena replay: --slack-divisor 0: give a divisor of at least 1\n")
		fs.Usage()
		return 2
	}
	opts.Record = *report != ""
	on := replayOn{backend: backend{name: string(drvName), library: *library}, progress: stderr}
	on.capped = given["capacity"]
	var cols []column
	add := func(trace, base string, modelled bool, res replay.Result) {
		for _, d := range res.Devices {
			label := base
			if len(res.Devices) > 1 || d.Device != 0 {
				label = fmt.Sprintf("%s [dev %d]", base, d.Device)
			}
			cols = append(cols, column{label: label, d: d, capacity: res.Options.Capacity, space: res.SpaceCalls,
				trace: trace, stopped: base != trace, modelled: modelled})
		}
	}
	failed := false // a trace that failed stops the run; the table still shows what was replayed
	for _, name := range names {
		res, err := on.replayFile(name, opts)
		if err != nil {
			fmt.Fprintf(stderr, "vmarena replay: %s: %v\n", name, err)
			if len(res.Devices) > 0 {
				add(traceLabel(name), stoppedLabel(traceLabel(name), res), false, res)
			}
			failed = true
			break
		}
		add(traceLabel(name), traceLabel(name), false, res)
	}
	if *synthetic != "" && !failed {
		label := fmt.Sprintf("%s (seed %d, PyTorch modelled)", *synthetic, *seed)
		workload, err := replay.Synthetic(*synthetic, *seed, *nEvents)
		if err == nil {
			workload, err = replay.WithModelledSegments(workload, opts.Capacity)
		}
		var res replay.Result
		if err == nil {
			res, err = on.replayEvents(label, workload, opts)
		}
		if err != nil {
			fmt.Fprintf(stderr, "vmarena replay: %s: %v\n", label, err)
			if len(res.Devices) > 0 {
				add(label, stoppedLabel(label, res), true, res)
			}
			failed = true
		} else {
			add(label, label, true, res)
		}
	}
	if failed && len(cols) == 0 {
		return 1
	}
	stitch := "on"
	if *noStitch {
		stitch = "off"
	}
	header := fmt.Sprintf("vmarena replay: sim driver, one %s device per trace device, granularity %s, allocator policy %s, stitching %s, slack live/%d, driver calls priced by %s",
		units.Bytes(opts.Capacity), units.Bytes(opts.Granularity), opts.Policy, stitch, opts.SlackDivisor, sim.A100.Name)
	onDriver := "" // the sim driver's header states the capacity
	if on.name != "sim" {
		header = fmt.Sprintf("vmarena replay: %s driver (%s), one device per trace device, granularity %s, allocator policy %s, stitching %s, slack live/%d",
			on.name, on.devices, units.Bytes(opts.Granularity), opts.Policy, stitch, opts.SlackDivisor)
		onDriver = on.name
	}
	table := replayTable(cols, onDriver)
	if *jsonOut {
		if err := writeJSON(stdout, replayDocument(on.name, on.devices, opts, cols)); err != nil {
			fmt.Fprintf(stderr, "vmarena replay: %v\n", err)
			return 1
		}
	} else {
		fmt.Fprintf(stdout, "%s\n\n", header)
		printWrapped(stdout, table)
		printLargest(stdout, cols)
	}
	if *report != "" {
		if err := writeReport(*report, replayReport(header, cols, table)); err != nil {
			fmt.Fprintf(stderr, "vmarena replay: %v\n", err)
			return 1
		}
	}
	if failed {
		return 1
	}
	return 0
}

// traceLabel is a trace file's column label: its name without the
// directory and the .csv or .pickle extension.
func traceLabel(name string) string {
	base := filepath.Base(name)
	for _, ext := range traceExts {
		base = strings.TrimSuffix(base, ext)
	}
	return base
}

// stoppedLabel is the label of a trace whose replay an error stopped:
// its columns hold what was replayed before.
func stoppedLabel(label string, res replay.Result) string {
	total := 0
	for _, d := range res.Devices {
		total += d.Summary.Events
	}
	return fmt.Sprintf("%s (stopped after %d of %d events)", label, res.Events, total)
}

// traceExts are the file extensions a directory's traces have: PyTorch's
// snapshots as CSV, or as the pickles _dump_snapshot writes.
var traceExts = []string{".csv", ".pickle"}

// replayOn replays traces on a driver: the sim driver replay makes itself,
// or a host, cuda or acl driver opened for each trace with as many devices
// as it names.
type replayOn struct {
	backend
	// capped says --capacity was given: on host, cuda and acl it caps the
	// devices' capacity, which is otherwise the devices' own.
	capped bool
	// devices names the devices of the largest driver opened so far.
	devices string
	most    int
	// progress is where each trace's replay shows a bar, when it is a
	// terminal.
	progress io.Writer
}

// replayFile replays the trace in file name. On host, cuda and acl each
// allocator's maximum (opts.Capacity) becomes the least capacity of the
// devices the trace is replayed on, rounded down to the granularity.
func (on *replayOn) replayFile(name string, opts replay.Options) (replay.Result, error) {
	events, err := replay.ParseFile(name)
	if err != nil {
		return replay.Result{}, err
	}
	if len(events) == 0 {
		return replay.Result{}, errors.Wrap(driver.ErrInvalid,
			"the trace holds no events, nothing to replay: a CSV trace needs rows after its header, a snapshot needs trace entries (recorded with torch.cuda.memory._record_memory_history)")
	}
	return on.replayEvents(filepath.Base(name), events, opts)
}

// replayEvents replays events, a trace or a synthetic workload called
// name, as replayFile does.
func (on *replayOn) replayEvents(name string, events []replay.Event, opts replay.Options) (replay.Result, error) {
	bar := progress.New(on.progress, int64(len(events)), "replay "+name)
	defer bar.Close() // ends the line before an error is printed
	opts.Progress = func(done, _ int) { bar.Set(int64(done)) }
	if on.name == "sim" {
		return replay.Replay(events, opts)
	}
	want := traceDevices(events)
	drv, err := on.open(want, opts.Granularity, func(uint64) uint64 {
		if on.capped {
			return opts.Capacity
		}
		return 0
	})
	if err != nil {
		return replay.Result{}, err
	}
	res, err := on.replayOpen(drv, events, want, opts)
	return res, errors.CombineErrors(err, drv.Close())
}

// replayOpen replays events on drv, whose first want devices stand for
// the trace's.
func (on *replayOn) replayOpen(drv driver.Driver, events []replay.Event, want int, opts replay.Options) (replay.Result, error) {
	devs := drv.Devices()
	if len(devs) < want {
		return replay.Result{}, errors.Wrapf(driver.ErrNoDevice, "the trace names %d devices and the %s driver has %s",
			want, drv.Name(), plural(len(devs), "device"))
	}
	devs = devs[:want]
	if len(devs) > on.most {
		on.most, on.devices = len(devs), deviceNames(devs)
	}
	if g := drv.Granularity(); opts.Granularity%g != 0 {
		return replay.Result{}, errors.WithHint(
			errors.Wrapf(driver.ErrMisaligned, "--granularity %s is not a multiple of the %s driver's granularity %s",
				units.Bytes(opts.Granularity), drv.Name(), units.Bytes(g)),
			"give --granularity a multiple of it")
	}
	held := devs[0].Capacity
	for _, d := range devs {
		held = min(held, d.Capacity)
	}
	opts.Capacity = held - held%opts.Granularity
	if opts.Capacity == 0 {
		return replay.Result{}, errors.Wrapf(driver.ErrOutOfMemory, "the %s driver's devices hold %s, less than the granularity %s",
			drv.Name(), units.Bytes(held), units.Bytes(opts.Granularity))
	}
	res, err := replay.ReplayOn(drv, events, opts)
	if errors.Is(err, driver.ErrOutOfMemory) {
		return res, errors.WithHint(
			errors.Wrapf(err, "the trace does not fit in the %s driver's devices of %s", drv.Name(), units.Bytes(opts.Capacity)),
			"replay it on the sim driver (the default), whose devices hold what --capacity says")
	}
	return res, err
}

// traceDevices is how many devices the events name.
func traceDevices(events []replay.Event) int {
	seen := map[int]bool{}
	for _, ev := range events {
		seen[ev.Device] = true
	}
	return max(1, len(seen))
}

// traceFiles expands the --trace arguments: a directory stands for the
// .csv and .pickle files in it, in name order.
func traceFiles(args []string) ([]string, error) {
	var names []string
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil || !fi.IsDir() {
			names = append(names, a) // replayFile says what is wrong with it
			continue
		}
		entries, err := os.ReadDir(a)
		if err != nil {
			return nil, err
		}
		n := len(names)
		for _, e := range entries {
			if !e.IsDir() && slices.ContainsFunc(traceExts, func(ext string) bool { return strings.HasSuffix(e.Name(), ext) }) {
				names = append(names, filepath.Join(a, e.Name()))
			}
		}
		if len(names) == n {
			return nil, errors.Newf("%s: a directory with no .csv or .pickle file in it", a)
		}
	}
	return names, nil
}

// column is one device of one trace in the table, the capacity its
// allocator could commit, and the address space calls of the trace's
// replay (all its devices').
type column struct {
	label    string
	d        replay.DeviceResult
	capacity uint64
	space    sim.Calls
	// trace is the trace's name; stopped says an error stopped its
	// replay (the column holds what was replayed before).
	trace   string
	stopped bool
	// modelled says PyTorch's segment events are internal/cachingmodel's
	// (replay.WithModelledSegments), not a trace's.
	modelled bool
}

// replayTable is the table vmarena replay prints (and its report shows):
// one column per device of each trace, one row per figure, the first row
// naming the columns; on a driver other than sim (onDriver) also each
// device's capacity, which the sim driver's header states once.
func replayTable(cols []column, onDriver string) [][]string {
	var table [][]string
	row := func(label string, cell func(d replay.DeviceResult) string) {
		cells := []string{label}
		for _, c := range cols {
			cells = append(cells, cell(c.d))
		}
		table = append(table, cells)
	}
	names := []string{"trace"}
	for _, c := range cols {
		names = append(names, c.label)
	}
	table = append(table, names)
	if onDriver != "" {
		cells := []string{fmt.Sprintf("device capacity (%s)", onDriver)}
		for _, c := range cols {
			cells = append(cells, units.Bytes(c.capacity))
		}
		table = append(table, cells)
	}
	count := func(n int) string { return fmt.Sprint(n) }
	row("events", func(d replay.DeviceResult) string { return count(d.Summary.Events) })
	row("allocs / frees replayed", func(d replay.DeviceResult) string { return fmt.Sprintf("%d / %d", d.Allocs, d.Frees) })
	row("frees of unknown alloc_id (skipped)", func(d replay.DeviceResult) string { return count(d.SkippedFrees) })
	row("starts mid-run", midRun)
	row("frees disagreeing with their alloc (addr or size)", func(d replay.DeviceResult) string { return count(d.Summary.MismatchedFrees) })
	row("PyTorch out of memory at (vmarena)", ooms)
	row("peak allocated (trace)", func(d replay.DeviceResult) string { return approx(d.Summary.PeakAllocated) })
	row("peak committed (vmarena)", func(d replay.DeviceResult) string { return approx(d.Figures.PeakCommitted) })
	// Four decimals: the target is 1.01, and 1.0104 misses it.
	row("committed / allocated (vmarena)", func(d replay.DeviceResult) string { return fmt.Sprintf("%.4f", d.Ratio()) })
	row("peak reserved (PyTorch)", reservedCell)
	row("reserved / allocated (PyTorch)", func(d replay.DeviceResult) string {
		switch x, ok := d.Summary.PyTorchRatio(); {
		case ok:
			return fmt.Sprintf("%.3f", x)
		case d.Summary.MidRun():
			return "n/a"
		}
		return "unknown"
	})
	row("segment events (PyTorch)", func(d replay.DeviceResult) string { return count(d.Summary.SegmentEvents) })
	row("map events (vmarena)", func(d replay.DeviceResult) string { return count(d.Figures.MapEvents) })
	row("unmap events (vmarena)", func(d replay.DeviceResult) string { return count(d.Figures.UnmapEvents) })
	row("map + unmap events (vmarena)", func(d replay.DeviceResult) string { return count(d.Figures.MapUnmapEvents()) })
	row("chunk maps (driver calls)", func(d replay.DeviceResult) string { return count(d.Figures.ChunkMaps) })
	row("chunk unmaps (driver calls)", func(d replay.DeviceResult) string { return count(d.Figures.ChunkUnmaps) })
	row("decommit calls", func(d replay.DeviceResult) string { return count(d.Figures.Decommits) })
	row("decommitted", func(d replay.DeviceResult) string { return approx(d.Figures.DecommittedBytes) })
	row("stitches", func(d replay.DeviceResult) string { return count(d.Figures.Stitches) })
	row("grows (commits)", func(d replay.DeviceResult) string { return count(d.Figures.Grows) })
	row("OOM retries", func(d replay.DeviceResult) string { return count(d.Figures.OOMRetries) })
	row("driver calls (vmarena): "+callKinds, func(d replay.DeviceResult) string {
		if !d.Priced {
			return "n/a"
		}
		return calls(d.DriverCalls)
	})
	row("driver calls (PyTorch, modelled): "+callKinds, func(d replay.DeviceResult) string {
		if d.Summary.SegmentEvents == 0 {
			return "unknown"
		}
		return calls(d.Summary.SegmentCalls)
	})
	spaceCells := []string{"address reserves / frees (vmarena, all the trace's devices)"}
	for _, c := range cols {
		cell := "n/a"
		if c.d.Priced {
			cell = fmt.Sprintf("%d / %d", c.space.Reserve, c.space.Unreserve)
		}
		spaceCells = append(spaceCells, cell)
	}
	table = append(table, spaceCells)
	for _, costs := range replay.PriceTables {
		table := tableName(costs)
		row("modelled driver time on "+table+" (vmarena)", func(d replay.DeviceResult) string {
			if dt := d.DriverTimesBy(costs); dt.Priced {
				return duration(dt.VMArena)
			}
			return "n/a"
		})
		row("modelled driver time on "+table+" (PyTorch)", func(d replay.DeviceResult) string {
			if dt := d.DriverTimesBy(costs); dt.PyTorchKnown {
				return duration(dt.PyTorch)
			}
			return "unknown"
		})
		row("modelled driver time on "+table+", vmarena ÷ PyTorch", func(d replay.DeviceResult) string {
			dt := d.DriverTimesBy(costs)
			if x, ok := dt.Ratio(); ok {
				return fmt.Sprintf("%.2f", x)
			}
			switch {
			case !dt.Priced:
				return "n/a"
			case !dt.PyTorchKnown:
				return "unknown"
			case dt.MidRun:
				return "n/a (mid-run)"
			}
			return "n/a"
		})
	}
	row(fmt.Sprintf("target: committed / allocated ≤ %.2f at %s", replay.TargetRatio, units.Bytes(replay.TargetGranularity)),
		func(d replay.DeviceResult) string { return string(d.RatioTarget()) })
	row("target: map + unmap events ≤ segment events", func(d replay.DeviceResult) string { return string(d.MapEventsTarget()) })
	row("target: modelled driver time ≤ PyTorch's", func(d replay.DeviceResult) string { return string(d.DriverTimeTarget()) })
	return table
}

// tableName is a table of call costs by its first word (A100, H100).
func tableName(c sim.CallCosts) string {
	if f := strings.Fields(c.Name); len(f) > 0 {
		return f[0]
	}
	return "unnamed table"
}

// callKinds names the counts calls writes, in its order.
const callKinds = "create / map / set access / unmap / release"

// calls is a device's driver calls of each kind (callKinds).
func calls(c sim.Calls) string {
	return fmt.Sprintf("%d / %d / %d / %d / %d", c.Create, c.Map, c.SetAccess, c.Unmap, c.Release)
}

// duration formats a modelled time with two decimals in the largest unit
// it reaches (s, ms, µs): the table compares magnitudes.
func duration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f µs", float64(d)/float64(time.Microsecond))
}

// reservedCell is PyTorch's peak reserved memory, or "unknown" for a
// trace without segment events.
func reservedCell(d replay.DeviceResult) string {
	if d.Summary.SegmentEvents == 0 {
		return "unknown"
	}
	return approx(d.Summary.PeakReserved)
}

// midRun says whether, and why, a device's trace starts mid-run.
func midRun(d replay.DeviceResult) string {
	s := d.Summary
	var why []string
	switch n := s.FreedBeforeRecording; n {
	case 0:
	case 1:
		why = append(why, "1 free of an allocation made before recording")
	default:
		why = append(why, fmt.Sprintf("%d frees of allocations made before recording", n))
	}
	if s.ReservedBelowZero {
		why = append(why, "segments returned that were reserved before recording")
	}
	if len(why) == 0 {
		return "no"
	}
	return strings.Join(why, "; ")
}

// maxOOMs is how many of a device's OOMs the table names; the rest are
// counted.
const maxOOMs = 3

// ooms names the events at which PyTorch ran out of memory, and whether
// vmarena served the same request there.
func ooms(d replay.DeviceResult) string {
	if len(d.OOMs) == 0 {
		return "none"
	}
	var each []string
	for i, o := range d.OOMs {
		if i == maxOOMs {
			each = append(each, fmt.Sprintf("%d more", len(d.OOMs)-maxOOMs))
			break
		}
		served := "served"
		if !o.Served {
			served = "not served"
		}
		each = append(each, fmt.Sprintf("line %d (seq %d): %s", o.Line, o.Seq, served))
	}
	return strings.Join(each, "; ")
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
