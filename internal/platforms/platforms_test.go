package platforms

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// targets are the platforms the module must build on besides Linux: the
// code there compiles and answers ErrUnsupported. The module's build
// constraints split linux from !linux and unix from !unix, so the first
// two (a unix that is not Linux, and Windows) build every file there is;
// the others differ only in the standard library and x/sys under them,
// and each target costs a cold cache about a minute on two cores, so they
// run when allTargetsEnv is 1.
var targets = []struct{ goos, goarch string }{
	{"darwin", "arm64"},
	{"windows", "amd64"},
	{"darwin", "amd64"},
	{"freebsd", "amd64"},
}

// defaultTargets is how many of targets run without allTargetsEnv.
const defaultTargets = 2

// allTargetsEnv, set to 1, builds for every target.
const allTargetsEnv = "VMARENA_ALL_PLATFORMS"

// limit bounds each go command; a cold cache builds the module and its
// dependencies once per target.
const limit = 5 * time.Minute

// TestOtherPlatformsBuild runs `go vet ./...` (which type-checks every
// file, test files included, and compiles their imports) for each target,
// and with the invariants tag for the first, with cgo off as a
// cross-compiler has it. It skips when the go command is missing or cannot
// cross-compile even the standard library's errors package, and in -short.
func TestOtherPlatformsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiling the module takes a while; run without -short")
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
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		cmd := exec.CommandContext(ctx, gocmd, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("go %s for %s/%s ran past %s:\n%s", strings.Join(args, " "), goos, goarch, limit, out)
		}
		return string(out), err
	}
	tgs := targets[:defaultTargets]
	if os.Getenv(allTargetsEnv) == "1" {
		tgs = targets
	}
	for _, tg := range tgs {
		t.Run(tg.goos+"-"+tg.goarch, func(t *testing.T) {
			if out, err := run(t, tg.goos, tg.goarch, "build", "-o", os.DevNull, "errors"); err != nil {
				t.Skipf("this toolchain cannot cross-compile for %s/%s: %v\n%s", tg.goos, tg.goarch, err, out)
			}
			// vet type-checks every file, tests included, and compiles
			// every package another imports: a build adds little. The
			// invariants tag touches no platform's files; one target
			// checks it compiles off Linux, in the packages whose files
			// it changes (internal/invariants and its importers: the
			// rest, the reports' chart and metrics libraries among them,
			// would only be compiled a second time for nothing).
			cmds := [][]string{{"vet", "./..."}}
			if tg == targets[0] {
				cmds = append(cmds, append([]string{"vet", "-tags", "invariants"}, invariantPackages(t, gocmd, root)...))
			}
			for _, args := range cmds {
				out, err := run(t, tg.goos, tg.goarch, args...)
				require.NoError(t, err, "GOOS=%s GOARCH=%s go %s:\n%s", tg.goos, tg.goarch, strings.Join(args, " "), out)
			}
		})
	}
}

// invariantPackages lists internal/invariants and the module's packages
// that import it (tests included), the only ones the invariants tag
// changes, as go list names them.
func invariantPackages(t *testing.T, gocmd, root string) []string {
	t.Helper()
	const inv = "github.com/vmarena/vmarena/internal/invariants"
	cmd := exec.Command(gocmd, "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	pkgs := []string{inv}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] != inv && slices.Contains(f[1:], inv) {
			pkgs = append(pkgs, f[0])
		}
	}
	require.Greater(t, len(pkgs), 5, "the stateful packages import %s", inv)
	return pkgs
}
