package platforms

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/testexec"
)

// targets are the platforms the module must build on besides Linux: the
// code there compiles and answers ErrUnsupported. The module's build
// constraints split linux from !linux and unix from !unix, so the first
// (Windows: !linux and !unix) compiles every file Linux does not; the
// second (a unix that is not Linux) differs from it only in the packages
// with unix files, and those are all it vets (see vetSet). The others
// differ only in the standard library and x/sys under them; each costs a
// cold cache over a minute of CPU on two cores, so they run when
// allTargetsEnv is 1.
var targets = []struct{ goos, goarch string }{
	{"windows", "amd64"},
	{"darwin", "arm64"},
	{"darwin", "amd64"},
	{"freebsd", "amd64"},
}

// defaultTargets is how many of targets run without allTargetsEnv.
const defaultTargets = 2

// allTargetsEnv, set to 1, builds for every target, each whole.
const allTargetsEnv = "VMARENA_ALL_PLATFORMS"

// gcflags compile every package of a target without optimization or
// inlining. The go commands here link nothing and run nothing: vet needs
// of each dependency only what the compiler's front end writes (its
// export data), and the front end type-checks the code the same with or
// without the optimizer, which is a quarter of the CPU of a cold vet of
// the module for windows/amd64 (84 s instead of 112 s). Every go command
// of a target passes them, so that it reuses what the one before it
// compiled.
const gcflags = "-gcflags=all=-N -l"

// TestOtherPlatformsBuild runs `go vet` (which type-checks every file,
// test files included, and compiles their imports) for each target, the
// targets side by side, with cgo off as a cross-compiler has it and the
// optimizer off (gcflags): on the first target for every
// package and again with the invariants tag for those it changes; on the
// second for the packages whose files differ from the first's (vetSet).
// It skips when the go command is missing or cannot cross-compile even
// the standard library's errors package, in -short, and under the race
// detector: it runs no code of the module, only go commands, and under
// -race it would build other platforms while the whole module builds
// with the detector beside it on the same cores (a cold run took eight
// minutes so); scripts/test's run without -race names it.
func TestOtherPlatformsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiling the module takes a while; run without -short")
	}
	if race.Enabled {
		t.Skip("cross-compiling runs no code to check for races; scripts/test runs it without -race")
	}
	gocmd, err := exec.LookPath("go")
	if err != nil {
		if gocmd, err = exec.LookPath(filepath.Join(os.Getenv("GOROOT"), "bin", "go")); err != nil {
			t.Skip("no go command to cross-compile with")
		}
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the module's root is two levels up")
	run := func(t *testing.T, goos, goarch string, args ...string) (string, error) {
		// As long as it takes (a cold cache builds the module and its
		// dependencies once per target), up to go test's -timeout.
		ctx, cancel := testexec.Context(t)
		defer cancel()
		cmd := exec.CommandContext(ctx, gocmd, append([]string{args[0], gcflags}, args[1:]...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("go %s for %s/%s was killed as go test's -timeout neared:\n%s", strings.Join(args, " "), goos, goarch, out)
		}
		return string(out), err
	}
	all := os.Getenv(allTargetsEnv) == "1"
	tgs := targets[:defaultTargets]
	if all {
		tgs = targets
	}
	// The targets run side by side (t.Parallel, so at most GOMAXPROCS
	// of them at once): each compiles the standard library and the
	// module's dependencies for its own platform, nothing the others
	// compile, and one go command alone leaves cores idle while it waits
	// on a long chain of imports (runtime, reflect, fmt...) or between
	// its two vet commands on the first target.
	for i, tg := range tgs {
		t.Run(tg.goos+"-"+tg.goarch, func(t *testing.T) {
			t.Parallel()
			if out, err := run(t, tg.goos, tg.goarch, "build", "-o", os.DevNull, "errors"); err != nil {
				t.Skipf("this toolchain cannot cross-compile for %s/%s: %v\n%s", tg.goos, tg.goarch, err, out)
			}
			// vet type-checks every file, tests included, and compiles
			// every package another imports: a build adds little. The
			// invariants tag touches no platform's files; the first
			// target checks it compiles off Linux, in the packages whose
			// files it changes (internal/invariants and its importers:
			// the rest, the reports' chart and metrics libraries among
			// them, would only be compiled a second time for nothing).
			cmds := [][]string{{"vet", "./..."}}
			switch {
			case i == 0:
				cmds = append(cmds, append([]string{"vet", "-tags", "invariants"}, invariantPackages(t, gocmd, root)...))
			case i == 1 && !all:
				pkgs := vetSet(t, gocmd, root, targets[0], tg)
				if len(pkgs) == 0 {
					t.Logf("every package has the same files on %s/%s as on %s/%s", tg.goos, tg.goarch, targets[0].goos, targets[0].goarch)
					return
				}
				t.Logf("vet on %s/%s: %s", tg.goos, tg.goarch, strings.Join(pkgs, " "))
				cmds = [][]string{append([]string{"vet"}, pkgs...)}
			}
			for _, args := range cmds {
				out, err := run(t, tg.goos, tg.goarch, args...)
				require.NoError(t, err, "GOOS=%s GOARCH=%s go %s:\n%s", tg.goos, tg.goarch, strings.Join(args, " "), out)
			}
		})
	}
}

// vetSet lists the packages whose files (tests included) on target differ
// from those on base, the target already vetted whole: the only ones whose
// code type-checks differently there. Their importers see the same API
// only if each such package has on target the files it has on Linux (the
// platform the tests run on, whose importers compile against them);
// vetSet requires that, so that checking these packages alone is enough.
// go list reads build constraints without compiling anything.
func vetSet(t *testing.T, gocmd, root string, base, target struct{ goos, goarch string }) []string {
	t.Helper()
	files := func(goos, goarch string) map[string]string {
		cmd := exec.Command(gocmd, "list", "-e", "-f", `{{.ImportPath}} {{join .GoFiles " "}} | {{join .TestGoFiles " "}} | {{join .XTestGoFiles " "}}`, "./...")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
		out, err := cmd.Output()
		require.NoError(t, err, "go list for %s/%s", goos, goarch)
		m := make(map[string]string)
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, rest, _ := strings.Cut(line, " ")
			m[pkg] = rest
		}
		return m
	}
	onBase, onTarget, onLinux := files(base.goos, base.goarch), files(target.goos, target.goarch), files("linux", target.goarch)
	require.Equal(t, len(onBase), len(onTarget), "the same packages on %s and %s", base.goos, target.goos)
	var pkgs []string
	for pkg, fs := range onTarget {
		if onBase[pkg] == fs {
			continue
		}
		require.Equal(t, onLinux[pkg], fs, "%s has files on %s that neither %s nor Linux has: vet all of %s (%s=1)", pkg, target.goos, base.goos, target.goos, allTargetsEnv)
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	return pkgs
}

// invariantPackages lists internal/invariants, internal/lockrank (the
// other package with files under the tag) and the module's packages that
// import internal/invariants (tests included), the only ones the
// invariants tag changes, as go list names them. This vet is the one of
// the tag's files: scripts/test's invariants step runs with -vet=off.
func invariantPackages(t *testing.T, gocmd, root string) []string {
	t.Helper()
	const inv = "github.com/vmarena/vmarena/internal/invariants"
	const lockrank = "github.com/vmarena/vmarena/internal/lockrank"
	cmd := exec.Command(gocmd, "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	pkgs := []string{inv, lockrank}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] != inv && f[0] != lockrank && slices.Contains(f[1:], inv) {
			pkgs = append(pkgs, f[0])
		}
	}
	require.Greater(t, len(pkgs), 5, "the stateful packages import %s", inv)
	return pkgs
}
