package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"
)

// Every subcommand takes its flags the way the go command does:
//
//   - `vmarena X --help` (or -h) prints X's usage and flags to stdout and
//     exits 0;
//   - bad usage (a bad flag, a bad value, an unexpected argument) prints
//     one line saying what is wrong, then "run 'vmarena X --help' for
//     usage", to stderr, and exits 2.

// newFlags is the flag set of `vmarena name`: the flag package prints
// nothing itself (parseFlags and usageError do), and Usage prints the
// hint line that follows a usage error.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() { fmt.Fprint(stderr, usageHint(name)) }
	return fs
}

// usageHint is the line under a usage error.
func usageHint(name string) string {
	return fmt.Sprintf("run 'vmarena %s --help' for usage\n", name)
}

// usageError prints a usage error of `vmarena name` and returns its exit
// status, 2.
func usageError(stderr io.Writer, name, format string, a ...any) int {
	fmt.Fprintf(stderr, "vmarena %s: %s\n%s", name, fmt.Sprintf(format, a...), usageHint(name))
	return 2
}

// parseFlags parses args into fs, the flag set of `vmarena name` whose
// usage text is usage. It returns ok when the command should go on; else
// the command exits with code: 0 after --help (the usage and the flags
// printed to stdout), 2 after a bad flag (a usage error on stderr).
func parseFlags(fs *flag.FlagSet, name, usage string, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	hint := fs.Usage
	fs.Usage = func() {} // the flag package calls it on a bad flag and on -h: said below
	err := fs.Parse(args)
	fs.Usage = hint
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs, usage, stdout)
		return 0, false
	}
	if err != nil {
		return usageError(stderr, name, "%v", err), false
	}
	return 0, true
}

// printUsage prints usage and, if fs has any, its flags.
func printUsage(fs *flag.FlagSet, usage string, w io.Writer) {
	fmt.Fprint(w, usage)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprint(w, "\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

const versionUsage = `usage: vmarena version

Prints vmarena's version: the module's version when built from a module
download (go install github.com/vmarena/vmarena/cmd/vmarena@VERSION), the
revision, its time and whether the tree was modified when built from a
checkout with version control information, "(devel)" otherwise; then the Go
version, system and architecture. vmarena --version prints the same.
`

// versionCmd runs `vmarena version`.
func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("version", stderr)
	if code, ok := parseFlags(fs, "version", versionUsage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "version", "unexpected argument %q", fs.Arg(0))
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(info))
	return 0
}

// versionLine is the version printed from the build's info (nil when the
// binary carries none).
func versionLine(info *debug.BuildInfo) string {
	version := "(devel)"
	var vcs []string
	if info != nil {
		if v := info.Main.Version; v != "" {
			version = v
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		if r := settings["vcs.revision"]; r != "" {
			vcs = append(vcs, "revision "+r)
		}
		if t := settings["vcs.time"]; t != "" {
			vcs = append(vcs, t)
		}
		if settings["vcs.modified"] == "true" {
			vcs = append(vcs, "modified")
		}
	}
	vcs = append(vcs, fmt.Sprintf("%s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH))
	return "vmarena " + version + " (" + strings.Join(vcs, ", ") + ")"
}
