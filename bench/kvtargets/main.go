// Command kvtargets runs the KV cache's serving targets side by side in
// one run: this cache against the paged scheme (vLLM's block table) in
// vmarena kv simulate's simulation, on the bundled Mooncake slice and on
// generated traces (serving.RequestShapes: long shared prefixes, bursts, a
// budget squeezed by long outputs), at 16 GiB and 80 GiB, for llama3-8b,
// qwen2.5-7b, mistral-7b and deepseek-v3, and prints one row per cell:
// preemptions and waste of both, this cache's TTFT, output rate and CPU
// time as ratios to the paged scheme's, its failed resumes, exposed driver
// time over GPU time and admissions' driver time over their prefill time.
// Both schemes run the scheduler a step ahead (serving.Options.AdmitAhead:
// vmarena kv simulate --admit-ahead), as an engine whose scheduler runs
// while the GPU computes; -admit-ahead=false schedules each step after
// the last, as kv simulate does by default.
//
//	go run ./bench/kvtargets                      # 40 cells, 200 requests a trace
//	go run ./bench/kvtargets -admit-ahead=false   # the same, each step scheduled after the last
//	go run ./bench/kvtargets -warm step           # the page pool warmed with a step's tokens, not the budget
//	go run ./bench/kvtargets -wait-for-none       # no step waits for exposed driver time: what of a gap it makes
//	go run ./bench/kvtargets -requests 50 -models llama3-8b -cpuprofile /tmp/kv.prof
//
// Run it from the repository root (the Mooncake slice is
// serving/testdata/requests/mooncake_synthetic_trace.jsonl, or -mooncake
// FILE). Its cost on a loaded machine is bounded by -requests, each
// trace's first requests. Exit status 1 when a simulation failed, 2 for a
// flag it cannot use; a missed target is a figure, not a failure.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmarena/vmarena/bench"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/serving"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvtargets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mooncake := fs.String("mooncake", "serving/testdata/requests/mooncake_synthetic_trace.jsonl", "the Mooncake trace `FILE`")
	requests := fs.Int("requests", 200, "each trace's first `N` requests")
	seed := fs.Uint64("seed", 1, "the `SEED` of the generated traces")
	models := fs.String("models", strings.Join(bench.KVTargetModels, ","), "the model presets, a comma-separated `LIST`")
	traces := fs.String("traces", "", "only these traces, a comma-separated `LIST` (mooncake, shared-prefix, bursts, squeeze, parallel-sampling; empty: all)")
	prices := fs.String("prices", "a100", "the driver call costs' `TABLE`: "+strings.Join(sim.CostTableNames(), " or "))
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to `FILE`")
	ahead := fs.Bool("admit-ahead", true, "schedule a step ahead, both schemes (false: each step after the last, kv simulate's default)")
	waitNone := fs.Bool("wait-for-none", false, "steps wait for none of the exposed driver time, priced and counted all the same (serving.Options.WaitForNone: what of a TTFT or output gap the exposed time makes)")
	warm := fs.String("warm", "budget", "what this cache's page pool is warmed with before serving: budget (the whole budget, kv simulate's default) or step (a step's tokens, the rest as the load needs it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *warm != "budget" && *warm != "step" {
		fmt.Fprintf(stderr, "kvtargets: -warm %s: want budget or step\n", *warm)
		return 2
	}
	costs, err := sim.CostTable(*prices)
	if err != nil {
		fmt.Fprintf(stderr, "kvtargets: -prices %s: want %s\n", *prices, strings.Join(sim.CostTableNames(), " or "))
		return 2
	}
	if *requests < 1 {
		fmt.Fprintf(stderr, "kvtargets: -requests %d: want at least 1\n", *requests)
		return 2
	}
	all, err := bench.KVTargetTraces(*mooncake, *requests, *seed)
	if err != nil {
		fmt.Fprintf(stderr, "kvtargets: %v\n", err)
		return 1
	}
	if *traces != "" {
		want := strings.Split(*traces, ",")
		for _, name := range want {
			if !slices.ContainsFunc(all, func(tr bench.KVTrace) bool { return tr.Name == name }) {
				fmt.Fprintf(stderr, "kvtargets: -traces: no trace %q, want mooncake or %s\n", name, strings.Join(serving.RequestShapes, ", "))
				return 2
			}
		}
		all = slices.DeleteFunc(all, func(tr bench.KVTrace) bool { return !slices.Contains(want, tr.Name) })
	}
	for _, model := range strings.Split(*models, ",") {
		if _, err := serving.ModelPreset(model); err != nil {
			fmt.Fprintf(stderr, "kvtargets: -models: %v\n", err)
			return 2
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "kvtargets: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "kvtargets: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	schedule := "both schemes scheduled a step ahead (admissions, prompt chunks' reservations and frees during the step before: kv simulate --admit-ahead)"
	if !*ahead {
		schedule = "both schemes scheduled each step after the last (kv simulate's default: admissions, prompt chunks and frees on the step's path)"
	}
	if *waitNone {
		schedule += "; no step waits for exposed driver time (-wait-for-none)"
	}
	fmt.Fprintf(stdout, "kvtargets: %d requests a trace (seed %d), steps priced by the A100 roofline, driver calls by the %s; this cache in the layout kv simulate picks (kvcache.AutoLayout), mapping ahead, its page pool warmed before serving with %s; %s\n\n",
		*requests, *seed, costs.Name, map[string]string{"budget": "the budget (-warm budget)", "step": "a step's tokens (-warm step)"}[*warm], schedule)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(bench.KVTargetHeader, "\t"))
	var cells []bench.KVTarget
	start := time.Now()
	for _, tr := range all {
		for _, model := range strings.Split(*models, ",") {
			for _, budget := range bench.KVTargetBudgets {
				cell, err := bench.KVTargetCell(tr, model, budget, bench.KVTargetRun{Costs: costs, AdmitAhead: *ahead, WarmBudget: *warm == "budget", WaitForNone: *waitNone})
				if err != nil {
					tw.Flush()
					fmt.Fprintf(stderr, "kvtargets: %v\n", err)
					return 1
				}
				cells = append(cells, cell)
				fmt.Fprintln(tw, strings.Join(cell.Row(), "\t"))
			}
		}
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\n%s\n", bench.Met(cells))
	cacheCPU, pagedCPU, wall := bench.KVTargetTotals(cells)
	fmt.Fprintf(stdout, "%d cells in %.1f s wall (%.1f s of it simulating); the schemes' own CPU (thread clock): this cache %.2f s, paged %.2f s (%.2f×)\n",
		len(cells), time.Since(start).Seconds(), wall.Seconds(), cacheCPU.Seconds(), pagedCPU.Seconds(), cacheCPU.Seconds()/max(pagedCPU.Seconds(), 1e-9))
	return 0
}
