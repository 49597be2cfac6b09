package doclint

import (
	"fmt"
	"go/ast"
	"go/build"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDriversDeclareTheirContract: the exported driver types host.Driver
// and sim.Driver embed nothing and export no field, and declare every
// method of driver.Driver, and of each driver interface they assert
// (var _ driver.X = (*Driver)(nil)), themselves, each with a doc comment
// that says more than which interface it implements and does not talk of
// the internals behind it. Their only other exported methods are the few
// listed here. Both drivers once embedded the shared ledger and queue
// engine: `go doc host.Driver.Reserve` found nothing, and every caller
// could reach the internals those types export for their sibling packages
// (WithRange, Busy, an Export that hands a callback the record's own chunk)
// and desynchronise the books.
//
// The host driver is checked as it builds on Linux and elsewhere
// (host_other.go), where it answers ErrUnsupported with the same methods.
func TestDriversDeclareTheirContract(t *testing.T) {
	files := goFiles(t)
	ifaces := interfacesOf(t, files, "driver")
	require.Contains(t, ifaces, "Driver", "the driver package declares the Driver interface")
	require.Contains(t, ifaces["Driver"], "Reserve")

	// extra are the exported methods a driver may have beyond its
	// interfaces, what callers outside the driver use: Used (the bytes
	// committed on a device, which physical's and mapping's tests compare
	// with their own), Check (drivertest calls it after each test) and
	// the host's HeapBytes (the kernel's figure, for leak tests); the
	// accelerator drivers' Wait (how they wait for their streams); the
	// sim driver's Tally (its calls counted and priced, which replay
	// reports); AscendCL's HostPID (the process ID an importer sends its
	// exporter's allow-list, aclrtDeviceGetBareTgid) and
	// ReservationsBindOneDevice (its reservations hold one NPU's memory,
	// local or imported: drivertest's OneDeviceBinder); every driver's
	// SyncDevice (sleep.DeviceSyncer's: sleep waits for the whole device,
	// streams the library never made included, before it unmaps); the
	// accelerator drivers' SyncStreamHandle (libvmarena's vmarena_free
	// waits for the work on a framework's stream, given by its handle);
	// CUDA's MemInfo (cuMemGetInfo_v2: every process's use of the GPU,
	// which budget.NewDevice reads before each chunk it creates).
	for _, c := range []struct {
		dir, goos string
		extra     []string
	}{
		{"driver/host", "linux", []string{"Used", "Check", "HeapBytes", "SyncDevice"}},
		{"driver/host", "darwin", []string{"Used", "Check", "HeapBytes", "SyncDevice"}},
		{"driver/host", "windows", []string{"Used", "Check", "HeapBytes", "SyncDevice"}},
		{"driver/sim", "linux", []string{"Used", "Check", "Tally", "Calls", "SyncDevice"}},
		{"driver/cuda", "linux", []string{"Used", "Check", "Wait", "SyncDevice", "SyncStreamHandle", "MemInfo"}},
		{"driver/acl", "linux", []string{"Used", "Check", "Wait", "HostPID", "ReservationsBindOneDevice", "SyncDevice", "SyncStreamHandle"}},
	} {
		t.Run(c.dir+"/"+c.goos, func(t *testing.T) {
			pkg := packageFiles(t, files, c.dir, c.goos)
			require.NotEmpty(t, pkg)
			checkDriverType(t, pkg, ifaces, c.extra)
		})
	}
}

// packageFiles returns the files of the package in dir (relative to the
// module root) that build for goos, tests aside.
func packageFiles(t *testing.T, files map[string]*ast.File, dir, goos string) map[string]*ast.File {
	t.Helper()
	ctx := build.Default
	ctx.GOOS = goos
	ctx.GOARCH = "amd64"
	full := filepath.Join(root, dir)
	out := map[string]*ast.File{}
	for p, f := range files {
		if filepath.Dir(p) != full || strings.HasSuffix(p, "_test.go") {
			continue
		}
		ok, err := ctx.MatchFile(full, filepath.Base(p))
		require.NoError(t, err)
		if ok {
			out[p] = f
		}
	}
	return out
}

// interfacesOf returns, for each interface type declared in the package
// in dir, the names of its methods, those of embedded interfaces of the
// same package included.
func interfacesOf(t *testing.T, files map[string]*ast.File, dir string) map[string][]string {
	t.Helper()
	types := map[string]*ast.InterfaceType{}
	for p, f := range files {
		if filepath.Dir(p) != filepath.Join(root, dir) || strings.HasSuffix(p, "_test.go") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if it, ok := ts.Type.(*ast.InterfaceType); ok {
					types[ts.Name.Name] = it
				}
			}
			return true
		})
	}
	var methods func(name string, seen map[string]bool) []string
	methods = func(name string, seen map[string]bool) []string {
		if seen[name] {
			return nil
		}
		seen[name] = true
		var out []string
		for _, fld := range types[name].Methods.List {
			if _, ok := fld.Type.(*ast.FuncType); ok {
				for _, n := range fld.Names {
					out = append(out, n.Name)
				}
			} else if id, ok := fld.Type.(*ast.Ident); ok && types[id.Name] != nil {
				out = append(out, methods(id.Name, seen)...)
			}
		}
		return out
	}
	out := map[string][]string{}
	for name := range types {
		out[name] = methods(name, map[string]bool{})
	}
	return out
}

// implementsOnly matches a doc comment that only names the interface.
var implementsOnly = regexp.MustCompile(`^\w+ implements driver\.\w+\.?$`)

// checkDriverType checks the type Driver of one package build: no
// embedded or exported field; every method of driver.Driver and of the
// driver interfaces asserted on *Driver declared on it with a doc comment
// for users; no other exported method but extra.
func checkDriverType(t *testing.T, pkg map[string]*ast.File, ifaces map[string][]string, extra []string) {
	t.Helper()
	var st *ast.StructType
	asserted := []string{"Driver"}
	methods := map[string]*ast.FuncDecl{}
	for _, f := range pkg {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						if s, ok := sp.Type.(*ast.StructType); ok && sp.Name.Name == "Driver" {
							st = s
						}
					case *ast.ValueSpec:
						if x, ok := driverAssertion(sp); ok && !slices.Contains(asserted, x) {
							asserted = append(asserted, x)
						}
					}
				}
			case *ast.FuncDecl:
				if d.Recv != nil && receiverIsDriver(d.Recv) {
					methods[d.Name.Name] = d
				}
			}
		}
	}
	require.NotNil(t, st, "the package declares a struct type Driver")

	var bad []string
	for _, fld := range st.Fields.List {
		if len(fld.Names) == 0 {
			bad = append(bad, "embeds "+exprString(fld.Type)+": its exported methods and the field itself are promoted to every caller")
		}
		for _, n := range fld.Names {
			if n.IsExported() {
				bad = append(bad, "exports the field "+n.Name)
			}
		}
	}
	want := map[string]string{} // method -> the interface that asks for it
	for _, x := range asserted {
		ms, ok := ifaces[x]
		require.True(t, ok, "driver.%s, asserted on *Driver, is an interface of the driver package", x)
		for _, m := range ms {
			want[m] = "driver." + x
		}
	}
	for m, x := range want {
		fd := methods[m]
		switch {
		case fd == nil:
			bad = append(bad, m+" (of "+x+") is not declared on *Driver")
		case fd.Doc == nil || strings.TrimSpace(fd.Doc.Text()) == "":
			bad = append(bad, m+" has no doc comment")
		default:
			doc := strings.TrimSpace(fd.Doc.Text())
			if implementsOnly.MatchString(doc) {
				bad = append(bad, m+"'s doc only names its interface: "+doc)
			}
			for _, w := range []string{"ledger", "engine", "forward"} {
				if strings.Contains(strings.ToLower(doc), w) {
					bad = append(bad, m+"'s doc speaks of the internals ("+w+"): "+doc)
				}
			}
		}
	}
	for _, m := range extra {
		if fd := methods[m]; fd == nil || fd.Doc == nil {
			bad = append(bad, m+" (used outside the driver) is not declared on *Driver with a doc comment")
		}
	}
	for m := range methods {
		if ast.IsExported(m) && want[m] == "" && !slices.Contains(extra, m) {
			bad = append(bad, m+" is exported but is in no driver interface and not among the methods callers use ("+strings.Join(extra, ", ")+")")
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Errorf("the type Driver:\n%s", strings.Join(bad, "\n"))
	}
}

// driverAssertion reports X for `var _ driver.X = (*Driver)(nil)`.
func driverAssertion(sp *ast.ValueSpec) (string, bool) {
	if len(sp.Names) != 1 || sp.Names[0].Name != "_" || len(sp.Values) != 1 {
		return "", false
	}
	sel, ok := sp.Type.(*ast.SelectorExpr)
	if !ok || exprString(sel.X) != "driver" {
		return "", false
	}
	call, ok := sp.Values[0].(*ast.CallExpr)
	if !ok {
		return "", false
	}
	if exprString(call.Fun) != "(*Driver)" {
		return "", false
	}
	return sel.Sel.Name, true
}

// receiverIsDriver reports whether a method's receiver is Driver or *Driver.
func receiverIsDriver(recv *ast.FieldList) bool {
	if len(recv.List) != 1 {
		return false
	}
	typ := recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.Name == "Driver"
}

// exprString spells the few expressions the test meets: names, selectors,
// pointers and parentheses.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + exprString(e.X)
	case *ast.ParenExpr:
		return "(" + exprString(e.X) + ")"
	}
	return fmt.Sprintf("%T", e)
}
