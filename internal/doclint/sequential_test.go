package doclint

import (
	"go/ast"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// module is the module's path, the prefix of its packages' import paths.
const module = "github.com/vmarena/vmarena"

// concurrentImports are the standard packages that start goroutines of
// their own for what a caller asks (a listener's, a signal's): a test
// reaching one is not one goroutine.
var concurrentImports = []string{"os/signal", "net", "net/http", "net/http/httptest"}

// concurrentCalls are the calls that start a goroutine, or let the
// testing package run tests side by side, or run code on the runtime's
// own goroutines (finalizers and cleanups), or leave a command's copying
// goroutines running after they return (os/exec's Start and pipes; its
// Run, Output and CombinedOutput wait for them, so a command run so is
// one goroutine's call). Any method of the name counts.
var concurrentCalls = []string{"Parallel", "AfterFunc", "SetFinalizer", "AddCleanup", "Start", "StdinPipe", "StdoutPipe", "StderrPipe"}

// TestSequentialPackagesStartNoGoroutine: scripts/test runs the packages
// of its sequential list once, without the race detector, instead of
// under it: their tests run on one goroutine at a time (the testing
// package's hand-offs between tests are synchronized), where the
// detector can report nothing and costs two to ten times the run and a
// second compile. That holds only while no code the tests reach can
// start a goroutine, so for each listed package neither its files (tests
// included) nor those of any package of the module it imports,
// directly or not, may hold a go statement, call t.Parallel,
// time.AfterFunc, runtime.SetFinalizer or AddCleanup, start a command
// it does not wait for, or import a standard package that starts
// goroutines (concurrentImports, concurrentCalls). Every
// file counts, whatever its build constraints. A package that starts
// one leaves the list and goes back under -race; a package not listed
// (a new one) is under -race already.
func TestSequentialPackagesStartNoGoroutine(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(root, "scripts", "test"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^sequential=\(([^)]*)\)`).FindSubmatch(script)
	require.NotNil(t, m, "scripts/test lists its sequential packages: sequential=(...)")
	listed := strings.Fields(string(m[1]))
	require.NotEmpty(t, listed)
	// The list is used on both sides: excluded from the race line, run on
	// a line without -race.
	var raceLine, plainLine bool
	for _, line := range strings.Split(string(script), "\n") {
		if !strings.HasPrefix(strings.TrimLeft(line, " \t"), "go test ") && !strings.Contains(line, " go test ") {
			continue
		}
		if strings.Contains(line, `except "${sequential[@]}"`) && strings.Contains(line, "-race") {
			raceLine = true
		}
		if strings.Contains(line, ` "${sequential[@]}"`) && !strings.Contains(line, "except") && !strings.Contains(line, "-race") {
			plainLine = true
		}
	}
	require.True(t, raceLine, `the race step's go test line tests $(scripts/except "${sequential[@]}")`)
	require.True(t, plainLine, `a go test line without -race tests "${sequential[@]}"`)

	// Each directory of the module: the imports of its files and its test
	// files, and what in them starts a goroutine.
	type dir struct {
		imports, testImports []string
		starts, testStarts   []string
	}
	dirs := map[string]*dir{}
	for p, f := range goFiles(t) {
		rel, err := filepath.Rel(root, filepath.Dir(p))
		require.NoError(t, err)
		d := dirs[filepath.ToSlash(rel)]
		if d == nil {
			d = &dir{}
			dirs[filepath.ToSlash(rel)] = d
		}
		test := strings.HasSuffix(p, "_test.go")
		name := filepath.Base(p)
		for _, im := range f.Imports {
			path, err := strconv.Unquote(im.Path.Value)
			require.NoError(t, err)
			if test {
				d.testImports = append(d.testImports, path)
			} else {
				d.imports = append(d.imports, path)
			}
		}
		starts := &d.starts
		if test {
			starts = &d.testStarts
		}
		for _, im := range f.Imports {
			if path, _ := strconv.Unquote(im.Path.Value); slices.Contains(concurrentImports, path) {
				*starts = append(*starts, name+" imports "+path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				*starts = append(*starts, fset.Position(n.Pos()).String()+": a go statement")
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && slices.Contains(concurrentCalls, sel.Sel.Name) {
					*starts = append(*starts, fset.Position(n.Pos()).String()+": "+sel.Sel.Name)
				}
			}
			return true
		})
	}
	// startsOf lists what can start a goroutine in the package in rel, its
	// tests, and what they import of the module, directly or not.
	startsOf := func(rel string) []string {
		d := dirs[rel]
		require.NotNil(t, d, "scripts/test's sequential list names ./%s, which has no Go files", rel)
		seen := map[string]bool{rel: true}
		queue := append(slices.Clone(d.imports), d.testImports...)
		starts := append(slices.Clone(d.starts), d.testStarts...)
		for len(queue) > 0 {
			path := queue[0]
			queue = queue[1:]
			if path != module && !strings.HasPrefix(path, module+"/") {
				continue
			}
			r := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
			if r == "" {
				r = "."
			}
			if seen[r] {
				continue
			}
			seen[r] = true
			dep := dirs[r]
			require.NotNil(t, dep, "./%s imports %s, which has no Go files here", rel, path)
			for _, s := range dep.starts {
				starts = append(starts, r+": "+s)
			}
			queue = append(queue, dep.imports...)
		}
		return starts
	}
	// The check sees a goroutine two imports away: the host driver's
	// streams run on the queue package's workers.
	require.NotEmpty(t, startsOf("driver/host"), "driver/host's streams start goroutines")
	for _, pkg := range listed {
		if starts := startsOf(strings.TrimPrefix(pkg, "./")); len(starts) > 0 {
			t.Errorf("%s is on scripts/test's sequential list (run without -race), but its tests can start goroutines: take it off the list\n\t%s", pkg, strings.Join(starts, "\n\t"))
		}
	}
}
