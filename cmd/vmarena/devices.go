package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

const devicesUsage = `usage: vmarena devices [--cuda-library PATH] [--acl-library PATH] [--json]

Lists what each driver sees, one section per driver: host (the logical
devices the host driver makes by default), sim, cuda (the NVIDIA driver's
GPUs) and acl (AscendCL's NPUs). A driver that cannot run here says why in
one line; that is not an error.
`

// devicesCmd runs `vmarena devices`: 0 whatever the drivers found, 2 on
// bad usage.
func devicesCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("devices", stderr)
	cudaLib := fs.String("cuda-library", "", "the CUDA driver library to load, a `PATH` or soname (default $"+cuda.LibraryEnv+", else "+cuda.DefaultLibrary+")")
	aclLib := fs.String("acl-library", "", "the AscendCL runtime to load, a `PATH` or soname (default $"+acl.LibraryEnv+", else "+acl.DefaultLibrary+")")
	jsonOut := fs.Bool("json", false, jsonHelp)
	if code, ok := parseFlags(fs, "devices", devicesUsage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "devices", "unexpected argument %q", fs.Arg(0))
	}
	if *jsonOut {
		if err := writeJSON(stdout, devicesDocument(*cudaLib, *aclLib)); err != nil {
			fmt.Fprintf(stderr, "vmarena devices: %v\n", err)
			return 1
		}
		return 0
	}
	for i, section := range []func(io.Writer) error{
		listHost,
		listSim,
		func(w io.Writer) error { return listCUDA(w, *cudaLib) },
		func(w io.Writer) error { return listACL(w, *aclLib) },
	} {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := section(stdout); err != nil {
			fmt.Fprintf(stdout, "unavailable: %v\n", err)
		}
	}
	return 0
}

// Each list function prints its driver's section, or prints the section's
// title and returns why the driver cannot run here: the caller ends the
// line with it.

// listHost prints the logical devices host.New makes with no options.
func listHost(w io.Writer) error {
	fmt.Fprint(w, "host: ")
	drv, err := host.New(host.Options{})
	if err != nil {
		return err
	}
	devs := drv.Devices()
	if err := drv.Close(); err != nil {
		return err
	}
	fmt.Fprintf(w, "logical devices on this machine's memory; by default %d, sharing half of MemAvailable\n", len(devs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  device\tcapacity\tmin granularity\trecommended granularity\tNUMA node")
	for _, d := range devs {
		node := "-"
		if d.NUMANode >= 0 {
			node = fmt.Sprint(d.NUMANode)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", d.ID, units.Bytes(d.Capacity),
			units.Bytes(d.MinGranularity), units.Bytes(d.RecommendedGranularity), node)
	}
	return tw.Flush()
}

// listSim says what the sim driver makes with no options.
func listSim(w io.Writer) error {
	fmt.Fprint(w, "sim: ")
	drv, err := sim.New(sim.Options{})
	if err != nil {
		return err
	}
	devs := drv.Devices()
	if err := drv.Close(); err != nil {
		return err
	}
	fmt.Fprintf(w, "simulates whatever is asked, with no memory behind it; by default %s of %s, granularity %s\n",
		plural(len(devs), "device"), units.Bytes(devs[0].Capacity), units.Bytes(devs[0].MinGranularity))
	return nil
}

// listCUDA prints what cuda.Probe learns of the NVIDIA driver.
func listCUDA(w io.Writer, library string) error {
	fmt.Fprint(w, "cuda: ")
	rep, err := cuda.Probe(library)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s, driver version %s, %s\n", rep.Library, cudaVersion(rep.Version), plural(len(rep.Devices), "device"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Devices) > 0 {
		fmt.Fprintln(tw, "  ordinal\tname\tmemory\tVMM\tPOSIX fd export\tpools\tmin granularity\trecommended granularity")
	}
	for _, d := range rep.Devices {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Ordinal, d.Name, approx(d.Memory),
			yesNo(d.VMM), yesNo(d.POSIXFD), yesNo(d.Pools), granularity(d.MinGranularity), granularity(d.RecommendedGranularity))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printMissing(w, rep.Missing)
	return nil
}

// listACL prints what acl.Probe learns of the AscendCL runtime.
func listACL(w io.Writer, library string) error {
	fmt.Fprint(w, "acl: ")
	rep, err := acl.Probe(library)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s, %s\n", rep.Library, plural(len(rep.Devices), "device"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Devices) > 0 {
		fmt.Fprintln(tw, "  id\tname\tmemory\tfree\tmin granularity\trecommended granularity")
	}
	for _, d := range rep.Devices {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Name, approx(d.Memory), approx(d.Free),
			granularity(d.MinGranularity), granularity(d.RecommendedGranularity))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printMissing(w, rep.Missing)
	return nil
}

// printMissing names the symbol groups a vendor library lacks.
func printMissing(w io.Writer, missing []string) {
	if len(missing) == 0 {
		return
	}
	fmt.Fprintf(w, "  missing: %s\n", strings.Join(missing, "; "))
}

// cudaVersion formats cuDriverGetVersion's answer: 12060 is 12.6.
func cudaVersion(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// granularity formats a granularity, which a device without virtual
// memory management does not report.
func granularity(g uint64) string {
	if g == 0 {
		return "-"
	}
	return units.Bytes(g)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// plural formats "1 device", "2 devices".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
