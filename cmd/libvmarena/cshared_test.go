package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/testexec"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The tests in this file build libvmarena.so the way its users do (go
// build -buildmode=c-shared) and load it from C (gcc) and Python (ctypes),
// as torch.cuda.memory.CUDAPluggableAllocator does. They skip when the
// machine has no C compiler (a failure when VMARENA_REQUIRE_STANDIN=1, as
// scripts/test sets) or no python3.

// sleepCode is what vmarena_sleep and vmarena_wake return in the C and
// Python cycles: 0, as newBackend makes the sleep package's Manager (the
// programs take it as an argument; VMARENA_ERR_UNSUPPORTED was the answer
// of a build without sleep).
const sleepCode = codeOK

// testDir holds what the tests build, for the test binary's life.
var testDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "libvmarena-test-")
	if err != nil {
		panic(err)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// built is the library, built once per test binary.
var built struct {
	once     sync.Once
	so, hdr  string // the library and the header the build generated
	err      error
	out      string
	skipWhy  string
	buildFor time.Duration
}

// requireCompiler skips (or fails, under VMARENA_REQUIRE_STANDIN=1) when
// there is no C compiler: without one there is no cgo and no c-shared
// build.
func requireCompiler(tb testing.TB) string {
	tb.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("VMARENA_REQUIRE_STANDIN") == "1" {
			tb.Fatal("no gcc, and VMARENA_REQUIRE_STANDIN=1: install gcc")
		}
		tb.Skip("no gcc: libvmarena is a cgo build; install gcc to run this test")
	}
	return gcc
}

// buildLibrary builds libvmarena.so into testDir, once.
func buildLibrary(tb testing.TB) (so, header string) {
	tb.Helper()
	requireCompiler(tb)
	built.once.Do(func() {
		gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(gocmd); err != nil {
			if gocmd, err = exec.LookPath("go"); err != nil {
				built.skipWhy = "no go command to build the library with"
				return
			}
		}
		built.so = filepath.Join(testDir, "libvmarena.so")
		built.hdr = filepath.Join(testDir, "libvmarena.h")
		// A cold cache builds the standard library and every dependency
		// again for -shared: about 40 s on two cores, several minutes on
		// a loaded one. No limit of its own: go test's -timeout bounds it
		// (testexec.Context).
		ctx, cancel := testexec.Context(tb)
		defer cancel()
		cmd := exec.CommandContext(ctx, gocmd, "build", "-buildmode=c-shared", "-o", built.so, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		built.buildFor, built.out, built.err = time.Since(start), string(out), err
	})
	if built.skipWhy != "" {
		tb.Skip(built.skipWhy)
	}
	require.NoError(tb, built.err, "go build -buildmode=c-shared:\n%s", built.out)
	tb.Logf("libvmarena.so built in %s", built.buildFor.Round(time.Millisecond))
	return built.so, built.hdr
}

// prototypes are the vmarena_ function declarations of a header, one
// string each, normalized: one space between tokens, none inside
// "name(", "*" attached to its type, "extern" and "const" dropped (cgo's
// generated header has no const; the committed one marks the strings the
// library does not write).
func prototypes(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	src = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAll(src, nil)
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^[ \t]*extern[ \t]+[^;(\n]*\bvmarena_\w+\s*\([^)]*\)\s*;`).FindAll(src, -1) {
		s := string(m)
		s = regexp.MustCompile(`\b(extern|const)\b`).ReplaceAllString(s, " ")
		s = strings.Join(strings.Fields(s), " ")
		s = regexp.MustCompile(`\s*\*\s*`).ReplaceAllString(s, "* ")
		s = regexp.MustCompile(`\s*([(),;])\s*`).ReplaceAllString(s, "$1")
		s = strings.ReplaceAll(s, ",", ", ")
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func TestHeaderMatchesBuild(t *testing.T) {
	_, generated := buildLibrary(t)
	want := prototypes(t, generated)
	require.NotEmpty(t, want, "no vmarena_ prototypes in the generated header")
	require.Contains(t, want, "void* vmarena_alloc(ssize_t size, int device, cudaStream_t stream);")
	require.Contains(t, want, "void vmarena_free(void* ptr, size_t size, int device, cudaStream_t stream);")
	require.Equal(t, want, prototypes(t, "vmarena.h"), "vmarena.h must declare exactly the library's exports")

	// The comparison sees a changed parameter.
	h, err := os.ReadFile("vmarena.h")
	require.NoError(t, err)
	changed := filepath.Join(t.TempDir(), "changed.h")
	require.NoError(t, os.WriteFile(changed, bytes.Replace(h, []byte("size_t size, int device"), []byte("size_t size, long device"), 1), 0o644))
	require.NotEqual(t, want, prototypes(t, changed))
}

// runChecked runs cmd until it exits (or go test's -timeout nears:
// testexec.Context) and returns its output; it fails the test unless the
// command exits 0 and prints "ok" last.
func runChecked(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := testexec.Context(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "%s was killed as go test's -timeout neared:\n%s", name, out)
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Equal(t, "ok", lines[len(lines)-1], "%s:\n%s", name, out)
	return string(out)
}

// hostEnv is the library's environment in these tests: the host driver,
// with a small device.
var hostEnv = []string{"VMARENA_DRIVER=host", "VMARENA_CAPACITY=256MiB", "VMARENA_DEVICES=1"}

// programs are the C programs of testdata, each compiled once per test
// binary by compileProgram (five tests run cycles.c, two gpucycles.c).
var programs sync.Map // name -> *programBuild

type programBuild struct {
	once sync.Once
	bin  string
	out  []byte
	err  error
}

// compileProgram compiles testdata/name.c against the library, once, with
// gcc's flags and extra before the libraries.
func compileProgram(tb testing.TB, name string, extra ...string) string {
	tb.Helper()
	so, _ := buildLibrary(tb)
	gcc := requireCompiler(tb)
	v, _ := programs.LoadOrStore(name, &programBuild{})
	p := v.(*programBuild)
	p.once.Do(func() {
		p.bin = filepath.Join(testDir, name)
		dir := filepath.Dir(so)
		args := append([]string{"-O2", "-Wall", "-Wextra", "-Werror"}, extra...)
		args = append(args, "-I", ".", "-o", p.bin, filepath.Join("testdata", name+".c"),
			"-L", dir, "-lvmarena", "-Wl,-rpath,"+dir, "-ldl")
		p.out, p.err = exec.Command(gcc, args...).CombinedOutput()
	})
	require.NoError(tb, p.err, "gcc testdata/%s.c:\n%s", name, p.out)
	return p.bin
}

// compileCycles compiles testdata/cycles.c against the library.
func compileCycles(tb testing.TB) string {
	tb.Helper()
	return compileProgram(tb, "cycles", "-pthread")
}

func TestCProgram(t *testing.T) {
	bin := compileCycles(t)
	out := runChecked(t, hostEnv, bin, "run", "1000", strconv.Itoa(sleepCode))
	t.Logf("%s", out)
}

// standins are the C stand-ins of the vendor libraries, built once per
// test binary by standinLibrary.
var standins sync.Map // vendor -> *standinBuild

type standinBuild struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

// standinLibrary builds the C stand-in of vendor's library ("cuda":
// libcuda.so.1, "acl": libascendcl.so) that driver/internal/standin
// builds for the drivers' tests, from the same sources and with the same
// flags. cmd/ may not import that package (Go's internal rule), so the
// test compiles the sources by their path in the repository.
func standinLibrary(t *testing.T, vendor string) string {
	t.Helper()
	gcc := requireCompiler(t)
	v, _ := standins.LoadOrStore(vendor, &standinBuild{})
	b := v.(*standinBuild)
	b.once.Do(func() {
		name := map[string]string{"cuda": "libcuda.so.1", "acl": "libascendcl.so"}[vendor]
		b.path = filepath.Join(testDir, vendor, name)
		if b.err = os.MkdirAll(filepath.Dir(b.path), 0o755); b.err != nil {
			return
		}
		src := filepath.Join("..", "..", "driver", "internal", "standin", "c")
		b.out, b.err = exec.Command(gcc, "-std=gnu11", "-O1", "-g", "-shared", "-fPIC", "-Wall", "-Wextra", "-pthread",
			"-o", b.path, filepath.Join(src, "vdev.c"), filepath.Join(src, "vshare.c"), filepath.Join(src, vendor+".c")).CombinedOutput()
	})
	require.NoError(t, b.err, "gcc the %s stand-in:\n%s", vendor, b.out)
	return b.path
}

// standinEnv is the library's environment over vendor's stand-in: its
// driver, the stand-in as the vendor library it loads, and the stand-in
// again for cycles.c, which reads the device's used bytes from it.
func standinEnv(t *testing.T, vendor string) []string {
	path := standinLibrary(t, vendor)
	return []string{"VMARENA_DRIVER=" + vendor, "VMARENA_" + strings.ToUpper(vendor) + "_LIBRARY=" + path,
		"VMARENA_TEST_STANDIN=" + path, "VMARENA_CAPACITY=", "VMARENA_DEVICES="}
}

// TestCProgramOnStandins runs the C cycles on the cuda and acl drivers,
// over the stand-ins of libcuda.so.1 and libascendcl.so: each sleep gives
// the tag's memory back to the device (its used bytes drop by what the
// tag held), each wake restores the bytes at the same addresses, the
// device's used bytes and objects, descriptors and mappings do not grow,
// and after vmarena_shutdown the device holds nothing. 100 cycles (the
// host run has 1,000): the stand-in's books are exact, and the run costs
// about a second each.
func TestCProgramOnStandins(t *testing.T) {
	bin := compileCycles(t)
	for _, vendor := range []string{"cuda", "acl"} {
		t.Run(vendor, func(t *testing.T) {
			out := runChecked(t, standinEnv(t, vendor), bin, "run", "100", strconv.Itoa(sleepCode))
			t.Logf("%s", out)
		})
	}
}

// TestCCallerContextStaysCurrent: on cuda, a C thread with a context of
// its own (cuCtxCreate) finds it current again after every call of the
// library, the first (which opens the driver) included.
func TestCCallerContextStaysCurrent(t *testing.T) {
	bin := compileCycles(t)
	runChecked(t, standinEnv(t, "cuda"), bin, "context")
}

// TestCFreeWaitsForItsStream: on cuda, vmarena_free returns only after
// the work queued on its stream has run (the stand-in holds work on the
// default stream, PyTorch's stream 0), and a stream it cannot wait for
// frees nothing.
func TestCFreeWaitsForItsStream(t *testing.T) {
	bin := compileCycles(t)
	runChecked(t, standinEnv(t, "cuda"), bin, "stream")
}

// compileGPUCycles compiles testdata/gpucycles.c against the library.
func compileGPUCycles(t *testing.T) string {
	t.Helper()
	return compileProgram(t, "gpucycles")
}

// TestGPUCyclesOnStandin runs testdata/gpucycles.c, the program that
// checks the library on a GPU through the CUDA driver API, over the CUDA
// stand-in (a few cycles; the stand-in has no cuMemGetInfo, so the free
// memory checks are left out), so that a run on a GPU machine is not the
// first run of the program.
func TestGPUCyclesOnStandin(t *testing.T) {
	bin := compileGPUCycles(t)
	runChecked(t, standinEnv(t, "cuda"), bin, "10", "2")
}

// TestGPUCycles runs testdata/gpucycles.c on the machine's GPU: 200
// cycles of 64 MiB weights and a 16 MiB KV cache through sleep and wake,
// the device's free memory (cuMemGetInfo) checked after each, the
// caller's context checked after each call, and a free that must wait
// for its busy stream. It skips where no NVIDIA driver or GPU is found.
func TestGPUCycles(t *testing.T) {
	rep, err := cuda.Probe("")
	if err != nil || len(rep.Devices) == 0 {
		t.Skipf("no GPU: %v", err)
	}
	bin := compileGPUCycles(t)
	out := runChecked(t, []string{"VMARENA_DRIVER=cuda"}, bin, "200", "64")
	t.Logf("%s", out)
}

// TestCThreadsHaveTheirOwnTags checks that a tag and a last error belong
// to the thread that set them.
func TestCThreadsHaveTheirOwnTags(t *testing.T) {
	bin := compileCycles(t)
	runChecked(t, hostEnv, bin, "threads")
}

func TestPythonPluggableAllocator(t *testing.T) {
	so, _ := buildLibrary(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3: the ctypes test of the PyTorch allocator ABI needs it")
	}
	out := runChecked(t, hostEnv, py, "testdata/pluggable.py", so, "1000", strconv.Itoa(sleepCode))
	t.Logf("%s", out)
}

// BenchmarkCAllocFree measures a C call of vmarena_alloc + vmarena_free of
// 1 MiB that the library serves from memory it holds (no driver call),
// timed in C by testdata/cycles.c, beside its baseline in this process: the
// same Alloc + Free on an arena.Allocator called from Go. c-ns/op is the
// target's figure (at most 1 µs), c/go the cost of the C boundary and the
// library's bookkeeping as a ratio.
func BenchmarkCAllocFree(b *testing.B) {
	bin := compileCycles(b)
	d, err := host.New(host.Options{Capacity: 256 * units.MiB})
	require.NoError(b, err)
	space, mem := vaspace.New(d), physical.New(d)
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{})
	require.NoError(b, err)
	defer func() {
		require.NoError(b, al.Close())
		require.NoError(b, space.Close())
		require.NoError(b, mem.Close())
		require.NoError(b, d.Close())
	}()
	const size = units.MiB
	p, err := al.Alloc(size, 0)
	require.NoError(b, err)
	require.NoError(b, al.Free(p))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		p, err := al.Alloc(size, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := al.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	goNs := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.StopTimer()
	cmd := exec.Command(bin, "bench", strconv.Itoa(max(b.N, 100_000)))
	cmd.Env = append(os.Environ(), hostEnv...)
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "%s", out)
	m := regexp.MustCompile(`ns/op ([0-9.]+)`).FindSubmatch(out)
	require.NotNil(b, m, "%s", out)
	cNs, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(b, err)
	require.True(b, bytes.HasSuffix(bytes.TrimSpace(out), []byte("ok")), "%s", out)
	b.ReportMetric(cNs, "c-ns/op")
	b.ReportMetric(goNs, "go-ns/op")
	b.ReportMetric(cNs/goNs, "c/go")
}

// TestCHostileCalls runs testdata/hostile.c: bad calls from C, each
// refused with its code and message, the process alive.
func TestCHostileCalls(t *testing.T) {
	bin := compileProgram(t, "hostile", "-pthread")
	for _, c := range []string{"tags", "strings", "empty", "calls", "race"} {
		t.Run(c, func(t *testing.T) {
			runChecked(t, hostEnv, bin, c)
		})
	}
	// On cuda a free waits for its stream without the library's lock:
	// the race again, over the stand-in.
	t.Run("race/cuda", func(t *testing.T) {
		runChecked(t, standinEnv(t, "cuda"), bin, "race")
	})
}
