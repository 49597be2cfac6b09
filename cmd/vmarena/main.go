// Command vmarena shows and exercises vmarena's virtual memory management.
//
//	vmarena devices   list what each driver sees: the host driver's logical
//	                  devices, the sim driver's defaults, and the GPUs and
//	                  NPUs of the cuda and acl drivers, or why they cannot
//	                  run here
//	vmarena demo      reserve 64 GiB, map chunks of two devices, grant and
//	                  revoke access, alias a chunk, and print the memory map
//	                  after each step (host driver by default, no GPU
//	                  needed; --driver sim, cuda or acl)
//	vmarena replay    replay PyTorch allocator traces, or a synthetic
//	                  workload, through vmarena's allocator (sim driver by
//	                  default; --driver host, cuda or acl on real devices)
//	                  and print what it did beside what PyTorch did, driver
//	                  calls priced
//	vmarena kv        simulate LLM serving over a request trace with each
//	                  way of holding KV memory, and print their figures side
//	                  by side
//	vmarena top       show the members of a device budget shared by
//	                  processes, live
//	vmarena budget    change a member's floor or ceiling (set), or run two
//	                  servers on a static half each and on one elastic
//	                  budget (simulate)
//	vmarena version   print the version (also vmarena --version)
//
// Each command prints its usage and flags to stdout with --help or -h
// (vmarena help COMMAND does the same); bad usage prints one line saying
// what is wrong and "run 'vmarena COMMAND --help' for usage" to stderr and
// exits 2. devices, replay, kv simulate and demo take --json: one JSON
// document on stdout instead of text (json.go holds its schema).
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `usage: vmarena <command>

commands:
  devices   list what each driver sees: vmarena devices [--cuda-library PATH] [--acl-library PATH]
  demo      walk through reserve, map, access, aliasing and release: vmarena demo [--driver host|sim|cuda|acl]
  replay    replay allocator traces: vmarena replay --trace FILE|DIR|--synthetic random-lifetimes [--driver sim|host|cuda|acl]
  kv        simulate LLM serving over a request trace: vmarena kv simulate --trace FILE --model PRESET
  top       show a shared device budget's members, live: vmarena top --book PATH
  budget    change a member's limits or simulate an elastic budget: vmarena budget set|simulate
  version   print the version (also vmarena --version)

devices, demo, replay, kv simulate, top and budget simulate take --json: one JSON document on stdout instead of text
run 'vmarena COMMAND --help' (or vmarena help COMMAND) for a command's usage and flags
`

func main() {
	if os.Getenv(serverEnv) != "" {
		os.Exit(serveBudget(os.Stdin, os.Stdout)) // one server of budget simulate
	}
	os.Exit(runChecked(os.Args[1:], os.Stdout, os.Stderr))
}

// runChecked is run with its standard output checked: a command whose
// output could not be written (a full disk, a closed pipe, /dev/full)
// exits 1 saying so, rather than 0 with its output lost.
func runChecked(args []string, stdout, stderr io.Writer) int {
	out := &checkedWriter{w: stdout}
	code := run(args, out, stderr)
	if out.err != nil && code == 0 {
		fmt.Fprintf(stderr, "vmarena: writing the output: %v\n", out.err)
		code = 1
	}
	return code
}

// checkedWriter is w, keeping the first error a write met; later writes
// are not tried.
type checkedWriter struct {
	w   io.Writer
	err error
}

func (c *checkedWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.err = err
	return n, err
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "devices":
		return devicesCmd(args[1:], stdout, stderr)
	case "demo":
		return demoCmd(args[1:], stdout, stderr)
	case "replay":
		return replayCmd(args[1:], stdout, stderr)
	case "kv":
		return kvCmd(args[1:], stdout, stderr)
	case "top":
		return topCmd(args[1:], stdout, stderr)
	case "budget":
		return budgetCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		return versionCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[0] == "help" && args[1] != "help" {
			// vmarena help X is vmarena X --help.
			return run(append(args[1:len(args):len(args)], "--help"), stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "vmarena: unknown command %q\nrun 'vmarena --help' for usage\n", args[0])
	return 2
}
