package doclint

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/testexec"
)

// userMain is the program of the module TestDependOnAClone makes: the
// one-import way in, as a user's first program would use it.
const userMain = `package main

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena"
)

func main() {
	m, err := vmarena.Open(vmarena.Options{Capacity: 64 * vmarena.MiB})
	if err != nil {
		log.Fatal(err)
	}
	al := m.Allocator()
	p, err := al.Alloc(4*vmarena.MiB, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(vmarena.FormatSize(al.Stats().Committed), "committed")
	if err := al.Free(p); err != nil {
		log.Fatal(err)
	}
	if err := m.Close(); err != nil {
		log.Fatal(err)
	}
}
`

// TestDependOnAClone: what the README tells a user to do while the module
// proxy does not serve github.com/vmarena/vmarena works: a module of their
// own that requires it, a replace directive to a local clone (this
// checkout), go mod tidy, go run. It runs offline (GOPROXY=off, against
// the module cache; the checksum database is not asked, GOSUMDB=off, as
// what is cached was checked when it was downloaded) and skips, saying
// which module it lacked, where the cache does not hold what the module
// needs.
func TestDependOnAClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own: not with -short")
	}
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gocmd); err != nil {
		if gocmd, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to build with")
		}
	}
	clone, err := filepath.Abs(root)
	require.NoError(t, err)
	dir := t.TempDir()
	gomod := "module example.com/user\n\ngo 1.26\n\n" +
		"require github.com/vmarena/vmarena v0.0.0\n\n" +
		"replace github.com/vmarena/vmarena => " + clone + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(userMain), 0o644))

	ctx, cancel := testexec.Context(t)
	defer cancel()
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, gocmd, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off", "GOTOOLCHAIN=local")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	out, err := run("mod", "tidy")
	if err != nil && strings.Contains(out, "GOPROXY=off") {
		t.Skipf("the module cache lacks what go mod tidy needs (run it once online: go mod download in a module that requires this one):\n%s", out)
	}
	require.NoError(t, err, "go mod tidy:\n%s", out)
	tidied, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(tidied), "replace github.com/vmarena/vmarena => "+clone, "tidy keeps the replace")
	require.Contains(t, string(tidied), "golang.org/x/sys", "tidy adds the module's own requirements")

	out, err = run("run", ".")
	require.NoError(t, err, "go run:\n%s", out)
	require.Equal(t, "6 MiB committed\n", out)
}
