package standin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver/internal/dl"
)

//go:embed c/*.c c/*.h
var sources embed.FS

// Vendor names a front-end of the stand-in.
type Vendor string

const (
	// CUDA is NVIDIA's driver API: front-end cuda.c, opened as libcuda.so.1.
	CUDA Vendor = "cuda"
	// ACL is Huawei's AscendCL: front-end acl.c, opened as libascendcl.so.
	ACL Vendor = "acl"
)

// FileName is the name the vendor's driver opens the library by.
func (v Vendor) FileName() string {
	switch v {
	case CUDA:
		return "libcuda.so.1"
	case ACL:
		return "libascendcl.so"
	}
	return "lib" + string(v) + ".so"
}

// frontEnd is the C file that exports v's symbols.
func (v Vendor) frontEnd() string { return "c/" + string(v) + ".c" }

// OmitGroups are the symbol groups a build can leave out, so that a test
// can prove that a library missing them loses just the feature they serve.
// Each is -DVMSTANDIN_OMIT_<GROUP> in the C sources; a group a vendor has
// no symbol of (hostfunc for AscendCL, mapnoaccess for CUDA) changes
// nothing there.
var OmitGroups = []string{"export", "hostfunc", "events", "peer", "streams", "hostalloc", "synccopy", "vmm", "mapnoaccess", "devsync"}

// Config is the emulated machine. Zero fields keep the stand-in's defaults:
// 2 devices of 64 MiB, minimum and recommended granularity 2 MiB, every
// feature present.
type Config struct {
	Devices  int
	Capacity uint64 // bytes per device

	MinGranularity, RecommendedGranularity uint64

	NoVMM     bool // no virtual memory management (attribute 0, calls not supported)
	NoPOSIXFD bool // no POSIX descriptor export and import
	NoPools   bool // memory pools attribute 0
	NoPeer    bool // devices cannot be peers
	Stub      bool // every call fails as the toolkit's link stub does
	NoDevice  bool // initialisation finds no device

	// Omit lists symbol groups left out at compile time (see OmitGroups).
	Omit []string
}

// Spec is the configuration string vmstandin_configure takes.
func (c Config) Spec() string {
	var items []string
	num := func(key string, v uint64) {
		if v != 0 {
			items = append(items, fmt.Sprintf("%s=%d", key, v))
		}
	}
	flag := func(key string, on bool) {
		if on {
			items = append(items, key+"=1")
		}
	}
	if c.Devices != 0 {
		items = append(items, fmt.Sprintf("devices=%d", c.Devices))
	}
	num("capacity", c.Capacity)
	num("mingran", c.MinGranularity)
	num("recgran", c.RecommendedGranularity)
	flag("novmm", c.NoVMM)
	flag("noposix", c.NoPOSIXFD)
	flag("nopools", c.NoPools)
	flag("nopeer", c.NoPeer)
	flag("stub", c.Stub)
	flag("nodevice", c.NoDevice)
	return strings.Join(items, ",")
}

// cflags are the compiler flags of every build.
var cflags = []string{"-std=gnu11", "-O1", "-g", "-shared", "-fPIC", "-Wall", "-Wextra", "-pthread"}

// compilerCommand finds the C compiler: $CC (a program and its arguments)
// when set, else cc, else gcc.
func compilerCommand() ([]string, error) {
	if env := strings.Fields(os.Getenv("CC")); len(env) > 0 {
		path, err := exec.LookPath(env[0])
		if err != nil {
			return nil, errors.Wrapf(err, "standin: $CC=%q", os.Getenv("CC"))
		}
		return append([]string{path}, env[1:]...), nil
	}
	for _, name := range []string{"cc", "gcc"} {
		if path, err := exec.LookPath(name); err == nil {
			return []string{path}, nil
		}
	}
	return nil, errors.New("standin: no C compiler: neither cc nor gcc is on PATH and $CC is not set")
}

// Compiler returns the C compiler the stand-in is built with, or why there
// is none.
func Compiler() (string, error) {
	cmd, err := compilerCommand()
	if err != nil {
		return "", err
	}
	return strings.Join(cmd, " "), nil
}

// normaliseOmit checks the groups and returns them sorted, once each.
func normaliseOmit(omit []string) ([]string, error) {
	out := slices.Clone(omit)
	slices.Sort(out)
	out = slices.Compact(out)
	for _, g := range out {
		if !slices.Contains(OmitGroups, g) {
			return nil, errors.Newf("standin: unknown omit group %q (known: %s)", g, strings.Join(OmitGroups, ", "))
		}
	}
	return out, nil
}

// sourceFiles are the embedded files v's library is built from.
func sourceFiles(v Vendor) ([]string, error) {
	if _, err := fs.Stat(sources, v.frontEnd()); err != nil {
		return nil, errors.Newf("standin: vendor %q has no front-end (%s)", v, v.frontEnd())
	}
	return []string{"c/vdev.h", "c/vdev.c", "c/vshare.c", v.frontEnd()}, nil
}

// compile builds v's library without omit into out and returns what the
// compiler printed.
func compile(cc []string, v Vendor, omit []string, out string) ([]byte, error) {
	files, err := sourceFiles(v)
	if err != nil {
		return nil, err
	}
	src, err := os.MkdirTemp(filepath.Dir(out), ".src-*")
	if err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	defer os.RemoveAll(src)
	args := append(slices.Clone(cc[1:]), cflags...)
	for _, g := range omit {
		args = append(args, "-DVMSTANDIN_OMIT_"+strings.ToUpper(g))
	}
	args = append(args, "-o", out)
	for _, f := range files {
		data, err := sources.ReadFile(f)
		if err != nil {
			return nil, errors.Wrap(err, "standin")
		}
		dst := filepath.Join(src, filepath.Base(f))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return nil, errors.Wrap(err, "standin")
		}
		if strings.HasSuffix(f, ".c") {
			args = append(args, dst)
		}
	}
	cmd := exec.Command(cc[0], args...)
	output, err := cmd.CombinedOutput()
	if err != nil {
		return output, errors.Newf("standin: %s failed: %v\n%s", strings.Join(cmd.Args, " "), err, output)
	}
	return output, nil
}

// buildKey names a build: the compiler, the flags, the vendor, the omitted
// groups and every source byte.
func buildKey(cc []string, v Vendor, omit []string) (string, error) {
	files, err := sourceFiles(v)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q %q\n", cc, cflags, v, omit)
	for _, f := range files {
		data, err := sources.ReadFile(f)
		if err != nil {
			return "", errors.Wrap(err, "standin")
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// built remembers this process's builds by key; each key has its own
// lock, so that builds of different variants run side by side.
var built struct {
	sync.Mutex
	keys map[string]*build
}

type build struct {
	sync.Mutex
	path string
	out  []byte
}

// outputName is the file beside a build holding what the compiler printed
// making it, so that a later test reads the compiler's warnings from the
// cache instead of compiling the variant again.
const outputName = "compiler-output"

// Build compiles v's library without the omit groups and returns its path,
// under os.TempDir()/vmarena-standin/<hash>/. A build is made once per
// distinct compiler, vendor, omit list and source, and reused by every test
// binary: it is written under a temporary name and renamed into place, so
// parallel test binaries never see half a file.
func Build(v Vendor, omit []string) (string, error) {
	path, _, err := buildOutput(v, omit)
	return path, err
}

// buildOutput is Build, also returning what the compiler printed when it
// made the build (kept beside it, compiler-output): its warnings. A build
// without that file (made before the file was kept) is made again.
func buildOutput(v Vendor, omit []string) (string, []byte, error) {
	cc, err := compilerCommand()
	if err != nil {
		return "", nil, err
	}
	omit, err = normaliseOmit(omit)
	if err != nil {
		return "", nil, err
	}
	key, err := buildKey(cc, v, omit)
	if err != nil {
		return "", nil, err
	}
	built.Lock()
	b, ok := built.keys[key]
	if !ok {
		if built.keys == nil {
			built.keys = map[string]*build{}
		}
		b = &build{}
		built.keys[key] = b
	}
	built.Unlock()
	b.Lock()
	defer b.Unlock()
	if b.path != "" {
		return b.path, b.out, nil
	}
	dir := filepath.Join(os.TempDir(), "vmarena-standin", key)
	path := filepath.Join(dir, v.FileName())
	outPath := filepath.Join(dir, outputName)
	_, err = os.Stat(path)
	out, oerr := os.ReadFile(outPath)
	if err != nil || oerr != nil {
		if out, err = buildInto(cc, v, omit, dir, path, outPath); err != nil {
			return "", nil, err
		}
	}
	b.path, b.out = path, out
	return path, out, nil
}

// buildInto compiles into dir and renames the compiler's output, then the
// library, into place: a library in the cache always has its output beside
// it.
func buildInto(cc []string, v Vendor, omit []string, dir, path, outPath string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	tmp, err := os.CreateTemp(dir, ".build-*.so")
	if err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	out, err := compile(cc, v, omit, tmp.Name())
	if err != nil {
		return nil, err
	}
	tmpOut, err := os.CreateTemp(dir, ".output-*")
	if err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	defer os.Remove(tmpOut.Name())
	_, werr := tmpOut.Write(out)
	if cerr := tmpOut.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, errors.Wrap(werr, "standin")
	}
	if err := os.Rename(tmpOut.Name(), outPath); err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, errors.Wrap(err, "standin")
	}
	return out, nil
}

// requireEnv, set to 1, turns a missing compiler from a skip into a
// failure: CI sets it, so a broken toolchain cannot silently skip the tests
// the stand-in exists for.
const requireEnv = "VMARENA_REQUIRE_STANDIN"

// needCompiler skips the test when there is no C compiler, or fails it
// when VMARENA_REQUIRE_STANDIN=1.
func needCompiler(tb testing.TB) {
	tb.Helper()
	if _, err := Compiler(); err != nil {
		if os.Getenv(requireEnv) == "1" {
			tb.Fatalf("%v (%s=1 requires the stand-in)", err, requireEnv)
		}
		tb.Skipf("%v: skipping the stand-in test", err)
	}
}

// Open builds the library v with cfg.Omit, copies it into tb.TempDir()
// under v's file name — dlopen of a new path is a fresh instance with state
// of its own — opens it and configures it with cfg. It skips the test when
// there is no C compiler, unless VMARENA_REQUIRE_STANDIN=1. When the test
// ends, an instance with nothing live is retired: its devices are gone.
func Open(tb testing.TB, v Vendor, cfg Config) *Lib {
	tb.Helper()
	needCompiler(tb)
	so, err := Build(v, cfg.Omit)
	if err != nil {
		tb.Fatalf("%+v", err)
	}
	path := filepath.Join(tb.TempDir(), v.FileName())
	if err := copyFile(so, path); err != nil {
		tb.Fatalf("%+v", err)
	}
	l, err := OpenPath(path, cfg)
	if err != nil {
		tb.Fatalf("%+v", err)
	}
	// Once the test and its cleanups are done, an instance holding nothing
	// gives back its devices' descriptors (the library itself stays
	// loaded: it is never closed). One still holding objects keeps them;
	// the test's RequireEmpty reports those.
	tb.Cleanup(func() { l.retire() })
	return l
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return errors.Wrap(err, "standin")
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return errors.Wrap(err, "standin")
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return errors.Wrap(err, "standin")
	}
	return errors.Wrap(out.Close(), "standin")
}

// Lib is an opened stand-in: the handle its functions were found in and
// the library's own test interface. It is never closed.
type Lib struct {
	path   string
	handle uintptr

	configure func(spec string) int32
	fail      func(fn string, nth, count, code int32)
	clear     func()
	calls     func(fn string) uint64
	used      func(dev int32) uint64
	live      func(what string) int64
	access    func(addr uint64, dev int32) int32
	retire    func() int64
	hold      func(dev int32) int32
	release   func()
	held      func() uint64
}

// OpenPath opens the library at path (a child process loading the file its
// parent tested) and configures it with cfg; cfg.Omit is not used, the file
// is what it is. Opening a path already open in this process returns the
// same instance, which must not have been initialised yet.
func OpenPath(path string, cfg Config) (*Lib, error) {
	l := &Lib{path: path}
	bound, err := dl.Open(path, []dl.Symbol{
		{Name: "vmstandin_configure", Fn: &l.configure},
		{Name: "vmstandin_fail", Fn: &l.fail},
		{Name: "vmstandin_clear", Fn: &l.clear},
		{Name: "vmstandin_calls", Fn: &l.calls},
		{Name: "vmstandin_used", Fn: &l.used},
		{Name: "vmstandin_live", Fn: &l.live},
		{Name: "vmstandin_access", Fn: &l.access},
		{Name: "vmstandin_retire", Fn: &l.retire},
		{Name: "vmstandin_hold", Fn: &l.hold},
		{Name: "vmstandin_release", Fn: &l.release},
		{Name: "vmstandin_held", Fn: &l.held},
	}, 1)
	if err != nil {
		return nil, errors.Wrapf(err, "standin: dlopen %s", path)
	}
	if !bound.Has[0] {
		return nil, errors.Newf("standin: %s is not a stand-in: it lacks %v", path, bound.Missing[0])
	}
	l.handle = bound.Handle
	if spec := cfg.Spec(); l.configure(spec) != 0 {
		return nil, errors.Newf("standin: configuration %q refused (bad value, or the library is initialised already)", spec)
	}
	return l, nil
}

// Path is what the driver under test is told to dlopen.
func (l *Lib) Path() string { return l.path }

// Fail makes calls nth .. nth+count-1 of the exported function fn (counted
// from now, 1-based) return code, doing nothing; count <= 0 means every call
// from the nth on, nth <= 0 clears fn's injection. "fn:exec" lets the call
// enqueue its operation and makes the operation fail with code as it runs
// (code 700, CUDA's illegal address, is sticky as the real one is).
func (l *Lib) Fail(fn string, nth, count, code int) {
	l.fail(fn, int32(nth), int32(count), int32(code))
}

// Hold queues, on the default stream of device dev's primary context — a
// stream the driver under test never made, as a framework's (PyTorch's)
// would be — work that runs until Release: what a whole-device
// synchronisation (cuCtxSynchronize, aclrtSynchronizeDevice) must wait
// for. Held counts the held operations that have finished. A test that
// holds releases in a cleanup registered after the stand-in's.
func (l *Lib) Hold(dev int) error {
	if l.hold(int32(dev)) != 0 {
		return errors.Newf("standin: hold device %d: no such device, or its primary context is not retained", dev)
	}
	return nil
}

// Release lets every held operation finish.
func (l *Lib) Release() { l.release() }

// Held counts the held operations that have finished.
func (l *Lib) Held() uint64 { return l.held() }

// Clear removes every injection.
func (l *Lib) Clear() { l.clear() }

// Calls counts the calls of the exported function fn so far, injected
// failures included.
func (l *Lib) Calls(fn string) uint64 { return l.calls(fn) }

// Used is the bytes of allocations on device dev whose memory is not yet
// freed.
func (l *Lib) Used(dev int) uint64 { return l.used(int32(dev)) }

// LiveKinds are the objects Live counts. "contexts" counts the references
// of primary contexts (CUDA's retains, AscendCL's aclrtSetDevice calls) and
// live explicit contexts (aclrtCreateContext); "tokens" the tokens this
// instance exports to other processes (AscendCL), each a socket and a
// thread until its handle is freed.
var LiveKinds = []string{"reservations", "allocations", "mappings", "streams", "events", "hostallocs", "contexts", "tokens"}

// Live counts live objects of a kind in LiveKinds (-1 for another word).
func (l *Lib) Live(what string) int64 { return l.live(what) }

// Access is device dev's access at addr as the emulated hardware keeps it
// (0 none, 1 read, 3 read-write), or -1 where nothing is mapped: what a
// test checks against the driver's record after a rollback.
func (l *Lib) Access(addr uint64, dev int) int { return int(l.access(addr, int32(dev))) }

// Leaks lists the kinds with live objects, as "mappings: 2", for a test to
// require empty after its cleanup (contexts included: after the driver's
// Close).
func (l *Lib) Leaks() []string {
	var out []string
	for _, k := range LiveKinds {
		if n := l.Live(k); n != 0 {
			out = append(out, fmt.Sprintf("%s: %d", k, n))
		}
	}
	return out
}

// RequireEmpty fails tb unless the stand-in holds nothing (Leaks is
// empty): what a test checks after the driver over it was closed.
func (l *Lib) RequireEmpty(tb testing.TB) {
	tb.Helper()
	if leaks := l.Leaks(); len(leaks) > 0 {
		tb.Errorf("%s still holds %s", l, strings.Join(leaks, ", "))
	}
}

// String names the instance in test output.
func (l *Lib) String() string { return "stand-in " + l.path }
