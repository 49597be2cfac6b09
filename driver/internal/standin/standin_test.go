//go:build linux

package standin

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// CUDA result codes the tests expect (shared/CUDA_ABI.md).
const (
	cuSuccess            = 0
	cuInvalidValue       = 1
	cuOutOfMemory        = 2
	cuNotInitialized     = 3
	cuStubLibrary        = 34
	cuNoDevice           = 100
	cuInvalidDevice      = 101
	cuInvalidContext     = 201
	cuPeerUnsupported    = 217
	cuInvalidHandle      = 400
	cuNotReady           = 600
	cuIllegalAddress     = 700
	cuPeerAlreadyEnabled = 704
	cuNotSupported       = 801
	cuUnknown            = 999
)

const (
	mib          = 1 << 20
	kib          = 1 << 10
	accessNone   = 0
	accessRead   = 1
	accessRW     = 3
	handlePOSIX  = 1
	locDevice    = 1
	allocPinned  = 1
	granMinimum  = 0
	granRecommen = 1
)

// Go mirrors of CUDA's structs, laid out as shared/CUDA_ABI.md says.
type memLocation struct{ typ, id int32 }

type allocProp struct {
	typ, requestedHandleTypes int32
	location                  memLocation
	win32                     uintptr
	allocFlags                [8]byte
}

type accessDesc struct {
	location memLocation
	flags    int32
}

// cuAPI is the CUDA driver API as the stand-in exports it; a field whose
// symbol is missing stays nil.
type cuAPI struct {
	Init                func(flags uint32) int32                                        `sym:"cuInit"`
	DriverGetVersion    func(v *int32) int32                                            `sym:"cuDriverGetVersion"`
	DeviceGetCount      func(n *int32) int32                                            `sym:"cuDeviceGetCount"`
	DeviceGet           func(d *int32, ordinal int32) int32                             `sym:"cuDeviceGet"`
	DeviceGetName       func(name *byte, n int32, dev int32) int32                      `sym:"cuDeviceGetName"`
	DeviceTotalMem      func(b *uint64, dev int32) int32                                `sym:"cuDeviceTotalMem_v2"`
	DeviceGetAttribute  func(v *int32, attr int32, dev int32) int32                     `sym:"cuDeviceGetAttribute"`
	GetErrorName        func(r int32, name *unsafe.Pointer) int32                       `sym:"cuGetErrorName"`
	PrimaryCtxRetain    func(ctx *uintptr, dev int32) int32                             `sym:"cuDevicePrimaryCtxRetain"`
	PrimaryCtxRelease   func(dev int32) int32                                           `sym:"cuDevicePrimaryCtxRelease_v2"`
	CtxSetCurrent       func(ctx uintptr) int32                                         `sym:"cuCtxSetCurrent"`
	CtxGetCurrent       func(ctx *uintptr) int32                                        `sym:"cuCtxGetCurrent"`
	MemGetGranularity   func(g *uint64, p *allocProp, option int32) int32               `sym:"cuMemGetAllocationGranularity"`
	MemAddressReserve   func(p *uint64, size, align, hint, flags uint64) int32          `sym:"cuMemAddressReserve"`
	MemAddressFree      func(p, size uint64) int32                                      `sym:"cuMemAddressFree"`
	MemCreate           func(h *uint64, size uint64, p *allocProp, fl uint64) int32     `sym:"cuMemCreate"`
	MemRelease          func(h uint64) int32                                            `sym:"cuMemRelease"`
	MemMap              func(p, size, off, h, flags uint64) int32                       `sym:"cuMemMap"`
	MemUnmap            func(p, size uint64) int32                                      `sym:"cuMemUnmap"`
	MemSetAccess        func(p, size uint64, d *accessDesc, n uint64) int32             `sym:"cuMemSetAccess"`
	MemGetAccess        func(fl *uint64, loc *memLocation, p uint64) int32              `sym:"cuMemGetAccess"`
	MemExport           func(fd *int32, h uint64, typ int32, flags uint64) int32        `sym:"cuMemExportToShareableHandle"`
	MemImport           func(h *uint64, fd uintptr, typ int32) int32                    `sym:"cuMemImportFromShareableHandle"`
	StreamCreate        func(s *uintptr, flags uint32) int32                            `sym:"cuStreamCreate"`
	StreamDestroy       func(s uintptr) int32                                           `sym:"cuStreamDestroy_v2"`
	StreamSynchronize   func(s uintptr) int32                                           `sym:"cuStreamSynchronize"`
	StreamQuery         func(s uintptr) int32                                           `sym:"cuStreamQuery"`
	CtxSynchronize      func() int32                                                    `sym:"cuCtxSynchronize"`
	EventCreate         func(e *uintptr, flags uint32) int32                            `sym:"cuEventCreate"`
	EventRecord         func(e, s uintptr) int32                                        `sym:"cuEventRecord"`
	EventSynchronize    func(e uintptr) int32                                           `sym:"cuEventSynchronize"`
	EventQuery          func(e uintptr) int32                                           `sym:"cuEventQuery"`
	EventDestroy        func(e uintptr) int32                                           `sym:"cuEventDestroy_v2"`
	LaunchHostFunc      func(s, fn, user uintptr) int32                                 `sym:"cuLaunchHostFunc"`
	MemcpyHtoDAsync     func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32 `sym:"cuMemcpyHtoDAsync_v2"`
	MemcpyDtoHAsync     func(dst unsafe.Pointer, src, n uint64, s uintptr) int32        `sym:"cuMemcpyDtoHAsync_v2"`
	MemcpyDtoDAsync     func(dst, src, n uint64, s uintptr) int32                       `sym:"cuMemcpyDtoDAsync_v2"`
	MemsetD8Async       func(dst uint64, v uint8, n uint64, s uintptr) int32            `sym:"cuMemsetD8Async"`
	MemcpyHtoD          func(dst uint64, src unsafe.Pointer, n uint64) int32            `sym:"cuMemcpyHtoD_v2"`
	MemcpyDtoH          func(dst unsafe.Pointer, src, n uint64) int32                   `sym:"cuMemcpyDtoH_v2"`
	DeviceCanAccessPeer func(can *int32, dev, peer int32) int32                         `sym:"cuDeviceCanAccessPeer"`
	CtxEnablePeerAccess func(peer uintptr, flags uint32) int32                          `sym:"cuCtxEnablePeerAccess"`
	MemHostAlloc        func(p *unsafe.Pointer, size uint64, flags uint32) int32        `sym:"cuMemHostAlloc"`
	MemFreeHost         func(p unsafe.Pointer) int32                                    `sym:"cuMemFreeHost"`
}

// symbols is every cu* symbol the stand-in exports, from cuAPI's tags.
func symbols() []string {
	var out []string
	ty := reflect.TypeFor[cuAPI]()
	for i := range ty.NumField() {
		out = append(out, ty.Field(i).Tag.Get("sym"))
	}
	return out
}

// groupSymbols are the symbols each omit group leaves out.
var groupSymbols = map[string][]string{
	"export":    {"cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"},
	"hostfunc":  {"cuLaunchHostFunc"},
	"events":    {"cuEventCreate", "cuEventRecord", "cuEventSynchronize", "cuEventQuery", "cuEventDestroy_v2"},
	"peer":      {"cuDeviceCanAccessPeer", "cuCtxEnablePeerAccess"},
	"hostalloc": {"cuMemHostAlloc", "cuMemFreeHost"},
	"synccopy":  {"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"},
	"devsync":   {"cuCtxSynchronize"},
	"streams": {"cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamQuery",
		"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8Async", "cuLaunchHostFunc"},
	"vmm": {"cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
		"cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAccess",
		"cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"},
}

func loadCU(l *Lib) *cuAPI {
	var api cuAPI
	bindTagged(l, &api)
	return &api
}

// bindTagged binds each function field of *api to the symbol its sym tag
// names, leaving nil those the library lacks (an omitted group).
func bindTagged(l *Lib, api any) {
	v := reflect.ValueOf(api).Elem()
	for i := range v.NumField() {
		sym, err := purego.Dlsym(l.handle, v.Type().Field(i).Tag.Get("sym"))
		if err != nil {
			continue
		}
		purego.RegisterFunc(v.Field(i).Addr().Interface(), sym)
	}
}

// env is one fresh stand-in instance and the CUDA API over it. Its test
// goroutine stays on one OS thread: CUDA's current context is per thread.
type env struct {
	t    *testing.T
	lib  *Lib
	cu   *cuAPI
	ctx  []uintptr // retained primary context of each device
	gran uint64
}

func open(t *testing.T, cfg Config) *env {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	l := Open(t, CUDA, cfg)
	return &env{t: t, lib: l, cu: loadCU(l)}
}

// start opens an instance, initialises it, retains every device's primary
// context and makes device 0's current.
func start(t *testing.T, cfg Config) *env {
	t.Helper()
	e := open(t, cfg)
	e.ok(e.cu.Init(0))
	var n int32
	e.ok(e.cu.DeviceGetCount(&n))
	e.ctx = make([]uintptr, n)
	for d := range e.ctx {
		e.ok(e.cu.PrimaryCtxRetain(&e.ctx[d], int32(d)))
	}
	e.use(0)
	if !cfg.NoVMM {
		p := prop(0, false)
		e.ok(e.cu.MemGetGranularity(&e.gran, &p, granMinimum))
	}
	return e
}

func (e *env) ok(r int32, what ...any) {
	e.t.Helper()
	require.Equal(e.t, int32(cuSuccess), r, what...)
}

func (e *env) is(want, got int32, what ...any) {
	e.t.Helper()
	require.Equal(e.t, int32(want), got, what...)
}

func (e *env) use(dev int) { e.t.Helper(); e.ok(e.cu.CtxSetCurrent(e.ctx[dev])) }

func prop(dev int, posix bool) allocProp {
	p := allocProp{typ: allocPinned, location: memLocation{typ: locDevice, id: int32(dev)}}
	if posix {
		p.requestedHandleTypes = handlePOSIX
	}
	return p
}

func (e *env) reserve(size uint64) uint64 {
	e.t.Helper()
	var p uint64
	e.ok(e.cu.MemAddressReserve(&p, size, 0, 0, 0))
	return p
}

func (e *env) create(dev int, size uint64, posix bool) uint64 {
	e.t.Helper()
	var h uint64
	p := prop(dev, posix)
	e.ok(e.cu.MemCreate(&h, size, &p, 0))
	return h
}

func (e *env) setAccess(addr, size uint64, dev int, flags int32) int32 {
	d := accessDesc{location: memLocation{typ: locDevice, id: int32(dev)}, flags: flags}
	return e.cu.MemSetAccess(addr, size, &d, 1)
}

func (e *env) access(dev int, addr uint64) uint64 {
	e.t.Helper()
	var f uint64
	loc := memLocation{typ: locDevice, id: int32(dev)}
	e.ok(e.cu.MemGetAccess(&f, &loc, addr))
	return f
}

func (e *env) write(addr uint64, data []byte) int32 {
	return e.cu.MemcpyHtoD(addr, unsafe.Pointer(&data[0]), uint64(len(data)))
}

func (e *env) read(addr, n uint64) ([]byte, int32) {
	buf := make([]byte, n)
	r := e.cu.MemcpyDtoH(unsafe.Pointer(&buf[0]), addr, n)
	return buf, r
}

// hostAlloc is pinned host memory for asynchronous copies: memory the Go
// runtime never moves or frees behind the stream's back.
func (e *env) hostAlloc(n int) (unsafe.Pointer, []byte) {
	e.t.Helper()
	var p unsafe.Pointer
	e.ok(e.cu.MemHostAlloc(&p, uint64(n), 0))
	return p, unsafe.Slice((*byte)(p), n)
}

func (e *env) stream() uintptr {
	e.t.Helper()
	var s uintptr
	e.ok(e.cu.StreamCreate(&s, 1))
	return s
}

// noLeaks requires every live counter at zero but the contexts the test
// holds, and no device memory used.
func (e *env) noLeaks() {
	e.t.Helper()
	require.Empty(e.t, leaksBut(e.lib, "contexts"))
	for d := range e.ctx {
		require.Zero(e.t, e.lib.Used(d), "device %d", d)
	}
}

// leaksBut is l.Leaks() without the kinds named.
func leaksBut(l *Lib, kinds ...string) []string {
	var out []string
	for _, s := range l.Leaks() {
		if !slices.Contains(kinds, s[:strings.IndexByte(s, ':')]) {
			out = append(out, s)
		}
	}
	return out
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// protAt is the protection of the process mapping holding addr, as
// /proc/self/maps shows it ("rw-s": shared, read-write).
func protAt(t *testing.T, addr uint64) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		var lo, hi uint64
		if len(f) < 2 {
			continue
		}
		if _, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return f[1]
		}
	}
	return ""
}

// hostFuncs dispatches the one purego callback every test shares (purego
// has a fixed number of callbacks per process) to the function registered
// under its user-data key.
var hostFuncs struct {
	once sync.Once
	cb   uintptr
	mu   sync.Mutex
	next uintptr
	fns  map[uintptr]func()
}

func hostFunc(fn func()) (cb, key uintptr) {
	hostFuncs.once.Do(func() {
		hostFuncs.fns = map[uintptr]func(){}
		hostFuncs.cb = purego.NewCallback(func(key uintptr) {
			hostFuncs.mu.Lock()
			f := hostFuncs.fns[key]
			delete(hostFuncs.fns, key)
			hostFuncs.mu.Unlock()
			f()
		})
	})
	hostFuncs.mu.Lock()
	defer hostFuncs.mu.Unlock()
	hostFuncs.next++
	hostFuncs.fns[hostFuncs.next] = fn
	return hostFuncs.cb, hostFuncs.next
}

// ---------------------------------------------------------------------------

func TestStructLayouts(t *testing.T) {
	require.Equal(t, uintptr(8), unsafe.Sizeof(memLocation{}))
	require.Equal(t, uintptr(32), unsafe.Sizeof(allocProp{}))
	require.Equal(t, uintptr(8), unsafe.Offsetof(allocProp{}.location))
	require.Equal(t, uintptr(24), unsafe.Offsetof(allocProp{}.allocFlags))
	require.Equal(t, uintptr(12), unsafe.Sizeof(accessDesc{}))
	require.Equal(t, uintptr(8), unsafe.Offsetof(accessDesc{}.flags))
}

func TestBuildIsCachedAndExportsOnlyItsInterface(t *testing.T) {
	needCompiler(t)
	p1, err := Build(CUDA, nil)
	require.NoError(t, err)
	p2, err := Build(CUDA, []string{})
	require.NoError(t, err)
	require.Equal(t, p1, p2)
	require.Equal(t, "libcuda.so.1", filepath.Base(p1))
	require.True(t, strings.HasPrefix(p1, filepath.Join(os.TempDir(), "vmarena-standin")+string(filepath.Separator)))

	h, err := purego.Dlopen(p1, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	for _, s := range append(symbols(), "vmstandin_configure", "vmstandin_fail", "vmstandin_clear",
		"vmstandin_calls", "vmstandin_used", "vmstandin_live", "vmstandin_access",
		"vmstandin_hold", "vmstandin_release", "vmstandin_held") {
		_, err := purego.Dlsym(h, s)
		require.NoError(t, err, s)
	}
	for _, s := range []string{"vdev_init", "vdev_map", "vdev_enter", "vdev_config", "vdev_token_export"} {
		_, err := purego.Dlsym(h, s)
		require.Error(t, err, "%s is internal and must not be exported", s)
	}

	_, err = Build(CUDA, []string{"kernels"})
	require.ErrorContains(t, err, "unknown omit group")
	_, err = Build(Vendor("nope"), nil)
	require.ErrorContains(t, err, "no front-end")
}

// TestCompilesWithoutWarnings builds every variant of both front-ends and
// checks the compiler printed nothing making each: the build cache keeps
// what the compiler printed beside each build (a variant another test
// built is read back, not compiled again). Not with -short.
func TestCompilesWithoutWarnings(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles twenty variants")
	}
	needCompiler(t)
	variants := [][]string{nil, OmitGroups}
	for _, g := range OmitGroups {
		variants = append(variants, []string{g})
	}
	for _, v := range []Vendor{CUDA, ACL} {
		for _, omit := range variants {
			t.Run(string(v)+"/"+strings.Join(append([]string{"omit"}, omit...), "-"), func(t *testing.T) {
				t.Parallel()
				_, out, err := buildOutput(v, omit)
				require.NoError(t, err)
				require.Empty(t, string(out), "compiler output for %s with omit %v", v, omit)
			})
		}
	}
}

// TestCachedOutputIsTheCompilers checks that the output the cache keeps
// beside a build is what the compiler printed: a warning compiled into a
// variant is read back from the cache by the next build of it.
func TestCachedOutputIsTheCompilers(t *testing.T) {
	needCompiler(t)
	t.Setenv("TMPDIR", t.TempDir())
	cc, err := compilerCommand()
	require.NoError(t, err)
	// The stand-in compiles clean, so $CC is wrapped to print a line to
	// stderr before compiling, as a warning would.
	wrapper := filepath.Join(t.TempDir(), "cc")
	script := "#!/bin/sh\necho 'warning: from the wrapper' >&2\nexec " + strings.Join(cc, " ") + " \"$@\"\n"
	require.NoError(t, os.WriteFile(wrapper, []byte(script), 0o755))
	t.Setenv("CC", wrapper)
	p1, out1, err := buildOutput(CUDA, []string{OmitGroups[0]})
	require.NoError(t, err)
	require.Contains(t, string(out1), "warning: from the wrapper")
	b, err := os.ReadFile(filepath.Join(filepath.Dir(p1), outputName))
	require.NoError(t, err)
	require.Equal(t, out1, b)
	// Another process reads it back: forget this one's record.
	built.Lock()
	built.keys = nil
	built.Unlock()
	p2, out2, err := buildOutput(CUDA, []string{OmitGroups[0]})
	require.NoError(t, err)
	require.Equal(t, p1, p2)
	require.Equal(t, out1, out2)
	// A build without its output beside it is made again.
	require.NoError(t, os.Remove(filepath.Join(filepath.Dir(p1), outputName)))
	built.Lock()
	built.keys = nil
	built.Unlock()
	_, out3, err := buildOutput(CUDA, []string{OmitGroups[0]})
	require.NoError(t, err)
	require.Equal(t, out1, out3)
}

func TestOmitGroupRemovesExactlyItsSymbols(t *testing.T) {
	for _, g := range OmitGroups {
		t.Run(g, func(t *testing.T) {
			l := Open(t, CUDA, Config{Omit: []string{g}})
			for _, s := range symbols() {
				_, err := purego.Dlsym(l.handle, s)
				if contains(groupSymbols[g], s) {
					require.Error(t, err, "%s must be left out with %s", s, g)
				} else {
					require.NoError(t, err, "%s must stay with %s", s, g)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestConfigure(t *testing.T) {
	require.Equal(t, "", Config{}.Spec())
	require.Equal(t, "devices=3,capacity=4194304,mingran=65536,recgran=1048576,novmm=1,noposix=1,nopools=1,nopeer=1,stub=1,nodevice=1",
		Config{Devices: 3, Capacity: 4 * mib, MinGranularity: 64 * kib, RecommendedGranularity: mib,
			NoVMM: true, NoPOSIXFD: true, NoPools: true, NoPeer: true, Stub: true, NoDevice: true}.Spec())

	e := open(t, Config{})
	for _, bad := range []string{
		"devices=0", "devices=33", "devices=-1", "devices=2x", "devices", "=2", "bogus=1",
		"mingran=3000", "mingran=1024", "mingran=0", "recgran=3145728", "recgran=0",
		"capacity=0", "capacity=3000000", "novmm=2", "stub=yes", "capacity=99999999999999999999",
		"mingran=65536,recgran=98304",
	} {
		require.Equal(t, int32(-1), e.lib.configure(bad), bad)
	}
	for _, good := range []string{"", "devices=32", "mingran=65536", "mingran=4194304", "capacity=4194304,mingran=65536,recgran=2097152,nopeer=1"} {
		require.Equal(t, int32(0), e.lib.configure(good), good)
	}
	require.Equal(t, int32(0), e.lib.configure("devices=3,capacity=4194304,mingran=65536"))
	e.ok(e.cu.Init(0))
	require.Equal(t, int32(-1), e.lib.configure(""), "configuration is fixed once initialised")
	var n int32
	var total uint64
	e.ok(e.cu.DeviceGetCount(&n))
	e.ok(e.cu.DeviceTotalMem(&total, 2))
	require.Equal(t, int32(3), n)
	require.Equal(t, uint64(4*mib), total)

	_, err := OpenPath(e.lib.Path(), Config{MinGranularity: 3000})
	require.ErrorContains(t, err, "refused")
}

func TestOpenWithoutCompiler(t *testing.T) {
	t.Setenv("CC", "/nonexistent/vmarena-cc")
	_, err := Compiler()
	require.ErrorContains(t, err, "vmarena-cc")

	run := func() *recordTB {
		r := &recordTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Open(r, CUDA, Config{})
		}()
		<-done
		return r
	}
	t.Setenv(requireEnv, "")
	r := run()
	require.Contains(t, r.skipped, "vmarena-cc")
	require.Empty(t, r.fatal)

	t.Setenv(requireEnv, "1")
	r = run()
	require.Contains(t, r.fatal, requireEnv)
	require.Empty(t, r.skipped)
}

// recordTB records what Open does instead of ending the real test.
type recordTB struct {
	testing.TB
	skipped, fatal string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Skipf(f string, a ...any) {
	r.skipped = fmt.Sprintf(f, a...)
	runtime.Goexit()
}
func (r *recordTB) Fatalf(f string, a ...any) {
	r.fatal = fmt.Sprintf(f, a...)
	runtime.Goexit()
}

func TestInitDevicesAndContexts(t *testing.T) {
	e := open(t, Config{})
	var v, n int32
	e.ok(e.cu.DriverGetVersion(&v))
	require.Equal(t, int32(12060), v)
	e.is(cuNotInitialized, e.cu.DeviceGetCount(&n))
	e.is(cuInvalidValue, e.cu.Init(1))
	e.ok(e.cu.Init(0))
	e.ok(e.cu.Init(0))
	e.ok(e.cu.DeviceGetCount(&n))
	require.Equal(t, int32(2), n)

	var d int32
	e.ok(e.cu.DeviceGet(&d, 1))
	require.Equal(t, int32(1), d)
	e.is(cuInvalidDevice, e.cu.DeviceGet(&d, 2))
	name := make([]byte, 64)
	e.ok(e.cu.DeviceGetName(&name[0], int32(len(name)), 1))
	require.Equal(t, "vmarena stand-in GPU 1", string(name[:bytes.IndexByte(name, 0)]))
	var total uint64
	e.ok(e.cu.DeviceTotalMem(&total, 0))
	require.Equal(t, uint64(64*mib), total)
	for attr, want := range map[int32]int32{102: 1, 103: 1, 115: 1, 41: 1} {
		var got int32
		e.ok(e.cu.DeviceGetAttribute(&got, attr, 0), attr)
		require.Equal(t, want, got, attr)
	}
	var sms int32
	e.ok(e.cu.DeviceGetAttribute(&sms, 16, 0))
	require.Positive(t, sms)
	e.is(cuInvalidValue, e.cu.DeviceGetAttribute(&sms, 12345, 0))
	e.is(cuInvalidDevice, e.cu.DeviceGetAttribute(&sms, 16, 7))

	var s unsafe.Pointer
	e.ok(e.cu.GetErrorName(cuIllegalAddress, &s))
	require.Equal(t, "CUDA_ERROR_ILLEGAL_ADDRESS", unix.BytePtrToString((*byte)(s)))
	e.is(cuInvalidValue, e.cu.GetErrorName(4242, &s))
	require.Nil(t, s)

	// No current context: every call that needs one is refused.
	var p uint64
	e.is(cuInvalidContext, e.cu.MemAddressReserve(&p, 2*mib, 0, 0, 0))
	var stream uintptr
	e.is(cuInvalidContext, e.cu.StreamCreate(&stream, 0))
	var ctx, cur uintptr
	e.ok(e.cu.PrimaryCtxRetain(&ctx, 1))
	e.ok(e.cu.CtxSetCurrent(ctx))
	e.ok(e.cu.CtxGetCurrent(&cur))
	require.Equal(t, ctx, cur)
	e.ok(e.cu.MemAddressReserve(&p, 2*mib, 0, 0, 0))
	e.ok(e.cu.MemAddressFree(p, 2*mib))
	require.Equal(t, int64(1), e.lib.Live("contexts"), "one retained primary context")
	var again uintptr
	e.ok(e.cu.PrimaryCtxRetain(&again, 1))
	require.Equal(t, ctx, again, "a primary context is one per device")
	require.Equal(t, int64(2), e.lib.Live("contexts"), "references count")
	e.ok(e.cu.PrimaryCtxRelease(1))
	// Released to zero references, the context is unusable.
	e.ok(e.cu.PrimaryCtxRelease(1))
	require.Zero(t, e.lib.Live("contexts"))
	e.is(cuInvalidContext, e.cu.MemAddressReserve(&p, 2*mib, 0, 0, 0))
	e.is(cuInvalidContext, e.cu.PrimaryCtxRelease(1))
	e.is(cuInvalidContext, e.cu.CtxSetCurrent(ctx))
	e.is(cuInvalidContext, e.cu.CtxSetCurrent(0xdead0))
	e.ok(e.cu.CtxSetCurrent(0))

	nd := open(t, Config{NoDevice: true})
	nd.is(cuNoDevice, nd.cu.Init(0))
	nd.is(cuNotInitialized, nd.cu.DeviceGetCount(&n))

	for _, c := range []struct {
		cfg  Config
		want [3]int32 // attributes 102, 103, 115
	}{
		{Config{NoVMM: true}, [3]int32{0, 0, 1}},
		{Config{NoPOSIXFD: true}, [3]int32{1, 0, 1}},
		{Config{NoPools: true}, [3]int32{1, 1, 0}},
	} {
		x := start(t, c.cfg)
		for i, attr := range []int32{102, 103, 115} {
			var got int32
			x.ok(x.cu.DeviceGetAttribute(&got, attr, 0))
			require.Equal(t, c.want[i], got, "%+v attribute %d", c.cfg, attr)
		}
	}
}

func TestNoVMM(t *testing.T) {
	e := start(t, Config{NoVMM: true})
	var p, h uint64
	pr := prop(0, false)
	e.is(cuNotSupported, e.cu.MemGetGranularity(&p, &pr, granMinimum))
	e.is(cuNotSupported, e.cu.MemAddressReserve(&p, 2*mib, 0, 0, 0))
	e.is(cuNotSupported, e.cu.MemCreate(&h, 2*mib, &pr, 0))
	e.noLeaks()
}

func TestOutOfMemoryChangesNothing(t *testing.T) {
	e := start(t, Config{Capacity: 4 * mib, MinGranularity: 64 * kib})
	a := e.create(0, 3*mib, false)
	var h uint64
	p := prop(0, false)
	e.is(cuOutOfMemory, e.cu.MemCreate(&h, 2*mib, &p, 0))
	require.Equal(t, uint64(3*mib), e.lib.Used(0))
	require.Equal(t, int64(1), e.lib.Live("allocations"))
	sp := prop(0, true)
	e.is(cuOutOfMemory, e.cu.MemCreate(&h, 2*mib, &sp, 0), "a shareable allocation counts against the same capacity")
	b := e.create(0, mib, false) // exactly full
	e.is(cuOutOfMemory, e.cu.MemCreate(&h, 64*kib, &p, 0))
	c := e.create(1, 4*mib, false) // device 1 has its own capacity
	require.Equal(t, uint64(4*mib), e.lib.Used(0))
	require.Equal(t, uint64(4*mib), e.lib.Used(1))
	e.ok(e.cu.MemRelease(a))
	d := e.create(0, 3*mib, false) // the freed memory is there again
	for _, x := range []uint64{b, c, d} {
		e.ok(e.cu.MemRelease(x))
	}
	e.noLeaks()
}

func TestGranularityIsEnforced(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib, RecommendedGranularity: mib})
	var g uint64
	p := prop(0, false)
	e.ok(e.cu.MemGetGranularity(&g, &p, granMinimum))
	require.Equal(t, uint64(64*kib), g)
	e.ok(e.cu.MemGetGranularity(&g, &p, granRecommen))
	require.Equal(t, uint64(mib), g)
	e.is(cuInvalidValue, e.cu.MemGetGranularity(&g, &p, 2))
	bad := p
	bad.typ = 0
	e.is(cuInvalidValue, e.cu.MemGetGranularity(&g, &bad, granMinimum))
	bad = p
	bad.location.typ = 2
	e.is(cuInvalidValue, e.cu.MemGetGranularity(&g, &bad, granMinimum))
	bad = p
	bad.location.id = 9
	e.is(cuInvalidDevice, e.cu.MemGetGranularity(&g, &bad, granMinimum))

	var h, r uint64
	e.is(cuInvalidValue, e.cu.MemCreate(&h, 64*kib+4*kib, &p, 0))
	e.is(cuInvalidValue, e.cu.MemCreate(&h, 0, &p, 0))
	e.is(cuInvalidValue, e.cu.MemCreate(&h, 64*kib, &p, 1), "flags must be 0")
	e.is(cuInvalidValue, e.cu.MemAddressReserve(&r, 100*kib, 0, 0, 0))
	e.is(cuInvalidValue, e.cu.MemAddressReserve(&r, 256*kib, 3*64*kib, 0, 0))
	e.is(cuInvalidValue, e.cu.MemAddressReserve(&r, 256*kib, 0, 0, 1))

	// A reservation is aligned as asked, placed at a free aligned hint, and
	// elsewhere when the hint is taken.
	e.ok(e.cu.MemAddressReserve(&r, 256*kib, 4*mib, 0, 0))
	require.Zero(t, r%(4*mib))
	require.Equal(t, "---p", protAt(t, r))
	var r2 uint64
	e.ok(e.cu.MemAddressReserve(&r2, 256*kib, 0, r, 0))
	require.NotEqual(t, r, r2, "a taken hint is placed elsewhere")
	honoured := false
	for range 5 { // the Go runtime may take a just-freed range first: retry
		var probe, x uint64
		e.ok(e.cu.MemAddressReserve(&probe, 8*mib, 0, 0, 0))
		e.ok(e.cu.MemAddressFree(probe, 8*mib))
		e.ok(e.cu.MemAddressReserve(&x, 256*kib, 0, probe+2*mib, 0))
		e.ok(e.cu.MemAddressFree(x, 256*kib))
		if honoured = x == probe+2*mib; honoured {
			break
		}
	}
	require.True(t, honoured, "a free aligned hint is honoured")

	h = e.create(0, 128*kib, false)
	e.is(cuInvalidValue, e.cu.MemMap(r+4*kib, 64*kib, 0, h, 0), "misaligned address")
	e.is(cuInvalidValue, e.cu.MemMap(r, 32*kib, 0, h, 0), "size below the granularity")
	e.is(cuInvalidValue, e.cu.MemMap(r, 192*kib, 0, h, 0), "larger than the allocation")
	e.is(cuInvalidValue, e.cu.MemMap(r, 64*kib, 64*kib, h, 0), "offset must be 0")
	e.is(cuInvalidValue, e.cu.MemMap(r, 64*kib, 0, h, 1), "flags must be 0")
	e.is(cuInvalidValue, e.cu.MemMap(r+192*kib, 128*kib, 0, h, 0), "past the reservation's end")
	e.is(cuInvalidValue, e.cu.MemMap(r-64*kib, 128*kib, 0, h, 0), "before the reservation")
	e.is(cuInvalidValue, e.cu.MemMap(r, 64*kib, 0, h+12345, 0), "unknown handle")
	require.Zero(t, e.lib.Live("mappings"))
	e.ok(e.cu.MemMap(r, 64*kib, 0, h, 0), "the first granule of a larger allocation")
	e.is(cuInvalidValue, e.setAccess(r+4*kib, 64*kib, 0, accessRW), "misaligned access")
	e.is(cuInvalidValue, e.setAccess(r, 32*kib, 0, accessRW), "access below the granularity")
	e.ok(e.cu.MemUnmap(r, 64*kib))
	e.ok(e.cu.MemRelease(h))
	e.ok(e.cu.MemAddressFree(r, 256*kib))
	e.ok(e.cu.MemAddressFree(r2, 256*kib))
	e.noLeaks()
}

func TestMapNeverOverwritesAndUnmapTakesWholeMappings(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(4 * g)
	a := e.create(0, 2*g, false)
	b := e.create(0, 2*g, false)
	e.ok(e.cu.MemMap(r, 2*g, 0, a, 0))
	require.Equal(t, "---s", protAt(t, r), "mapped, inaccessible")
	e.is(cuInvalidValue, e.cu.MemMap(r+g, 2*g, 0, b, 0), "over a mapping")
	require.Equal(t, int64(1), e.lib.Live("mappings"))
	e.ok(e.cu.MemMap(r+2*g, 2*g, 0, b, 0))

	e.is(cuInvalidValue, e.cu.MemUnmap(r, g), "part of a mapping")
	e.is(cuInvalidValue, e.cu.MemUnmap(r+g, 2*g), "parts of two mappings")
	e.is(cuInvalidValue, e.cu.MemUnmap(r+g, g), "from inside a mapping")
	e.is(cuInvalidValue, e.cu.MemAddressFree(r, 4*g), "a reservation with mappings")
	e.is(cuInvalidValue, e.cu.MemAddressFree(r, 2*g), "not the whole reservation")
	require.Equal(t, int64(2), e.lib.Live("mappings"))
	e.ok(e.cu.MemUnmap(r, 4*g), "two whole mappings side by side")
	require.Equal(t, "---p", protAt(t, r), "reserved again")
	e.is(cuInvalidValue, e.cu.MemUnmap(r, 2*g), "nothing mapped")
	e.ok(e.cu.MemRelease(a))
	e.ok(e.cu.MemRelease(b))
	e.ok(e.cu.MemAddressFree(r, 4*g))
	e.is(cuInvalidValue, e.cu.MemAddressFree(r, 4*g), "freed already")
	e.noLeaks()
}

func TestReleaseIsRefcounted(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(4 * g)
	h := e.create(0, 2*g, false)
	// The same memory mapped twice: aliases.
	e.ok(e.cu.MemMap(r, 2*g, 0, h, 0))
	e.ok(e.cu.MemMap(r+2*g, 2*g, 0, h, 0))
	e.ok(e.setAccess(r, 4*g, 0, accessRW))
	data := pattern(int(2*g), 3)
	e.ok(e.write(r, data))
	got, res := e.read(r+2*g, 2*g)
	e.ok(res)
	require.Equal(t, data, got, "a write through one alias is read through the other")

	e.ok(e.cu.MemRelease(h))
	e.is(cuInvalidValue, e.cu.MemRelease(h), "released twice")
	e.is(cuInvalidValue, e.cu.MemRelease(0x1234), "never a handle")
	require.Equal(t, uint64(2*g), e.lib.Used(0), "still mapped: the memory stays")
	require.Equal(t, int64(1), e.lib.Live("allocations"))
	got, res = e.read(r, 2*g)
	e.ok(res)
	require.Equal(t, data, got)
	r2 := e.reserve(2 * g)
	e.is(cuInvalidValue, e.cu.MemMap(r2, 2*g, 0, h, 0), "a released handle maps no more")

	e.ok(e.cu.MemUnmap(r, 2*g))
	require.Equal(t, uint64(2*g), e.lib.Used(0), "one mapping left")
	e.ok(e.cu.MemUnmap(r+2*g, 2*g))
	require.Zero(t, e.lib.Used(0), "released and unmapped: gone")
	require.Zero(t, e.lib.Live("allocations"))

	// Memory that comes back is zeroed: the heap range was punched.
	h = e.create(0, 2*g, false)
	e.ok(e.cu.MemMap(r, 2*g, 0, h, 0))
	e.ok(e.setAccess(r, 2*g, 0, accessRead))
	got, res = e.read(r, 2*g)
	e.ok(res)
	require.Equal(t, make([]byte, 2*g), got)
	e.ok(e.cu.MemUnmap(r, 2*g))
	e.ok(e.cu.MemRelease(h))
	e.ok(e.cu.MemAddressFree(r, 4*g))
	e.ok(e.cu.MemAddressFree(r2, 2*g))
	e.noLeaks()
}

// TestSetAccessPerDevicePerMapping: cuMemSetAccess keeps each device's
// access per granule in the books and the page tables, over runs of whole
// adjacent mappings (here one granule each, so the grants are fine-grained).
func TestSetAccessPerDevicePerMapping(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(8 * g)
	var as []uint64
	for i := range 4 {
		as = append(as, e.create(0, g, false))
		e.ok(e.cu.MemMap(r+uint64(i)*g, g, 0, as[i], 0))
	}

	// Granules 1 and 2 only: two whole mappings.
	e.ok(e.setAccess(r+g, 2*g, 0, accessRW))
	require.Equal(t, uint64(accessNone), e.access(0, r))
	require.Equal(t, uint64(accessRW), e.access(0, r+g))
	require.Equal(t, uint64(accessRW), e.access(0, r+3*g-1))
	require.Equal(t, uint64(accessNone), e.access(0, r+3*g))
	require.Equal(t, uint64(accessNone), e.access(1, r+g), "only the device named")
	require.Equal(t, accessRW, e.lib.Access(r+g, 0), "the test interface sees the books")
	require.Equal(t, accessNone, e.lib.Access(r, 0))
	require.Equal(t, -1, e.lib.Access(r+4*g, 0), "nothing mapped")
	require.Equal(t, -1, e.lib.Access(r+g, 7), "no such device")
	require.Equal(t, "---s", protAt(t, r))
	require.Equal(t, "rw-s", protAt(t, r+g))
	e.ok(e.write(r+g, pattern(int(2*g), 1)))
	e.is(cuIllegalAddress, e.write(r, pattern(int(g), 1)), "no access")
	e.is(cuIllegalAddress, e.write(r+2*g, pattern(int(2*g), 1)), "runs past the granted granules")
	_, res := e.read(r+g-1, 2)
	e.is(cuIllegalAddress, res, "starts one byte early")
	// A synchronous violation is reported, not sticky.
	e.ok(e.write(r+g, pattern(16, 2)))

	// Over a hole: refused, nothing changed.
	b := e.create(0, 2*g, false)
	e.ok(e.cu.MemMap(r+5*g, 2*g, 0, b, 0))
	e.is(cuInvalidValue, e.setAccess(r+3*g, 4*g, 0, accessRW), "granule 4 is not mapped")
	require.Equal(t, uint64(accessNone), e.access(0, r+3*g))
	require.Equal(t, uint64(accessNone), e.access(0, r+5*g))
	require.Equal(t, "---s", protAt(t, r+3*g))
	var f uint64
	loc := memLocation{typ: locDevice, id: 0}
	e.is(cuInvalidValue, e.cu.MemGetAccess(&f, &loc, r+4*g), "nothing mapped there")

	// Across several whole mappings without a gap: allowed.
	c := e.create(0, g, false)
	e.ok(e.cu.MemMap(r+4*g, g, 0, c, 0))
	e.ok(e.setAccess(r+3*g, 4*g, 0, accessRW))
	require.Equal(t, uint64(accessRW), e.access(0, r+4*g))
	require.Equal(t, uint64(accessRW), e.access(0, r+6*g))

	// Read-only for device 1, and device 1 reaches device 0's memory once
	// granted, without peer access (CUDA's VMM rule).
	e.ok(e.setAccess(r, 4*g, 1, accessRead))
	e.use(1)
	got, res := e.read(r+g, 16)
	e.ok(res)
	require.Equal(t, pattern(16, 2), got)
	e.is(cuIllegalAddress, e.write(r+g, pattern(16, 3)), "read-only")
	e.use(0)
	// Device 0 keeps read-write where device 1 reads; taking device 0's
	// access leaves the pages readable for device 1.
	e.ok(e.setAccess(r, 4*g, 0, accessNone))
	require.Equal(t, "r--s", protAt(t, r+g))
	e.is(cuIllegalAddress, e.write(r+g, pattern(16, 3)))

	d := accessDesc{location: memLocation{typ: locDevice, id: 5}, flags: accessRW}
	e.is(cuInvalidDevice, e.cu.MemSetAccess(r, g, &d, 1))
	d = accessDesc{location: memLocation{typ: locDevice, id: 0}, flags: 2}
	e.is(cuInvalidValue, e.cu.MemSetAccess(r, g, &d, 1), "write-only is no access value")
	d = accessDesc{location: memLocation{typ: 2, id: 0}, flags: accessRW}
	e.is(cuInvalidValue, e.cu.MemSetAccess(r, g, &d, 1), "a host location")
	e.is(cuInvalidValue, e.cu.MemSetAccess(r, g, &d, 0), "no descriptor")

	// Several descriptors at once, at CUDA's 12-byte stride.
	two := []accessDesc{{memLocation{locDevice, 0}, accessRead}, {memLocation{locDevice, 1}, accessRW}}
	e.ok(e.cu.MemSetAccess(r, 4*g, &two[0], 2))
	require.Equal(t, uint64(accessRead), e.access(0, r))
	require.Equal(t, uint64(accessRW), e.access(1, r))

	e.ok(e.cu.MemUnmap(r, 4*g))
	e.ok(e.cu.MemUnmap(r+4*g, 3*g))
	for _, h := range append(as, b, c) {
		e.ok(e.cu.MemRelease(h))
	}
	e.ok(e.cu.MemAddressFree(r, 8*g))
	e.noLeaks()
}

// TestAsyncViolationIsSticky: an asynchronous copy without access fails
// at synchronize with 700 and poisons its context, as on a GPU; releasing
// the primary context to zero references destroys it and its streams, and
// a new retain starts clean.
func TestAsyncViolationIsSticky(t *testing.T) {
	for _, op := range []string{"htod", "dtoh", "dtod", "memset"} {
		t.Run(op, func(t *testing.T) {
			e := start(t, Config{MinGranularity: 64 * kib})
			g := e.gran
			r := e.reserve(2 * g)
			h, h2 := e.create(0, g, false), e.create(0, g, false)
			e.ok(e.cu.MemMap(r, g, 0, h, 0))
			e.ok(e.cu.MemMap(r+g, g, 0, h2, 0))
			e.ok(e.setAccess(r, g, 0, accessRW)) // the second mapping stays inaccessible
			s := e.stream()
			p, buf := e.hostAlloc(int(g))
			copy(buf, pattern(int(g), 9))
			var res int32
			switch op {
			case "htod":
				res = e.cu.MemcpyHtoDAsync(r+g, p, g, s)
			case "dtoh":
				res = e.cu.MemcpyDtoHAsync(p, r+g, g, s)
			case "dtod":
				res = e.cu.MemcpyDtoDAsync(r, r+g, g, s)
			case "memset":
				res = e.cu.MemsetD8Async(r+1, 7, g, s) // runs one byte into the second granule
			}
			e.ok(res, "the enqueue succeeds; the copy fails when it runs")
			e.is(cuIllegalAddress, e.cu.StreamSynchronize(s))
			if op == "dtoh" {
				require.Equal(t, pattern(int(g), 9), buf, "nothing moved")
			}
			// Every later call in the context fails.
			var x uint64
			var s2 uintptr
			e.is(cuIllegalAddress, e.cu.MemAddressReserve(&x, g, 0, 0, 0))
			e.is(cuIllegalAddress, e.cu.StreamCreate(&s2, 0))
			e.is(cuIllegalAddress, e.cu.StreamDestroy(s))
			e.is(cuIllegalAddress, e.write(r, pattern(16, 1)))
			// Another device's context is not affected.
			e.use(1)
			e.ok(e.cu.MemAddressReserve(&x, g, 0, 0, 0))
			e.ok(e.cu.MemAddressFree(x, g))
			e.use(0)

			require.Equal(t, int64(1), e.lib.Live("streams"))
			e.ok(e.cu.PrimaryCtxRelease(0))
			require.Zero(t, e.lib.Live("streams"), "the context's streams went with it")
			e.ok(e.cu.PrimaryCtxRetain(&e.ctx[0], 0))
			e.use(0)
			e.is(cuInvalidHandle, e.cu.StreamSynchronize(s), "a stream of the destroyed context")
			e.ok(e.write(r, pattern(16, 1)), "the new context is clean")
			e.ok(e.cu.MemFreeHost(p))
			e.ok(e.cu.MemUnmap(r, 2*g))
			e.ok(e.cu.MemRelease(h))
			e.ok(e.cu.MemRelease(h2))
			e.ok(e.cu.MemAddressFree(r, 2*g))
			e.noLeaks()
		})
	}
}

// TestSetAccessTakesWholeMappings: cuMemSetAccess refuses, with
// CUDA_ERROR_INVALID_VALUE and changing nothing, a range that starts or
// ends inside a mapping, as an H100 (CUDA 13.0) does ("the range must be
// a fully mapped address range containing all allocations created by
// cuMemMap / cuMemCreate"); it takes one whole mapping and a run of
// adjacent whole ones.
func TestSetAccessTakesWholeMappings(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(6 * g)
	a, b := e.create(0, 4*g, false), e.create(0, 2*g, false)
	e.ok(e.cu.MemMap(r, 4*g, 0, a, 0))
	e.ok(e.cu.MemMap(r+4*g, 2*g, 0, b, 0))
	unchanged := func() {
		t.Helper()
		for off := uint64(0); off < 6*g; off += g {
			require.Equal(t, uint64(accessNone), e.access(0, r+off))
			require.Equal(t, "---s", protAt(t, r+off))
		}
	}
	for _, c := range []struct {
		off, size uint64
		why       string
	}{
		{g, 2 * g, "the middle of a mapping"},
		{0, 2 * g, "ends inside the mapping"},
		{g, 3 * g, "starts inside the mapping"},
		{0, 5 * g, "a whole mapping and a piece of the next"},
		{2 * g, 4 * g, "a piece of one and the whole next"},
	} {
		e.is(cuInvalidValue, e.setAccess(r+c.off, c.size, 0, accessRW), c.why)
		unchanged()
	}
	e.ok(e.setAccess(r+4*g, 2*g, 0, accessRead), "one whole mapping")
	require.Equal(t, uint64(accessRead), e.access(0, r+5*g))
	e.ok(e.setAccess(r, 6*g, 0, accessRW), "two adjacent whole mappings in one call")
	require.Equal(t, uint64(accessRW), e.access(0, r))
	require.Equal(t, uint64(accessRW), e.access(0, r+5*g))
	require.Equal(t, "rw-s", protAt(t, r+3*g))

	e.ok(e.cu.MemUnmap(r, 6*g))
	e.ok(e.cu.MemRelease(a))
	e.ok(e.cu.MemRelease(b))
	e.ok(e.cu.MemAddressFree(r, 6*g))
	e.noLeaks()
}

func TestStreamsRunInOrderOnWorkerThreads(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(2 * g)
	h := e.create(0, 2*g, false)
	e.ok(e.cu.MemMap(r, 2*g, 0, h, 0))
	e.ok(e.setAccess(r, 2*g, 0, accessRW))
	s := e.stream()
	in, inBuf := e.hostAlloc(int(g))
	out, outBuf := e.hostAlloc(int(g))
	copy(inBuf, pattern(int(g), 5))

	type sight struct {
		tid  int
		head []byte
	}
	seen := make(chan sight, 1)
	cb, key := hostFunc(func() { seen <- sight{syscall.Gettid(), bytes.Clone(outBuf[:4])} })
	e.ok(e.cu.MemcpyHtoDAsync(r, in, g, s))
	e.ok(e.cu.MemsetD8Async(r+16, 0xee, 16, s))
	e.ok(e.cu.MemcpyDtoDAsync(r+g, r, g, s))
	e.ok(e.cu.MemcpyDtoHAsync(out, r+g, g, s))
	e.ok(e.cu.LaunchHostFunc(s, cb, key))
	e.ok(e.cu.StreamSynchronize(s))

	want := pattern(int(g), 5)
	copy(want[16:32], bytes.Repeat([]byte{0xee}, 16))
	require.Equal(t, want, outBuf)
	got := <-seen
	require.Equal(t, want[:4], got.head, "the host function ran after the copies before it")
	require.NotEqual(t, syscall.Gettid(), got.tid, "host functions run on the stream's own thread")

	// The NULL stream is the context's default stream.
	e.ok(e.cu.MemsetD8Async(r, 1, 8, 0))
	e.ok(e.cu.StreamSynchronize(0))
	require.Equal(t, int64(1), e.lib.Live("streams"), "s only: the default stream is the context's")

	e.ok(e.cu.StreamDestroy(s))
	e.is(cuInvalidHandle, e.cu.StreamSynchronize(s), "destroyed")
	e.is(cuInvalidHandle, e.cu.StreamQuery(0xdead0), "never a stream")
	e.is(cuInvalidHandle, e.cu.MemsetD8Async(r, 1, 8, s))
	e.is(cuInvalidValue, e.cu.LaunchHostFunc(0, 0, 0))
	var bad uintptr
	e.is(cuInvalidValue, e.cu.StreamCreate(&bad, 2))
	e.ok(e.cu.MemFreeHost(in))
	e.ok(e.cu.MemFreeHost(out))
	e.ok(e.cu.MemUnmap(r, 2*g))
	e.ok(e.cu.MemRelease(h))
	e.ok(e.cu.MemAddressFree(r, 2*g))
	e.noLeaks()
}

func TestQueryAndEventsWhileWorkIsPending(t *testing.T) {
	e := start(t, Config{})
	s := e.stream()
	release := make(chan struct{})
	ran := make(chan struct{})
	cb, key := hostFunc(func() {
		<-release
		close(ran)
	})
	var ev, never uintptr
	e.ok(e.cu.EventCreate(&ev, 2))
	e.ok(e.cu.EventCreate(&never, 0))
	e.ok(e.cu.LaunchHostFunc(s, cb, key))
	e.ok(e.cu.EventRecord(ev, s))
	e.is(cuNotReady, e.cu.StreamQuery(s))
	e.is(cuNotReady, e.cu.EventQuery(ev))
	e.ok(e.cu.EventQuery(never), "an event never recorded is complete")
	e.ok(e.cu.EventSynchronize(never))
	close(release)
	e.ok(e.cu.EventSynchronize(ev))
	<-ran
	e.ok(e.cu.EventQuery(ev))
	e.ok(e.cu.StreamQuery(s))

	// Destroy does not wait: the worker drains what was queued.
	release2 := make(chan struct{})
	ran2 := make(chan struct{})
	cb, key = hostFunc(func() {
		<-release2
		close(ran2)
	})
	e.ok(e.cu.LaunchHostFunc(s, cb, key))
	e.ok(e.cu.EventRecord(ev, s))
	e.ok(e.cu.StreamDestroy(s))
	require.Zero(t, e.lib.Live("streams"))
	e.is(cuNotReady, e.cu.EventQuery(ev), "the destroyed stream's work is still pending")
	close(release2)
	<-ran2
	e.ok(e.cu.EventSynchronize(ev))

	var other uintptr
	e.use(1)
	s1 := e.stream()
	e.is(cuInvalidHandle, e.cu.EventRecord(ev, s1), "an event of another context")
	e.ok(e.cu.StreamDestroy(s1))
	e.use(0)
	e.is(cuInvalidValue, e.cu.EventCreate(&other, 8))
	e.ok(e.cu.EventDestroy(ev))
	e.ok(e.cu.EventDestroy(never))
	e.is(cuInvalidHandle, e.cu.EventDestroy(ev))
	e.is(cuInvalidHandle, e.cu.EventSynchronize(0xdead0))
	e.noLeaks()
}

func TestFaultInjection(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	calls := e.lib.Calls("cuMemCreate")

	// The 2nd call from now fails, the 1st and 3rd work.
	e.lib.Fail("cuMemCreate", 2, 1, cuOutOfMemory)
	a := e.create(0, g, false)
	var h uint64
	p := prop(0, false)
	e.is(cuOutOfMemory, e.cu.MemCreate(&h, g, &p, 0))
	require.Equal(t, uint64(g), e.lib.Used(0), "an injected failure changes nothing")
	require.Equal(t, int64(1), e.lib.Live("allocations"))
	b := e.create(0, g, false)
	require.Equal(t, calls+3, e.lib.Calls("cuMemCreate"), "injected calls are counted")
	require.Zero(t, e.lib.Calls("cuNeverCalled"))

	// count <= 0: every call from the nth; nth <= 0 clears.
	r := e.reserve(4 * g)
	e.lib.Fail("cuMemMap", 1, 0, cuUnknown)
	for range 3 {
		e.is(cuUnknown, e.cu.MemMap(r, g, 0, a, 0))
	}
	require.Zero(t, e.lib.Live("mappings"))
	e.lib.Fail("cuMemMap", 0, 0, 0)
	e.ok(e.cu.MemMap(r, g, 0, a, 0))
	e.ok(e.cu.MemMap(r+g, g, 0, b, 0))
	e.ok(e.setAccess(r, 2*g, 0, accessRW))

	// :exec — the enqueue succeeds, the copy fails as it runs; later work
	// on the stream is skipped until a synchronize takes the failure.
	s := e.stream()
	src, buf := e.hostAlloc(int(g))
	copy(buf, pattern(int(g), 4))
	e.ok(e.write(r, make([]byte, g)))
	e.lib.Fail("cuMemcpyHtoDAsync_v2:exec", 1, 1, cuUnknown)
	e.ok(e.cu.MemcpyHtoDAsync(r, src, g, s))
	ran := make(chan struct{}, 1)
	cb, key := hostFunc(func() { ran <- struct{}{} })
	e.ok(e.cu.LaunchHostFunc(s, cb, key))
	e.is(cuUnknown, e.cu.StreamSynchronize(s))
	require.Empty(t, ran, "work after a failure is skipped")
	got, res := e.read(r, g)
	e.ok(res)
	require.Equal(t, make([]byte, g), got, "the failed copy moved nothing")
	e.ok(e.cu.MemcpyHtoDAsync(r, src, g, s), "injection was for one call")
	e.ok(e.cu.StreamSynchronize(s), "the failure was taken; the stream works again")
	got, _ = e.read(r, g)
	require.Equal(t, pattern(int(g), 4), got)

	// A plain and an :exec injection of one function are separate.
	e.lib.Fail("cuMemsetD8Async", 1, 1, cuInvalidValue)
	e.lib.Fail("cuMemsetD8Async:exec", 2, 1, cuUnknown)
	e.is(cuInvalidValue, e.cu.MemsetD8Async(r, 0, g, s))
	e.ok(e.cu.MemsetD8Async(r, 0, g, s))
	e.is(cuUnknown, e.cu.StreamSynchronize(s))

	// :exec with 700 is sticky, as a real illegal address is.
	e.lib.Fail("cuEventRecord:exec", 1, 1, cuIllegalAddress)
	var ev uintptr
	e.ok(e.cu.EventCreate(&ev, 0))
	e.ok(e.cu.EventRecord(ev, s))
	e.is(cuIllegalAddress, e.cu.EventSynchronize(ev))
	var x uint64
	e.is(cuIllegalAddress, e.cu.MemAddressReserve(&x, g, 0, 0, 0))
	e.ok(e.cu.PrimaryCtxRelease(0))
	e.ok(e.cu.PrimaryCtxRetain(&e.ctx[0], 0))
	e.use(0)

	// Synchronous copies take :exec too.
	e.lib.Fail("cuMemcpyDtoH_v2:exec", 1, 1, cuUnknown)
	_, res = e.read(r, 16)
	e.is(cuUnknown, res)

	// Before initialisation, and Clear.
	f := open(t, Config{})
	f.lib.Fail("cuInit", 1, 1, cuNoDevice)
	f.lib.Fail("cuDriverGetVersion", 1, 0, cuUnknown)
	f.is(cuNoDevice, f.cu.Init(0))
	f.ok(f.cu.Init(0))
	var v int32
	f.is(cuUnknown, f.cu.DriverGetVersion(&v))
	f.lib.Clear()
	f.ok(f.cu.DriverGetVersion(&v))

	e.ok(e.cu.MemFreeHost(src))
	e.ok(e.cu.MemUnmap(r, 2*g))
	e.ok(e.cu.MemRelease(a))
	e.ok(e.cu.MemRelease(b))
	e.ok(e.cu.MemAddressFree(r, 4*g))
	e.noLeaks()
}

func TestStubLibrary(t *testing.T) {
	e := open(t, Config{Stub: true})
	var v int32
	var s unsafe.Pointer
	e.is(cuStubLibrary, e.cu.Init(0))
	e.is(cuStubLibrary, e.cu.DriverGetVersion(&v))
	e.is(cuStubLibrary, e.cu.GetErrorName(0, &s))
	e.is(cuStubLibrary, e.cu.DeviceGetCount(&v))
	require.Equal(t, uint64(1), e.lib.Calls("cuInit"))
}

func TestExportImport(t *testing.T) {
	e := start(t, Config{})
	g := e.gran
	h := e.create(1, g, true)
	var fd, fd2 int32
	e.ok(e.cu.MemExport(&fd, h, handlePOSIX, 0))
	defer unix.Close(int(fd))
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("/memfd:vmstandin:cuda:1:%d (deleted)", g), link)
	e.ok(e.cu.MemExport(&fd2, h, handlePOSIX, 0), "exports may repeat")
	require.NotEqual(t, fd, fd2)
	require.NoError(t, unix.Close(int(fd2)))

	var h2 uint64
	e.ok(e.cu.MemImport(&h2, uintptr(fd), handlePOSIX))
	require.NotEqual(t, h, h2)
	require.Equal(t, uint64(g), e.lib.Used(1), "the same memory counts once in a process")
	require.Equal(t, int64(2), e.lib.Live("allocations"))

	r := e.reserve(2 * g)
	e.ok(e.cu.MemMap(r, g, 0, h, 0))
	e.ok(e.cu.MemMap(r+g, g, 0, h2, 0))
	e.ok(e.setAccess(r, 2*g, 0, accessRW))
	data := pattern(int(g), 11)
	e.ok(e.write(r, data))
	got, res := e.read(r+g, g)
	e.ok(res)
	require.Equal(t, data, got, "written through the exporter's handle, read through the importer's")

	// Another instance is another process as far as the books go.
	o := start(t, Config{})
	var oh uint64
	o.ok(o.cu.MemImport(&oh, uintptr(fd), handlePOSIX))
	require.Equal(t, uint64(g), o.lib.Used(1), "counted on the device the name gives")
	or := o.reserve(g)
	o.ok(o.cu.MemMap(or, g, 0, oh, 0))
	o.ok(o.setAccess(or, g, 0, accessRW))
	got, res = o.read(or, g)
	o.ok(res)
	require.Equal(t, data, got)
	o.ok(o.write(or, pattern(int(g), 12)))
	got, _ = e.read(r, g)
	require.Equal(t, pattern(int(g), 12), got)
	o.ok(o.cu.MemRelease(oh))
	o.ok(o.cu.MemUnmap(or, g))
	o.ok(o.cu.MemAddressFree(or, g))
	o.noLeaks()

	// What is not a stand-in's shareable memory is refused.
	plain := e.create(0, g, false)
	var bad int32
	var bh uint64
	e.is(cuInvalidValue, e.cu.MemExport(&bad, plain, handlePOSIX, 0), "not created shareable")
	e.is(cuInvalidValue, e.cu.MemExport(&bad, h, 2, 0), "a Windows handle")
	e.is(cuInvalidValue, e.cu.MemImport(&bh, uintptr(fd), 2))
	e.is(cuInvalidValue, e.cu.MemImport(&bh, 1<<30, handlePOSIX), "no such descriptor")
	devnull, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer devnull.Close()
	e.is(cuInvalidValue, e.cu.MemImport(&bh, devnull.Fd(), handlePOSIX))
	for _, name := range []string{
		fmt.Sprintf("vmstandin:cuda:0:%d", g), // unsealed
		fmt.Sprintf("vmstandin:acl:0:%d", g),  // another vendor
		fmt.Sprintf("vmstandin:cuda:0:%d", 2*g),
	} {
		mfd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		require.NoError(t, err)
		require.NoError(t, unix.Ftruncate(mfd, int64(g)))
		if !strings.HasSuffix(name, fmt.Sprintf(":cuda:0:%d", g)) {
			_, err = unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
			require.NoError(t, err)
		}
		e.is(cuInvalidValue, e.cu.MemImport(&bh, uintptr(mfd), handlePOSIX), name)
		require.NoError(t, unix.Close(mfd))
	}
	require.Equal(t, int64(3), e.lib.Live("allocations"))

	e.ok(e.cu.MemUnmap(r, 2*g))
	e.ok(e.cu.MemRelease(h))
	require.Equal(t, uint64(g), e.lib.Used(1), "the import still holds it")
	e.ok(e.cu.MemRelease(h2))
	e.ok(e.cu.MemRelease(plain))
	e.ok(e.cu.MemAddressFree(r, 2*g))
	e.noLeaks()

	np := start(t, Config{NoPOSIXFD: true})
	p := prop(0, true)
	np.is(cuNotSupported, np.cu.MemCreate(&bh, np.gran, &p, 0))
	np.is(cuNotSupported, np.cu.MemImport(&bh, uintptr(fd), handlePOSIX))
}

func TestPeers(t *testing.T) {
	e := start(t, Config{Devices: 3})
	var can int32
	e.ok(e.cu.DeviceCanAccessPeer(&can, 0, 1))
	require.Equal(t, int32(1), can)
	e.ok(e.cu.DeviceCanAccessPeer(&can, 1, 1))
	require.Zero(t, can)
	e.is(cuInvalidDevice, e.cu.DeviceCanAccessPeer(&can, 0, 3))
	e.ok(e.cu.CtxEnablePeerAccess(e.ctx[1], 0))
	e.is(cuPeerAlreadyEnabled, e.cu.CtxEnablePeerAccess(e.ctx[1], 0))
	e.ok(e.cu.CtxEnablePeerAccess(e.ctx[2], 0))
	e.is(cuInvalidDevice, e.cu.CtxEnablePeerAccess(e.ctx[0], 0), "its own device")
	e.is(cuInvalidValue, e.cu.CtxEnablePeerAccess(e.ctx[1], 1))
	e.is(cuInvalidContext, e.cu.CtxEnablePeerAccess(0xdead0, 0))
	e.ok(e.cu.PrimaryCtxRelease(0))
	e.ok(e.cu.PrimaryCtxRetain(&e.ctx[0], 0))
	e.use(0)
	e.ok(e.cu.CtxEnablePeerAccess(e.ctx[1], 0), "a new context starts without peers")

	n := start(t, Config{NoPeer: true})
	n.ok(n.cu.DeviceCanAccessPeer(&can, 0, 1))
	require.Zero(t, can)
	n.is(cuPeerUnsupported, n.cu.CtxEnablePeerAccess(n.ctx[1], 0))
}

func TestHostAlloc(t *testing.T) {
	e := start(t, Config{})
	p, buf := e.hostAlloc(10000)
	require.Zero(t, uintptr(p)%uintptr(os.Getpagesize()))
	copy(buf, pattern(len(buf), 1))
	require.Equal(t, int64(1), e.lib.Live("hostallocs"))
	e.is(cuInvalidValue, e.cu.MemFreeHost(unsafe.Add(p, 8)), "not an allocation's start")
	var q unsafe.Pointer
	e.is(cuInvalidValue, e.cu.MemHostAlloc(&q, 0, 0))
	e.is(cuInvalidValue, e.cu.MemHostAlloc(&q, 4096, 8))
	e.ok(e.cu.MemFreeHost(p))
	e.is(cuInvalidValue, e.cu.MemFreeHost(p), "freed already")
	e.noLeaks()
}

// TestConcurrentUse runs whole lifecycles from many threads at once, and
// copies against access that changes under them: every result must be a
// CUDA code, never a crash.
func TestConcurrentUse(t *testing.T) {
	e := start(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	cu := e.cu
	const workers, rounds = 6, 30
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			dev := w % 2
			if !assert.Zero(t, cu.CtxSetCurrent(e.ctx[dev])) {
				return
			}
			var s uintptr
			assert.Zero(t, cu.StreamCreate(&s, 1))
			p := prop(dev, w%3 == 0)
			buf := pattern(int(2*g), byte(w))
			out := make([]byte, 2*g)
			for range rounds {
				var r, h uint64
				assert.Zero(t, cu.MemAddressReserve(&r, 4*g, 0, 0, 0))
				assert.Zero(t, cu.MemCreate(&h, 2*g, &p, 0))
				assert.Zero(t, cu.MemMap(r, 2*g, 0, h, 0))
				assert.Zero(t, cu.MemMap(r+2*g, 2*g, 0, h, 0))
				d := accessDesc{memLocation{locDevice, int32(dev)}, accessRW}
				assert.Zero(t, cu.MemSetAccess(r, 4*g, &d, 1))
				assert.Zero(t, cu.MemcpyHtoD(r, unsafe.Pointer(&buf[0]), 2*g))
				assert.Zero(t, cu.MemsetD8Async(r+2*g, byte(w), 8, s))
				assert.Zero(t, cu.StreamSynchronize(s))
				assert.Zero(t, cu.MemcpyDtoH(unsafe.Pointer(&out[0]), r, 2*g))
				assert.Equal(t, bytes.Repeat([]byte{byte(w)}, 8), out[:8])
				assert.Equal(t, buf[8:], out[8:])
				assert.Zero(t, cu.MemUnmap(r, 4*g))
				assert.Zero(t, cu.MemRelease(h))
				assert.Zero(t, cu.MemAddressFree(r, 4*g))
			}
			assert.Zero(t, cu.StreamDestroy(s))
		})
	}

	// One mapping whose access flips while another thread copies from it.
	r := e.reserve(g)
	h := e.create(0, g, false)
	e.ok(e.cu.MemMap(r, g, 0, h, 0))
	stop := make(chan struct{})
	wg.Go(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		assert.Zero(t, cu.CtxSetCurrent(e.ctx[0]))
		out := make([]byte, g)
		for {
			select {
			case <-stop:
				return
			default:
			}
			res := cu.MemcpyDtoH(unsafe.Pointer(&out[0]), r, g)
			assert.Contains(t, []int32{cuSuccess, cuIllegalAddress}, res)
		}
	})
	for i := range 200 {
		e.ok(e.setAccess(r, g, 0, []int32{accessRW, accessNone, accessRead}[i%3]))
	}
	close(stop)
	wg.Wait()
	e.ok(e.cu.MemUnmap(r, g))
	e.ok(e.cu.MemRelease(h))
	e.ok(e.cu.MemAddressFree(r, g))
	e.noLeaks()
}

// heaps counts this process's descriptors of stand-in device heaps.
func heaps(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(link, "vmstandin-heap:") {
			n++
		}
	}
	return n
}

// TestRetireGivesBackTheHeaps: an instance holds one descriptor per device
// for its heap; retiring it gives them back, but only once nothing of it is
// live, and Open retires what a test leaves empty.
func TestRetireGivesBackTheHeaps(t *testing.T) {
	before := heaps(t)
	t.Run("left empty", func(t *testing.T) {
		e := start(t, Config{})
		require.Equal(t, before+2, heaps(t), "two devices, two heaps")
		require.Equal(t, int64(-1), e.lib.Live("nonsense"), "an unknown kind")
		for d := range e.ctx {
			e.ok(e.cu.PrimaryCtxRelease(int32(d)))
		}
	})
	require.Equal(t, before, heaps(t), "Open's cleanup retired the empty instance")

	t.Run("still holding", func(t *testing.T) {
		e := start(t, Config{})
		require.Equal(t, int64(2), e.lib.retire(), "two retained contexts keep it")
		require.Equal(t, before+2, heaps(t), "a refused retirement closes nothing")
		e.ok(e.cu.PrimaryCtxRelease(0))
		e.ok(e.cu.PrimaryCtxRelease(1))
		require.Equal(t, int64(0), e.lib.retire())
		require.Equal(t, before, heaps(t))
		require.Equal(t, int64(0), e.lib.retire(), "retiring twice is harmless")
	})
}
