package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/internal/units"
)

const topUsage = `usage: vmarena top --book PATH [--interval DURATION] [--count N] [--json]

Shows each member of the shared device budget at PATH: its committed and
idle memory, floor and ceiling, and how often it was asked to give back.
It redraws every interval (plain ANSI) until interrupted, or --count
times; --json prints one JSON document once.
`

const budgetUsage = `usage: vmarena budget set|simulate

  set       change a member's floor or ceiling:
            vmarena budget set --book PATH --member NAME [--floor SIZE] [--ceiling SIZE]
  simulate  two servers whose peaks alternate, on a static half each and
            on one elastic budget, in lock step: vmarena budget simulate [--json]
`

const budgetSetUsage = `usage: vmarena budget set --book PATH --member NAME [--floor SIZE] [--ceiling SIZE]

Changes the floor or ceiling (or both) of the member NAME of the budget at
PATH; a size is bytes or a unit (512MiB, 4GiB). A ceiling below what the
member holds, or a floor the others leave no room for, is refused and
nothing changes.
`

const budgetSimUsage = `usage: vmarena budget simulate [--steps N] [--seed N] [--floor PAGES] [--floors LIST] [--kinds KIND,KIND] [--json]

Runs two serving processes (this program re-executed), each a KV cache
(kvcache.Cache on a sim driver of the whole device; with --kinds, either
may be a kvcache.Hybrid of full-attention and recurrent layers instead:
cache,hybrid) joined to one book,
whose request rates peak in turn, in lock step: with a static half of
the device each, then on one elastic budget (ceiling all of it, floor
--floor pages, 0 by default), where one takes the other's cached and idle
pages when its peak needs them; then again at each floor of --floors;
and, where the two kinds are the same, one server of that kind serving
both traces on the whole device, the most any sharing of the device
serves with these servers. Prints the requests each configuration served
within the same TTFT bound, their ratios, the servers' CPU time beside
the wall time, and whether the books or a device were ever
over-committed.
`

// topDocument is vmarena top --json.
type topDocument struct {
	Book          string        `json:"book"`
	CapacityBytes uint64        `json:"capacity_bytes"`
	Members       []budget.Info `json:"members"`
}

func topCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("top", stderr)
	path := fs.String("book", "", "the budget's book file, a `PATH`")
	interval := fs.Duration("interval", time.Second, "the time between redraws")
	count := fs.Int("count", 0, "redraw this many times, then exit (0: until interrupted)")
	jsonOut := fs.Bool("json", false, jsonHelp)
	if code, ok := parseFlags(fs, "top", topUsage, args, stdout, stderr); !ok {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return usageError(stderr, "top", "unexpected argument %q", fs.Arg(0))
	case *path == "":
		return usageError(stderr, "top", "no book given (--book PATH)")
	case *interval <= 0:
		return usageError(stderr, "top", "--interval %v: not positive", *interval)
	case *count < 0:
		return usageError(stderr, "top", "--count %d: negative", *count)
	}
	b, err := budget.Open(*path, budget.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "vmarena top: %v\n", err)
		return 1
	}
	defer b.Close()
	if *jsonOut {
		in, err := b.Members()
		if err != nil {
			fmt.Fprintf(stderr, "vmarena top: %v\n", err)
			return 1
		}
		if in == nil {
			in = []budget.Info{}
		}
		if err := writeJSON(stdout, topDocument{Book: *path, CapacityBytes: b.Capacity(), Members: in}); err != nil {
			fmt.Fprintf(stderr, "vmarena top: %v\n", err)
			return 1
		}
		return 0
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	defer signal.Stop(stop)
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			select {
			case <-stop:
				return 0
			case <-time.After(*interval):
			}
		}
		in, err := b.Members()
		if err != nil {
			fmt.Fprintf(stderr, "vmarena top: %v\n", err)
			return 1
		}
		// Each redraw is one write; one that fails ends the command,
		// which would otherwise redraw into the failing output for ever.
		var frame bytes.Buffer
		frame.WriteString("\x1b[H\x1b[2J") // home, clear
		printTop(&frame, *path, b.Capacity(), in)
		if _, err := stdout.Write(frame.Bytes()); err != nil {
			fmt.Fprintf(stderr, "vmarena top: %v\n", err)
			return 1
		}
	}
	return 0
}

func printTop(w io.Writer, path string, capacity uint64, in []budget.Info) {
	var committed, idle uint64
	for _, m := range in {
		committed += m.Committed
		idle += m.Idle
	}
	fmt.Fprintf(w, "budget %s: %s, %s committed (%s idle), %d members\n\n",
		path, units.Bytes(capacity), units.Bytes(committed), units.Bytes(idle), len(in))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "member\tpid\tcommitted\tidle\tfloor\tceiling\tasked\tgave back\t")
	for _, m := range in {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t\n", m.Name, m.PID, units.Bytes(m.Committed), units.Bytes(m.Idle),
			units.Bytes(m.Floor), units.Bytes(m.Ceiling), m.Asked, units.Bytes(m.GivenBack))
	}
	_ = tw.Flush()
}

func budgetCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageError(stderr, "budget", "no subcommand, want set or simulate")
	}
	switch args[0] {
	case "set":
		return budgetSet(args[1:], stdout, stderr)
	case "simulate":
		return budgetSimulate(args[1:], stdout, stderr)
	case "-h", "--help", "-help":
		fmt.Fprint(stdout, budgetUsage)
		return 0
	}
	return usageError(stderr, "budget", "unknown subcommand %q, want set or simulate", args[0])
}

func budgetSet(args []string, stdout, stderr io.Writer) int {
	const name = "budget set"
	fs := newFlags(name, stderr)
	path := fs.String("book", "", "the budget's book file, a `PATH`")
	member := fs.String("member", "", "the member's `NAME`")
	floorArg := fs.String("floor", "", "the new floor, a `SIZE` (unchanged when not given)")
	ceilArg := fs.String("ceiling", "", "the new ceiling, a `SIZE` (unchanged when not given)")
	if code, ok := parseFlags(fs, name, budgetSetUsage, args, stdout, stderr); !ok {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return usageError(stderr, name, "unexpected argument %q", fs.Arg(0))
	case *path == "":
		return usageError(stderr, name, "no book given (--book PATH)")
	case *member == "":
		return usageError(stderr, name, "no member given (--member NAME)")
	case *floorArg == "" && *ceilArg == "":
		return usageError(stderr, name, "nothing to set: give --floor, --ceiling or both")
	}
	// The sizes are checked before the book is opened: a bad one is a
	// usage error whatever the book.
	var newFloor, newCeiling uint64
	for _, f := range []struct {
		flag, arg string
		to        *uint64
	}{{"floor", *floorArg, &newFloor}, {"ceiling", *ceilArg, &newCeiling}} {
		if f.arg == "" {
			continue
		}
		n, err := units.Parse(f.arg)
		if err != nil {
			return usageError(stderr, name, "--%s %q: %v", f.flag, f.arg, err)
		}
		*f.to = n
	}
	b, err := budget.Open(*path, budget.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "vmarena %s: %v\n", name, err)
		return 1
	}
	defer b.Close()
	in, err := b.Members()
	if err != nil {
		fmt.Fprintf(stderr, "vmarena %s: %v\n", name, err)
		return 1
	}
	var floor, ceiling uint64
	found := false
	for _, m := range in {
		if m.Name == *member {
			floor, ceiling, found = m.Floor, m.Ceiling, true
		}
	}
	if !found {
		fmt.Fprintf(stderr, "vmarena %s: budget: no member named %q in %s\n", name, *member, *path)
		return 1
	}
	if *floorArg != "" {
		floor = newFloor
	}
	if *ceilArg != "" {
		ceiling = newCeiling
	}
	if err := b.SetLimits(*member, floor, ceiling); err != nil {
		fmt.Fprintf(stderr, "vmarena %s: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: floor %s, ceiling %s\n", *member, units.Bytes(floor), units.Bytes(ceiling))
	return 0
}

// simDocument is vmarena budget simulate --json.
type simDocument struct {
	Config      simConfig `json:"config"`
	Static      simResult `json:"static"`
	Elastic     simResult `json:"elastic"`
	ServedRatio float64   `json:"served_ratio"`
	// Pooled is one server of the same kind serving both traces on the
	// whole device (both servers' slots): what any way of sharing the
	// device serves at most with these servers' admission. PooledRatio
	// is the elastic budget's served over it, BoundRatio its served
	// over the static halves' (the most served_ratio could be). Absent
	// where the two servers' kinds differ.
	Pooled           *simResult `json:"pooled,omitempty"`
	PooledRatio      float64    `json:"elastic_of_pooled,omitempty"`
	BoundRatio       float64    `json:"pooled_ratio,omitempty"`
	TTFTBoundSeconds float64    `json:"ttft_bound_s"`
	// Floors are the elastic budget at each floor of --floors (the
	// same ceiling, the same traces), beside the static halves.
	Floors []floorResult `json:"floors"`
}

// floorResult is the elastic budget at one floor.
type floorResult struct {
	Floor       int     `json:"floor_pages"`
	Served      int     `json:"served"`
	ServedRatio float64 `json:"served_ratio"` // to the static halves
	OverCommits int     `json:"over_commits"`
	PeakPages   int     `json:"peak_committed_pages"`
}

func budgetSimulate(args []string, stdout, stderr io.Writer) int {
	const name = "budget simulate"
	cfg := defaultSim()
	fs := newFlags(name, stderr)
	steps := fs.Int("steps", cfg.Steps, "the simulation's steps")
	seed := fs.Uint64("seed", cfg.Seed, "the traces' seed")
	floor := fs.Int("floor", cfg.Floor, "the elastic budget's floor of each server, in pages")
	floors := fs.String("floors", "0,8,16", "the floors, in pages, to run the elastic budget at besides (a comma-separated `LIST`; empty: none)")
	kinds := fs.String("kinds", "cache,cache", "the two servers' KV caches (`KIND,KIND`): cache (kvcache.Cache) or hybrid (kvcache.Hybrid: the same attention layers and two recurrent ones)")
	jsonOut := fs.Bool("json", false, jsonHelp)
	if code, ok := parseFlags(fs, name, budgetSimUsage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, name, "unexpected argument %q", fs.Arg(0))
	}
	if *steps <= 0 || *steps > 1_000_000 {
		return usageError(stderr, name, "--steps %d: 1 to 1000000", *steps)
	}
	if *floor < 0 || *floor > cfg.Pages/2 {
		return usageError(stderr, name, "--floor %d: 0 to %d pages (half the device)", *floor, cfg.Pages/2)
	}
	cfg.Floors = nil
	for _, f := range strings.FieldsFunc(*floors, func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > cfg.Pages/2 {
			return usageError(stderr, name, "--floors %q: %q is not 0 to %d pages", *floors, f, cfg.Pages/2)
		}
		cfg.Floors = append(cfg.Floors, n)
	}
	cfg.Kinds = strings.Split(*kinds, ",")
	if len(cfg.Kinds) != 2 {
		return usageError(stderr, name, "--kinds %q: want two kinds, one a server, as cache,hybrid", *kinds)
	}
	for i, k := range cfg.Kinds {
		cfg.Kinds[i] = strings.TrimSpace(k)
		if cfg.Kinds[i] != simCache && cfg.Kinds[i] != simHybrid {
			return usageError(stderr, name, "--kinds %q: %q is neither cache nor hybrid", *kinds, k)
		}
	}
	cfg.Steps, cfg.Seed, cfg.Floor = *steps, *seed, *floor
	doc, err := simulateBoth(cfg, nil)
	if err != nil {
		fmt.Fprintf(stderr, "vmarena %s: %v\n", name, err)
		return 1
	}
	if *jsonOut {
		if err := writeJSON(stdout, doc); err != nil {
			fmt.Fprintf(stderr, "vmarena %s: %v\n", name, err)
			return 1
		}
		return 0
	}
	printSim(stdout, doc)
	return 0
}

// simulateBoth runs the static and the elastic configuration.
func simulateBoth(cfg simConfig, env []string) (simDocument, error) {
	doc := simDocument{Config: cfg, TTFTBoundSeconds: float64(cfg.TTFTBound*cfg.StepMillis) / 1000}
	self, err := os.Executable()
	if err != nil {
		return doc, err
	}
	half := cfg.Pages / 2
	if doc.Static, err = runSim(cfg, "static half each", half, half, false, self, env); err != nil {
		return doc, err
	}
	if doc.Elastic, err = runSim(cfg, "elastic budget", cfg.Floor, cfg.Pages, false, self, env); err != nil {
		return doc, err
	}
	if cfg.kind(0) == cfg.kind(1) {
		p, err := runSim(cfg, "one server, both traces", 0, cfg.Pages, true, self, env)
		if err != nil {
			return doc, err
		}
		doc.Pooled = &p
		if p.Served > 0 {
			doc.PooledRatio = float64(doc.Elastic.Served) / float64(p.Served)
		}
		if doc.Static.Served > 0 {
			doc.BoundRatio = float64(p.Served) / float64(doc.Static.Served)
		}
	}
	ratio := func(r simResult) float64 {
		if doc.Static.Served == 0 {
			return 0
		}
		return float64(r.Served) / float64(doc.Static.Served)
	}
	doc.ServedRatio = ratio(doc.Elastic)
	for _, f := range cfg.Floors {
		r := doc.Elastic
		if f != cfg.Floor {
			if r, err = runSim(cfg, "elastic budget", f, cfg.Pages, false, self, env); err != nil {
				return doc, err
			}
		}
		doc.Floors = append(doc.Floors, floorResult{Floor: f, Served: r.Served, ServedRatio: ratio(r), OverCommits: r.OverCommits,
			PeakPages: r.PeakPages})
	}
	return doc, nil
}

func printSim(w io.Writer, doc simDocument) {
	c := doc.Config
	fmt.Fprintf(w, "two servers (caches: %s, %s), peaks alternating every %d steps, %d steps of %d ms; device %d pages of %s; TTFT bound %d steps (%.2f s)\n\n",
		c.kind(0), c.kind(1), c.Phase, c.Steps, c.StepMillis, c.Pages, units.Bytes(c.PageBytes), c.TTFTBound, doc.TTFTBoundSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "configuration\tfloor\tceiling\tserved\tarrived\tpeak committed\tover-commits\tgive-backs\tmax acquire wall\tacquires over a step\twall\tCPU")
	rows := []simResult{doc.Static, doc.Elastic}
	if doc.Pooled != nil {
		rows = append(rows, *doc.Pooled)
	}
	for _, r := range rows {
		asks, over, pages := 0, 0, 0
		var maxWall float64
		for _, s := range r.Servers {
			asks += s.Asks
			over += s.AsksOverOneStp
			pages += s.GaveBackPages
			maxWall = max(maxWall, s.MaxAskWallSec)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d (%d pages)\t%.4f s\t%d\t%.2f s\t%.2f s\n", r.Name, r.Floor, r.Ceiling, r.Served, r.Arrived,
			r.PeakPages, r.OverCommits, asks, pages, maxWall, over, r.WallSec, r.CPUSec)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nelastic / static requests served: %.2f× (floor %d pages)\n", doc.ServedRatio, doc.Config.Floor)
	if doc.Pooled != nil {
		fmt.Fprintf(w, "elastic / one server of both traces on the whole device: %.1f%% (that server / static: %.2f×: the most a sharing of the device serves with these servers)\n",
			100*doc.PooledRatio, doc.BoundRatio)
	}
	for _, f := range doc.Floors {
		fmt.Fprintf(w, "  at a floor of %3d pages: %d served, %.2f×, peak committed %d pages, %d over-commits\n",
			f.Floor, f.Served, f.ServedRatio, f.PeakPages, f.OverCommits)
	}
}
