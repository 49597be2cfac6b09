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
//	vmarena version   print the version
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
)

// version is the library's version.
const version = "0.1.0-dev"

const usage = `usage: vmarena <command>

commands:
  devices   list what each driver sees: vmarena devices [--cuda-library PATH] [--acl-library PATH]
  demo      walk through reserve, map, access, aliasing and release: vmarena demo [--driver host|sim|cuda|acl]
  replay    replay allocator traces: vmarena replay --trace FILE|DIR|--synthetic random-lifetimes [--driver sim|host|cuda|acl]
  kv        simulate LLM serving over a request trace: vmarena kv simulate --trace FILE --model PRESET
  version   print the version
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
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
	case "version":
		fmt.Fprintf(stdout, "vmarena %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "vmarena: unknown command %q\n\n%s", args[0], usage)
	return 2
}
