package apitest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/bench"
	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/budget/kvmember"
	"github.com/vmarena/vmarena/disagg"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/ipc"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/kvevents"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/metrics"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/replay"
	"github.com/vmarena/vmarena/replay/input"
	"github.com/vmarena/vmarena/serving"
	"github.com/vmarena/vmarena/sleep"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/vaspace"
)

// root is the module's root, from this package's directory.
const root = "../.."

// exported lists every exported type with exported methods of the
// module's public packages. TestNilAndZeroReceivers calls each of their
// methods; TestExportedListed fails when a type is missing here, so a new
// type is covered as soon as it has methods.
var exported = []reflect.Type{
	reflect.TypeFor[vmarena.Memory](),
	reflect.TypeFor[arena.Allocator](), reflect.TypeFor[arena.Arena](), reflect.TypeFor[arena.BlockKind](),
	reflect.TypeFor[arena.OnFull](), reflect.TypeFor[arena.Policy](), reflect.TypeFor[arena.Sparse](),
	reflect.TypeFor[arena.Owned](), reflect.TypeFor[arena.View](), reflect.TypeFor[arena.Pool](),
	reflect.TypeFor[bench.GrowthStart](), reflect.TypeFor[bench.KVScale](), reflect.TypeFor[bench.Pair](),
	reflect.TypeFor[bench.Scaled](), reflect.TypeFor[bench.SequenceShape](), reflect.TypeFor[bench.KVTarget](),
	reflect.TypeFor[bench.KVTargetsMet](),
	reflect.TypeFor[disagg.Decode](), reflect.TypeFor[disagg.Local](), reflect.TypeFor[disagg.Prefill](),
	reflect.TypeFor[driver.Access](), reflect.TypeFor[driver.Addr](), reflect.TypeFor[driver.Feature](),
	reflect.TypeFor[driver.Kind](),
	reflect.TypeFor[acl.Driver](), reflect.TypeFor[acl.WaitMode](),
	reflect.TypeFor[cuda.Driver](), reflect.TypeFor[cuda.WaitMode](),
	reflect.TypeFor[host.Driver](),
	reflect.TypeFor[sim.Calls](), reflect.TypeFor[sim.Driver](), reflect.TypeFor[sim.Tally](),
	reflect.TypeFor[ipc.Conn](), reflect.TypeFor[ipc.ExportedPool](), reflect.TypeFor[ipc.ImportedPool](),
	reflect.TypeFor[ipc.Kind](), reflect.TypeFor[ipc.Listener](),
	reflect.TypeFor[budget.Book](), reflect.TypeFor[budget.Member](), reflect.TypeFor[budget.Device](), reflect.TypeFor[kvmember.Member](),
	reflect.TypeFor[kvcache.AllBlocksCleared](), reflect.TypeFor[kvcache.BlockRemoved](), reflect.TypeFor[kvcache.BlockStored](),
	reflect.TypeFor[kvcache.Cache](), reflect.TypeFor[kvcache.EventWriter](), reflect.TypeFor[kvcache.GroupKind](),
	reflect.TypeFor[kvcache.Hybrid](), reflect.TypeFor[kvcache.HybridSeq](), reflect.TypeFor[kvcache.Layout](), reflect.TypeFor[kvcache.PreemptMode](),
	reflect.TypeFor[kvcache.Seq](), reflect.TypeFor[kvcache.SlotState](), reflect.TypeFor[kvcache.UnitState](),
	reflect.TypeFor[kvevents.Layout](), reflect.TypeFor[kvevents.Publisher](), reflect.TypeFor[kvevents.VLLMHasher](),
	reflect.TypeFor[mapping.State](), reflect.TypeFor[mapping.Table](),
	reflect.TypeFor[metrics.Collector](),
	reflect.TypeFor[multidev.Arena](),
	reflect.TypeFor[physical.Chunk](), reflect.TypeFor[physical.Memory](),
	reflect.TypeFor[pool.Attr](), reflect.TypeFor[pool.ImportHolder](), reflect.TypeFor[pool.Pool](),
	reflect.TypeFor[replay.DeviceResult](), reflect.TypeFor[replay.DriverTimes](), reflect.TypeFor[input.Prefix](), reflect.TypeFor[replay.Figures](), reflect.TypeFor[replay.MapKind](),
	reflect.TypeFor[replay.Op](), reflect.TypeFor[replay.Options](), reflect.TypeFor[replay.Policy](),
	reflect.TypeFor[replay.RandomLifetimes](), reflect.TypeFor[replay.Summary](),
	reflect.TypeFor[serving.BlockTable](), reflect.TypeFor[serving.Cache](), reflect.TypeFor[serving.Config](),
	reflect.TypeFor[serving.Stats](), reflect.TypeFor[serving.Model](), reflect.TypeFor[serving.RequestTrace](),
	reflect.TypeFor[serving.RequestsSummary](), reflect.TypeFor[serving.Options](), reflect.TypeFor[serving.SimRequest](),
	reflect.TypeFor[serving.Result](), reflect.TypeFor[serving.StaticReservation](), reflect.TypeFor[serving.GroupKind](),
	reflect.TypeFor[serving.HybridBlockTable](), reflect.TypeFor[serving.HybridCache](), reflect.TypeFor[serving.Request](),
	reflect.TypeFor[sleep.Manager](), reflect.TypeFor[sleep.Mode](),
	reflect.TypeFor[stream.Event](), reflect.TypeFor[stream.HostBuffer](), reflect.TypeFor[stream.Stream](),
	reflect.TypeFor[tensor.BF16](), reflect.TypeFor[tensor.DType](), reflect.TypeFor[tensor.F16](),
	reflect.TypeFor[tensor.Growable](), reflect.TypeFor[tensor.Lease](), reflect.TypeFor[tensor.Tensor](),
	reflect.TypeFor[transfer.Descriptor](), reflect.TypeFor[transfer.Engine](), reflect.TypeFor[transfer.Peer](),
	reflect.TypeFor[transfer.Registration](),
	reflect.TypeFor[vaspace.Range](), reflect.TypeFor[vaspace.Reservation](), reflect.TypeFor[vaspace.Space](),
	reflect.TypeFor[vaspace.Owner](), reflect.TypeFor[vaspace.Use](),
}

// skipped are the packages whose exported types are not covered: test
// support (their methods take a *testing.T) and programs.
func skipped(dir string) bool {
	for _, s := range []string{"internal", "testdata", "examples", "cmd", "drivertest", "testdrivers", "cudatest", "acltest"} {
		if slices.Contains(strings.Split(dir, string(filepath.Separator)), s) {
			return true
		}
	}
	return false
}

// TestExportedListed: every exported type that has exported methods, in
// every package not skipped, is in exported.
func TestExportedListed(t *testing.T) {
	listed := map[string]bool{}
	for _, typ := range exported {
		rel := strings.TrimPrefix(typ.PkgPath(), "github.com/vmarena/vmarena/")
		if typ.PkgPath() == "github.com/vmarena/vmarena" {
			rel = "." // the root package, as filepath.Rel names it
		}
		listed[rel+"."+typ.Name()] = true
	}
	var missing []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if strings.HasPrefix(d.Name(), ".") && p != root || skipped(rel) {
			return filepath.SkipDir
		}
		pkgs, err := parser.ParseDir(fset, p, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
		if err != nil {
			return err
		}
		for name, pkg := range pkgs {
			if name == "main" {
				continue
			}
			for _, f := range pkg.Files {
				for _, decl := range f.Decls {
					fd, ok := decl.(*ast.FuncDecl)
					if !ok || fd.Recv == nil || !fd.Name.IsExported() {
						continue
					}
					recv := fd.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if id, ok := recv.(*ast.Ident); ok && id.IsExported() && !listed[rel+"."+id.Name] {
						listed[rel+"."+id.Name] = true
						missing = append(missing, rel+"."+id.Name)
					}
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, missing, "exported types with methods that the nil and zero value test does not call: add them to exported")
}

// harmless lists the methods that may answer a nil error on a nil or zero
// receiver, and why.
var harmless = map[string]string{}

// TestNilAndZeroReceivers calls every exported method of every exported
// type on a nil pointer (methods with pointer receivers: a value receiver
// dereferences a nil pointer before the method runs, in Go's own code)
// and on a pointer to the zero value, every argument its zero value. None
// may panic or hang. On a type with pointer-receiver methods (an object
// made by a constructor) a method that returns an error must return one;
// other results answer a harmless zero. Types with value receivers only
// are values: their zero value is a value like any other.
//
// Each method is called twice: with every argument its zero value, and
// with plausible ones (argValue: sizes and addresses of 4 KiB, a
// one-element slice, a pointer to a zero value), so that a check of the
// arguments that returns early on a zero size does not hide a receiver
// that is never checked (a zero Allocator dividing by its zero chunk
// size in Alloc(4096, 4096)).
func TestNilAndZeroReceivers(t *testing.T) {
	for _, typ := range exported {
		ptr := reflect.PointerTo(typ)
		object := ptr.NumMethod() > typ.NumMethod()
		for i := range ptr.NumMethod() {
			m := ptr.Method(i)
			_, valueRecv := typ.MethodByName(m.Name)
			name := fmt.Sprintf("%s.%s", typ, m.Name)
			for _, plausible := range []bool{false, true} {
				args := name + " with zero arguments"
				if plausible {
					args = name + " with plausible arguments"
				}
				if !valueRecv {
					call(t, args+" on nil", reflect.Zero(ptr), m, object, plausible)
				}
				call(t, args+" on zero", reflect.New(typ), m, object, plausible)
			}
		}
	}
}

// argValue is a plausible argument of type typ: 4096 for a number (a
// size, an alignment, an address or an offset that any granularity
// divides), "x" for a string, true, a one-element slice or a pointer to
// one of its element's, a pointer to a zero value; nil for interfaces,
// funcs, maps and channels.
func argValue(typ reflect.Type) reflect.Value {
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(min(4096, int64(1)<<(typ.Bits()-2)))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(min(4096, uint64(1)<<(typ.Bits()-1)))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v = reflect.MakeSlice(typ, 1, 1)
		v.Index(0).Set(argValue(typ.Elem()))
	case reflect.Pointer:
		v = reflect.New(typ.Elem())
	}
	return v
}

// call calls m on recv with zero arguments (plausible ones: argValue),
// and fails t if it panics or (when wantErr) answers a nil error. A call
// that hangs is a hang of the test binary, which go test reports.
func call(t *testing.T, name string, recv reflect.Value, m reflect.Method, wantErr, plausible bool) {
	t.Helper()
	ft := m.Type // the receiver is argument 0
	args := []reflect.Value{recv}
	n := ft.NumIn()
	if ft.IsVariadic() {
		n--
	}
	for i := 1; i < n; i++ {
		if plausible {
			args = append(args, argValue(ft.In(i)))
		} else {
			args = append(args, reflect.Zero(ft.In(i)))
		}
	}
	type result struct {
		out   []reflect.Value
		panic any
	}
	r := func() (r result) {
		defer func() {
			if p := recover(); p != nil {
				r.panic = p
			}
		}()
		return result{out: m.Func.Call(args)}
	}()
	if r.panic != nil {
		t.Errorf("%s panicked: %v", name, r.panic)
		return
	}
	if !wantErr || len(r.out) == 0 || ft.Out(ft.NumOut()-1) != reflect.TypeFor[error]() {
		return
	}
	if _, ok := harmless[name]; ok {
		return
	}
	if r.out[len(r.out)-1].IsNil() {
		t.Errorf("%s answered no error", name)
	}
}
