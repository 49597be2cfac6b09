package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCLIUniform checks that every command takes its flags as the go
// command does: --help and -h print its usage (and flags, where it has
// any) to stdout and exit 0, writing nothing to stderr; a bad flag prints
// one line naming it and the hint to run --help, to stderr, and exits 2;
// and no arguments do what the command does bare (demo is run bare by
// TestDemo).
func TestCLIUniform(t *testing.T) {
	for _, tc := range []struct {
		cmd   []string
		usage string // the usage's first line starts so
		flags bool   // it lists flags
		bare  int    // the exit status with no arguments; -1: not run here
		// bareErr is the start of stderr's first line with no arguments
		// (when bare is 2).
		bareErr string
	}{
		{cmd: []string{"devices"}, usage: "usage: vmarena devices", flags: true, bare: 0},
		{cmd: []string{"demo"}, usage: "usage: vmarena demo", flags: true, bare: -1},
		{cmd: []string{"replay"}, usage: "usage: vmarena replay", flags: true, bare: 2, bareErr: "vmarena replay: no trace given"},
		{cmd: []string{"kv"}, usage: "usage: vmarena kv simulate", bare: 2, bareErr: "vmarena kv: no subcommand, want simulate"},
		{cmd: []string{"kv", "simulate"}, usage: "usage: vmarena kv simulate", flags: true, bare: 2, bareErr: "vmarena kv simulate: no trace given"},
		{cmd: []string{"version"}, usage: "usage: vmarena version", bare: 0},
	} {
		name := strings.Join(tc.cmd, " ")
		for _, help := range []string{"--help", "-h", "-help"} {
			code, out, errOut := runCmd(t, append(tc.cmd, help)...)
			require.Equal(t, 0, code, "%s %s", name, help)
			require.Empty(t, errOut, "%s %s", name, help)
			require.True(t, strings.HasPrefix(out, tc.usage), "%s %s: %q", name, help, out)
			require.Equal(t, tc.flags, strings.Contains(out, "\nflags:\n"), "%s %s: %q", name, help, out)
		}
		code, out, _ := runCmd(t, "help", tc.cmd[0])
		require.Equal(t, 0, code, "help %s", name)
		require.True(t, strings.HasPrefix(out, "usage: vmarena "+tc.cmd[0]), "help %s: %q", name, out)

		code, out, errOut := runCmd(t, append(tc.cmd, "--bogus")...)
		require.Equal(t, 2, code, "%s --bogus", name)
		require.Empty(t, out, "%s --bogus", name)
		want := "vmarena " + name + ": flag provided but not defined: -bogus\nrun 'vmarena " + name + " --help' for usage\n"
		if name == "kv" {
			want = "vmarena kv: unknown subcommand \"--bogus\", want simulate\nrun 'vmarena kv --help' for usage\n"
		}
		require.Equal(t, want, errOut, "%s --bogus", name)

		if tc.bare < 0 {
			continue
		}
		code, out, errOut = runCmd(t, tc.cmd...)
		require.Equal(t, tc.bare, code, "%s: %s", name, errOut)
		if tc.bare == 2 {
			require.Empty(t, out, name)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			require.Len(t, lines, 2, "%s: %q", name, errOut)
			require.True(t, strings.HasPrefix(lines[0], tc.bareErr), "%s: %q", name, errOut)
			require.Equal(t, "run 'vmarena "+name+" --help' for usage", lines[1])
		} else {
			require.NotEmpty(t, out, name)
		}
	}
}

// TestTopLevel: vmarena alone prints the usage to stderr and exits 2; an
// unknown command is one line and the hint; help, -h and --help print the
// usage to stdout; version and --version print the same line.
func TestTopLevel(t *testing.T) {
	code, out, errOut := runCmd(t)
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.True(t, strings.HasPrefix(errOut, "usage: vmarena <command>"), errOut)

	code, out, errOut = runCmd(t, "bogus")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, "vmarena: unknown command \"bogus\"\nrun 'vmarena --help' for usage\n", errOut)

	for _, help := range []string{"help", "-h", "--help"} {
		code, out, errOut = runCmd(t, help)
		require.Equal(t, 0, code, help)
		require.Empty(t, errOut, help)
		require.True(t, strings.HasPrefix(out, "usage: vmarena <command>"), "%s: %q", help, out)
	}
	code, _, errOut = runCmd(t, "help", "bogus")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "bogus"`)

	code, version, _ := runCmd(t, "version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^vmarena \S+ \(.*go[0-9.]+.* [a-z0-9]+/[a-z0-9]+\)\n$`, version)
	code, out, _ = runCmd(t, "--version")
	require.Equal(t, 0, code)
	require.Equal(t, version, out)
	code, _, errOut = runCmd(t, "version", "extra")
	require.Equal(t, 2, code)
	require.Equal(t, "vmarena version: unexpected argument \"extra\"\nrun 'vmarena version --help' for usage\n", errOut)
}

// TestVersionLine: the version is the module's when it has one, else
// "(devel)"; the revision, its time and a modified tree follow when the
// build recorded them; the Go version and platform always.
func TestVersionLine(t *testing.T) {
	goLine := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	require.Equal(t, "vmarena (devel) ("+goLine+")", versionLine(nil))
	require.Equal(t, "vmarena v1.2.3 ("+goLine+")", versionLine(&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}))
	require.Equal(t, "vmarena (devel) (revision 0123abc, 2026-11-27T07:00:00Z, modified, "+goLine+")",
		versionLine(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abc"},
			{Key: "vcs.time", Value: "2026-11-27T07:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}))
	require.Equal(t, "vmarena v0.0.0-20261127070000-0123abc (revision 0123abc, "+goLine+")",
		versionLine(&debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261127070000-0123abc"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.modified", Value: "false"}}}))
}

// fullWriter fails every write, as /dev/full does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestOutputThatCannotBeWritten: a command whose standard output cannot
// be written exits 1 saying so, text or JSON, not 0 with its output lost.
func TestOutputThatCannotBeWritten(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"devices"}, {"devices", "--json"}, {"help"}} {
		var errOut strings.Builder
		code := runChecked(args, fullWriter{}, &errOut)
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, errOut.String(), "no space left on device", "%v", args)
	}
}
