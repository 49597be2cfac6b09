// Command report runs the benchmarks of docs/benchmarks.md and writes what they
// measured against their targets: DIR/benchmarks.md, a table of every
// ratio docs/benchmarks.md holds to a target (path, benchmark, metric, measured,
// target, met?), and DIR/benchmarks.svg, a chart of each ratio beside its
// target. A run also keeps go test's output in DIR/bench-output.txt, from
// which -from draws the report again without running anything.
//
//	go run ./bench/report -out docs/bench                 # every command: 18 minutes when last timed, before the replays took seconds
//	go run ./bench/report -out /tmp/r -bench-filter ReserveFree -benchtime 50x
//	go run ./bench/report -out docs/bench -from docs/bench/bench-output.txt
//
// On a terminal a bar on standard error follows the run; -v copies go
// test's output there as it comes. The commands, and the target of each
// ratio, are the list in suite.go. A missed target is a line of the
// report, never a failure: the exit status is 1 only when a command
// failed or the report could not be written, 2 for a flag it cannot use.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/progress"
)

// The files the report writes in its -out directory.
const (
	tableFile  = "benchmarks.md"
	chartFile  = "benchmarks.svg"
	outputFile = "bench-output.txt"
)

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr)) }

// goCommand is the go command the report runs: "go" from PATH. The tests
// put a stand-in there that prints saved output, so that proving the run
// path does not compile and run the benchmarks.
var goCommand = "go"

// config is what the flags ask for.
type config struct {
	out, filter, benchtime, from string
	verbose                      bool
}

// realMain parses args, runs, and returns the exit status.
func realMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.StringVar(&cfg.out, "out", "", "the `DIR` to write benchmarks.md, benchmarks.svg and bench-output.txt in (required)")
	fs.StringVar(&cfg.filter, "bench-filter", "", "run only the commands with a benchmark this `REGEXP` matches, each with -bench REGEXP in place of its own")
	fs.StringVar(&cfg.benchtime, "benchtime", "", "the -benchtime `D` of every command, in place of docs/benchmarks.md's (such as 50x)")
	fs.StringVar(&cfg.from, "from", "", "build the report from this saved go test -bench output `FILE` instead of running the benchmarks")
	fs.BoolVar(&cfg.verbose, "v", false, "copy go test's output to standard error as it comes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package has said what was wrong
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "report: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q; the flags are -out DIR [-bench-filter REGEXP] [-benchtime D] [-from FILE] [-v]", fs.Arg(0))
	case cfg.out == "":
		return usageErr("no -out DIR: the directory to write the report in")
	case cfg.from != "" && cfg.benchtime != "":
		return usageErr("-benchtime %s with -from: a saved output was run with its own", cfg.benchtime)
	}
	cmds, err := selected(cfg.filter)
	if err != nil {
		return usageErr("%v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := report(ctx, cfg, cmds, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "report: %v\n", err)
		return 1
	}
	return 0
}

// report runs cmds (or reads cfg.from) and writes the report in cfg.out.
// A command that fails is named in the report and in the error, after
// the report is written with what the others measured.
func report(ctx context.Context, cfg config, cmds []command, stdout, stderr io.Writer) error {
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	var out output
	var failed []string
	src := source{intro: "The commands it ran (docs/benchmarks.md's, under The commands" + overrides(cfg) + "):"}
	if cfg.from != "" {
		src.intro = fmt.Sprintf("From the saved output `%s` of docs/benchmarks.md's commands:", cfg.from)
		for _, c := range cmds {
			src.commands = append(src.commands, c.String())
		}
		f, err := os.Open(cfg.from)
		if err != nil {
			return err
		}
		out, err = parse(f)
		if err := errors.CombineErrors(err, f.Close()); err != nil {
			return errors.Wrapf(err, "-from %s", cfg.from)
		}
	} else {
		root, err := moduleRoot(ctx)
		if err != nil {
			return err
		}
		raw, err := os.Create(filepath.Join(cfg.out, outputFile))
		if err != nil {
			return err
		}
		var echo io.Writer
		if cfg.verbose {
			echo = stderr
		}
		out, src.commands, failed = runSuite(ctx, root, cmds, cfg, raw, echo, stderr)
		if err := raw.Close(); err != nil {
			return err
		}
	}

	es := entries(cmds, out)
	var chart bytes.Buffer
	chartErr := writeChart(&chart, es)
	chartName := chartFile
	if chartErr != nil {
		chartName = ""
		// No chart of an earlier run stays beside this table.
		if err := os.Remove(filepath.Join(cfg.out, chartFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else if err := os.WriteFile(filepath.Join(cfg.out, chartFile), chart.Bytes(), 0o644); err != nil {
		return err
	}
	var table bytes.Buffer
	if err := writeMarkdown(&table, src, out, es, failed, chartName); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.out, tableFile), table.Bytes(), 0o644); err != nil {
		return err
	}
	met := 0
	for _, e := range es {
		if e.met() {
			met++
		}
	}
	written := filepath.Join(cfg.out, tableFile)
	if chartName != "" {
		written += " and " + filepath.Join(cfg.out, chartFile)
	}
	fmt.Fprintf(stdout, "report: %d of %d targets met; wrote %s\n", met, len(es), written)
	switch {
	case len(failed) > 0:
		return errors.Newf("%d of %d commands failed: %s", len(failed), len(cmds), strings.Join(failed, "; "))
	case chartErr != nil:
		return chartErr
	}
	return nil
}

// overrides says what the flags changed in docs/benchmarks.md's commands.
func overrides(cfg config) string {
	var o []string
	if cfg.filter != "" {
		o = append(o, "-bench "+shellJoin([]string{cfg.filter}))
	}
	if cfg.benchtime != "" {
		o = append(o, "-benchtime "+shellJoin([]string{cfg.benchtime}))
	}
	if len(o) == 0 {
		return ""
	}
	return ", with " + strings.Join(o, " and ")
}

// moduleRoot is the directory of the main module's go.mod, where the
// benchmark commands run.
func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, goCommand, "env", "GOMOD").Output()
	if err != nil {
		return "", errors.Wrap(err, "go env GOMOD")
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.WithHint(errors.New("not inside a Go module"), "run it from the vmarena module: go run ./bench/report -out DIR")
	}
	return filepath.Dir(mod), nil
}

// tailLines is how many of a failed command's last lines of output the
// report prints.
const tailLines = 20

// runSuite runs cmds one after the other in root, each with the filter
// and benchtime of cfg where given, copying their output to raw (each
// after a "# go test ..." line) and to echo (when not nil), a bar on
// progressTo (when a terminal) counting the commands and naming the last
// benchmark done. It returns what the output says, the commands it ran,
// and a line for each that failed.
func runSuite(ctx context.Context, root string, cmds []command, cfg config, raw, echo, progressTo io.Writer) (out output, ran, failed []string) {
	bar := progress.New(progressTo, int64(len(cmds)), "benchmarks")
	defer bar.Close()
	for i, c := range cmds {
		pattern := c.bench
		if cfg.filter != "" {
			pattern = cfg.filter
		}
		args := c.args(pattern, cfg.benchtime)
		line := "go " + shellJoin(args)
		ran = append(ran, line)
		step := fmt.Sprintf("bench %d/%d:", i+1, len(cmds))
		bar.Describe(step + " " + pattern)
		fmt.Fprintf(raw, "# %s\n", line)
		if echo != nil {
			fmt.Fprintf(echo, "# %s\n", line)
		}
		var tail []string
		err := runLines(ctx, root, args, func(s string) {
			fmt.Fprintln(raw, s)
			if echo != nil {
				fmt.Fprintln(echo, s)
			}
			tail = append(tail, s)
			if len(tail) > tailLines {
				tail = tail[1:]
			}
			if r, ok := out.line(s); ok {
				bar.Describe(step + " " + strings.TrimPrefix(r.name, "Benchmark"))
			}
		})
		if err != nil {
			bar.Close()
			bar = nil // the rest runs without: a bar would draw over the tail below
			failed = append(failed, fmt.Sprintf("`%s`: %v", line, err))
			if echo == nil {
				fmt.Fprintf(progressTo, "report: %s: %v; its last lines:\n%s\n", line, err, strings.Join(tail, "\n"))
			}
			continue
		}
		bar.Add(1)
	}
	bar.Done()
	return out, ran, failed
}

// runLines runs go with args in dir, calling each for every line of its
// output (standard output and error together) as it comes.
func runLines(ctx context.Context, dir string, args []string, each func(string)) error {
	cmd := exec.CommandContext(ctx, goCommand, args...)
	cmd.Dir = dir
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		_ = pw.Close() // the reader below sees the end of the output
		done <- err
	}()
	sc := bufio.NewScanner(&boundedOutput{r: pr})
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		each(sc.Text())
	}
	scanErr := sc.Err()
	if scanErr != nil {
		_, _ = io.Copy(io.Discard, pr) // let the command finish writing
	}
	return errors.CombineErrors(<-done, scanErr)
}
