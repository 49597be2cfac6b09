// Command vmarena shows and exercises vmarena's virtual memory management.
//
//	vmarena demo      reserve 64 GiB, map chunks of two logical devices, grant
//	                  and revoke access, alias a chunk, and print the memory
//	                  map after each step (host driver, no GPU needed)
//	vmarena replay    replay PyTorch allocator traces through vmarena's
//	                  allocator on the sim driver and print what it did
//	                  beside what PyTorch did
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
  demo      walk through reserve, map, access, aliasing and release on the host driver
  replay    replay allocator traces on the sim driver: vmarena replay --trace FILE|DIR
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
	case "demo":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "vmarena demo takes no arguments\n")
			return 2
		}
		if err := demo(stdout); err != nil {
			fmt.Fprintf(stderr, "vmarena demo: %v\n", err)
			return 1
		}
		return 0
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
