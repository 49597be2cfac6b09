//go:build linux

package standin

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// AscendCL error codes the tests expect (shared/ACL_ABI.md and acl.c).
const (
	aclSuccess         = 0
	aclUninitialize    = 100001
	aclRepeatInit      = 100002
	aclInvalidFile     = 100003
	aclRepeatFinalize  = 100037
	aclParamInvalid    = 107000
	aclInvalidDeviceID = 107001
	aclContextNull     = 107002
	aclStreamContext   = 107003
	aclAddrUnaligned   = 107008
	aclInvalidHandle   = 107017
	aclNotSupport      = 207000
	aclMemoryAlloc     = 207001
	aclNoPermission    = 207006
	aclSysDMA          = 507013
)

const (
	aclHostToHost     = 0
	aclHostToDevice   = 1
	aclDeviceToHost   = 2
	aclDeviceToDevice = 3
	aclHBMMemHuge     = 4
	aclExportNoCheck  = 1
)

// Go mirrors of AscendCL's structs, as shared/ACL_ABI.md lays them out.
type aclLocation struct {
	id  uint32
	typ int32
}

type aclProp struct {
	handleType, allocationType, memAttr int32
	location                            aclLocation
	_                                   [4]byte
	reserve                             uint64
}

type aclAccessDesc struct {
	flags    int32
	location aclLocation
	rsv      [12]byte
}

// aclAPI is AscendCL as the stand-in exports it; a field whose symbol is
// missing stays nil. Device addresses and host pointers travel as uintptr.
type aclAPI struct {
	Init             func(path *byte) int32                                                            `sym:"aclInit"`
	Finalize         func() int32                                                                      `sym:"aclFinalize"`
	GetDeviceCount   func(n *uint32) int32                                                             `sym:"aclrtGetDeviceCount"`
	SetDevice        func(dev int32) int32                                                             `sym:"aclrtSetDevice"`
	ResetDevice      func(dev int32) int32                                                             `sym:"aclrtResetDevice"`
	CreateContext    func(ctx *uintptr, dev int32) int32                                               `sym:"aclrtCreateContext"`
	DestroyContext   func(ctx uintptr) int32                                                           `sym:"aclrtDestroyContext"`
	SetCurrent       func(ctx uintptr) int32                                                           `sym:"aclrtSetCurrentContext"`
	GetCurrent       func(ctx *uintptr) int32                                                          `sym:"aclrtGetCurrentContext"`
	GetMemInfo       func(attr int32, free, total *uint64) int32                                       `sym:"aclrtGetMemInfo"`
	GetSocName       func() *byte                                                                      `sym:"aclrtGetSocName"`
	RecentErrMsg     func() *byte                                                                      `sym:"aclGetRecentErrMsg"`
	Granularity      func(p *aclProp, option int32, g *uint64) int32                                   `sym:"aclrtMemGetAllocationGranularity"`
	Reserve          func(p *uint64, size, align uint64, hint uintptr, fl uint64) int32                `sym:"aclrtReserveMemAddress"`
	Release          func(p uint64) int32                                                              `sym:"aclrtReleaseMemAddress"`
	MallocPhysical   func(h *uintptr, size uint64, p *aclProp, fl uint64) int32                        `sym:"aclrtMallocPhysical"`
	FreePhysical     func(h uintptr) int32                                                             `sym:"aclrtFreePhysical"`
	MapMem           func(p, size, off uint64, h uintptr, fl uint64) int32                             `sym:"aclrtMapMem"`
	MapNoAccess      func(p, size, off uint64, h uintptr, fl uint64) int32                             `sym:"aclrtMemMapNoAccess"`
	UnmapMem         func(p uint64) int32                                                              `sym:"aclrtUnmapMem"`
	SetAccess        func(p, size uint64, d *aclAccessDesc, n uint64) int32                            `sym:"aclrtMemSetAccess"`
	GetAccess        func(p uint64, loc *aclLocation, fl *uint64) int32                                `sym:"aclrtMemGetAccess"`
	Export           func(h uintptr, typ int32, fl uint64, tok *uint64) int32                          `sym:"aclrtMemExportToShareableHandle"`
	SetPids          func(tok uint64, pids *int32, n uint64) int32                                     `sym:"aclrtMemSetPidToShareableHandle"`
	Import           func(tok uint64, dev int32, h *uintptr) int32                                     `sym:"aclrtMemImportFromShareableHandle"`
	BareTgid         func(pid *int32) int32                                                            `sym:"aclrtDeviceGetBareTgid"`
	Memcpy           func(dst uintptr, max uint64, src uintptr, n uint64, kind int32) int32            `sym:"aclrtMemcpy"`
	MemcpyAsync      func(dst uintptr, max uint64, src uintptr, n uint64, kind int32, s uintptr) int32 `sym:"aclrtMemcpyAsync"`
	MemsetAsync      func(dst uintptr, max uint64, v int32, n uint64, s uintptr) int32                 `sym:"aclrtMemsetAsync"`
	CreateStream     func(s *uintptr) int32                                                            `sym:"aclrtCreateStream"`
	DestroyStream    func(s uintptr) int32                                                             `sym:"aclrtDestroyStream"`
	SyncStream       func(s uintptr) int32                                                             `sym:"aclrtSynchronizeStream"`
	SyncDevice       func() int32                                                                      `sym:"aclrtSynchronizeDevice"`
	CreateEvent      func(e *uintptr) int32                                                            `sym:"aclrtCreateEvent"`
	RecordEvent      func(e, s uintptr) int32                                                          `sym:"aclrtRecordEvent"`
	SyncEvent        func(e uintptr) int32                                                             `sym:"aclrtSynchronizeEvent"`
	DestroyEvent     func(e uintptr) int32                                                             `sym:"aclrtDestroyEvent"`
	CanAccessPeer    func(can *int32, dev, peer int32) int32                                           `sym:"aclrtDeviceCanAccessPeer"`
	EnablePeerAccess func(peer int32, fl uint32) int32                                                 `sym:"aclrtDeviceEnablePeerAccess"`
	MallocHost       func(p *unsafe.Pointer, size uint64) int32                                        `sym:"aclrtMallocHost"`
	FreeHost         func(p unsafe.Pointer) int32                                                      `sym:"aclrtFreeHost"`
}

func aclSymbols() []string {
	var out []string
	ty := reflect.TypeFor[aclAPI]()
	for i := range ty.NumField() {
		out = append(out, ty.Field(i).Tag.Get("sym"))
	}
	return out
}

// aclGroupSymbols are the symbols each omit group leaves out of acl.c.
var aclGroupSymbols = map[string][]string{
	"export":      {"aclrtMemExportToShareableHandle", "aclrtMemSetPidToShareableHandle", "aclrtMemImportFromShareableHandle", "aclrtDeviceGetBareTgid"},
	"hostfunc":    nil,
	"events":      {"aclrtCreateEvent", "aclrtRecordEvent", "aclrtSynchronizeEvent", "aclrtDestroyEvent"},
	"peer":        {"aclrtDeviceCanAccessPeer", "aclrtDeviceEnablePeerAccess"},
	"hostalloc":   {"aclrtMallocHost", "aclrtFreeHost"},
	"synccopy":    {"aclrtMemcpy"},
	"mapnoaccess": {"aclrtMemMapNoAccess"},
	"devsync":     {"aclrtSynchronizeDevice"},
	"streams": {"aclrtCreateStream", "aclrtDestroyStream", "aclrtSynchronizeStream", "aclrtMemcpyAsync",
		"aclrtMemsetAsync"},
	"vmm": {"aclrtMemGetAllocationGranularity", "aclrtReserveMemAddress", "aclrtReleaseMemAddress",
		"aclrtMallocPhysical", "aclrtFreePhysical", "aclrtMapMem", "aclrtMemMapNoAccess", "aclrtUnmapMem", "aclrtMemSetAccess",
		"aclrtMemGetAccess", "aclrtMemExportToShareableHandle", "aclrtMemSetPidToShareableHandle",
		"aclrtMemImportFromShareableHandle", "aclrtDeviceGetBareTgid"},
}

func loadACL(l *Lib) *aclAPI {
	var api aclAPI
	bindTagged(l, &api)
	return &api
}

// aclEnv is one fresh AscendCL stand-in and the API over it; its test
// goroutine stays on one OS thread (the current context is per thread).
type aclEnv struct {
	t    *testing.T
	lib  *Lib
	acl  *aclAPI
	ctx  []uintptr // each device's default context, set by start
	gran uint64
}

func openACL(t *testing.T, cfg Config) *aclEnv {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	l := Open(t, ACL, cfg)
	return &aclEnv{t: t, lib: l, acl: loadACL(l)}
}

// startACL initialises an instance, sets every device and makes device
// 0's default context current.
func startACL(t *testing.T, cfg Config) *aclEnv {
	t.Helper()
	e := openACL(t, cfg)
	e.ok(e.acl.Init(nil))
	var n uint32
	e.ok(e.acl.GetDeviceCount(&n))
	e.ctx = make([]uintptr, n)
	for d := range e.ctx {
		e.ok(e.acl.SetDevice(int32(d)))
		e.ok(e.acl.GetCurrent(&e.ctx[d]))
	}
	e.use(0)
	if !cfg.NoVMM {
		p := aclPropOn(0)
		e.ok(e.acl.Granularity(&p, granMinimum, &e.gran))
	}
	return e
}

func (e *aclEnv) ok(r int32, what ...any) {
	e.t.Helper()
	require.Equal(e.t, int32(aclSuccess), r, append(what, e.recent())...)
}

func (e *aclEnv) is(want, got int32, what ...any) {
	e.t.Helper()
	require.Equal(e.t, int32(want), got, what...)
}

// recent is the stand-in's message about this thread's last failure.
func (e *aclEnv) recent() string {
	if p := e.acl.RecentErrMsg(); p != nil {
		return unix.BytePtrToString(p)
	}
	return ""
}

func (e *aclEnv) use(dev int) { e.t.Helper(); e.ok(e.acl.SetCurrent(e.ctx[dev])) }

func aclPropOn(dev int) aclProp {
	return aclProp{memAttr: aclHBMMemHuge, location: aclLocation{id: uint32(dev), typ: locDevice}}
}

func (e *aclEnv) reserve(size uint64) uint64 {
	e.t.Helper()
	var p uint64
	e.ok(e.acl.Reserve(&p, size, 0, 0, 0))
	return p
}

func (e *aclEnv) malloc(dev int, size uint64) uintptr {
	e.t.Helper()
	var h uintptr
	p := aclPropOn(dev)
	e.ok(e.acl.MallocPhysical(&h, size, &p, 0))
	return h
}

func (e *aclEnv) setAccess(addr, size uint64, dev int, flags int32) int32 {
	d := aclAccessDesc{flags: flags, location: aclLocation{id: uint32(dev), typ: locDevice}}
	return e.acl.SetAccess(addr, size, &d, 1)
}

func (e *aclEnv) write(addr uint64, data []byte) int32 {
	defer runtime.KeepAlive(data)
	return e.acl.Memcpy(uintptr(addr), uint64(len(data)), uintptr(unsafe.Pointer(&data[0])), uint64(len(data)), aclHostToDevice)
}

func (e *aclEnv) read(addr, n uint64) ([]byte, int32) {
	buf := make([]byte, n)
	defer runtime.KeepAlive(buf)
	return buf, e.acl.Memcpy(uintptr(unsafe.Pointer(&buf[0])), n, uintptr(addr), n, aclDeviceToHost)
}

// mapped reserves, allocates and maps size bytes on dev, read-write for dev.
func (e *aclEnv) mapped(dev int, size uint64) (uint64, uintptr) {
	e.t.Helper()
	r := e.reserve(size)
	h := e.malloc(dev, size)
	e.ok(e.acl.MapMem(r, size, 0, h, 0))
	e.ok(e.setAccess(r, size, dev, accessRW))
	return r, h
}

func (e *aclEnv) unmapped(r uint64, h uintptr) {
	e.t.Helper()
	e.ok(e.acl.UnmapMem(r))
	e.ok(e.acl.FreePhysical(h))
	e.ok(e.acl.Release(r))
}

func (e *aclEnv) hostAlloc(n int) (unsafe.Pointer, []byte) {
	e.t.Helper()
	var p unsafe.Pointer
	e.ok(e.acl.MallocHost(&p, uint64(n)))
	return p, unsafe.Slice((*byte)(p), n)
}

func (e *aclEnv) stream() uintptr {
	e.t.Helper()
	var s uintptr
	e.ok(e.acl.CreateStream(&s))
	return s
}

func (e *aclEnv) noLeaks() {
	e.t.Helper()
	require.Empty(e.t, leaksBut(e.lib, "contexts"))
	for d := range e.ctx {
		require.Zero(e.t, e.lib.Used(d), "device %d", d)
	}
}

// ---------------------------------------------------------------------------

func TestACLStructLayouts(t *testing.T) {
	require.Equal(t, uintptr(8), unsafe.Sizeof(aclLocation{}))
	require.Equal(t, uintptr(32), unsafe.Sizeof(aclProp{}))
	require.Equal(t, uintptr(12), unsafe.Offsetof(aclProp{}.location))
	require.Equal(t, uintptr(24), unsafe.Offsetof(aclProp{}.reserve))
	require.Equal(t, uintptr(24), unsafe.Sizeof(aclAccessDesc{}))
	require.Equal(t, uintptr(4), unsafe.Offsetof(aclAccessDesc{}.location))
	require.Equal(t, uintptr(12), unsafe.Offsetof(aclAccessDesc{}.rsv))
}

func TestACLBuildExportsItsInterface(t *testing.T) {
	needCompiler(t)
	p, err := Build(ACL, nil)
	require.NoError(t, err)
	require.Equal(t, "libascendcl.so", filepath.Base(p))
	h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	for _, s := range append(aclSymbols(), "vmstandin_configure", "vmstandin_access", "vmstandin_live") {
		_, err := purego.Dlsym(h, s)
		require.NoError(t, err, s)
	}
	// aclGetRecentErrMsg is acl.h's (ACL 1.17); AscendCL has no
	// aclrtGetRecentErrMsg.
	for _, s := range []string{"cuInit", "vdev_token_import", "vdev_ctx_create", "aclrtGetRecentErrMsg"} {
		_, err := purego.Dlsym(h, s)
		require.Error(t, err, "%s must not be exported", s)
	}
}

func TestACLOmitGroupRemovesExactlyItsSymbols(t *testing.T) {
	for _, g := range OmitGroups {
		t.Run(g, func(t *testing.T) {
			l := Open(t, ACL, Config{Omit: []string{g}})
			for _, s := range aclSymbols() {
				_, err := purego.Dlsym(l.handle, s)
				if contains(aclGroupSymbols[g], s) {
					require.Error(t, err, "%s must be left out with %s", s, g)
				} else {
					require.NoError(t, err, "%s must stay with %s", s, g)
				}
			}
		})
	}
}

func TestACLInitAndFinalize(t *testing.T) {
	e := openACL(t, Config{Devices: 3})
	var n uint32
	e.is(aclUninitialize, e.acl.GetDeviceCount(&n), "before aclInit")
	require.Contains(t, e.recent(), "aclrtGetDeviceCount: aclInit has not succeeded")
	require.Empty(t, e.recent(), "a message is handed out once")
	e.is(aclUninitialize, e.acl.SetDevice(0))
	require.Nil(t, e.acl.GetSocName())
	missing := append([]byte(filepath.Join(t.TempDir(), "acl.json")), 0)
	e.is(aclInvalidFile, e.acl.Init(&missing[0]), "a configuration file that is not there")
	cfgFile := filepath.Join(t.TempDir(), "acl.json")
	require.NoError(t, os.WriteFile(cfgFile, []byte("{}"), 0o644))
	path := append([]byte(cfgFile), 0)
	e.ok(e.acl.Init(&path[0]))
	e.is(aclRepeatInit, e.acl.Init(nil))
	e.ok(e.acl.GetDeviceCount(&n))
	require.Equal(t, uint32(3), n)
	require.Equal(t, "Ascend910B-vmstandin", unix.BytePtrToString(e.acl.GetSocName()))
	require.Equal(t, int32(-1), e.lib.configure(""), "configuration is fixed once initialised")
	var pid int32
	e.ok(e.acl.BareTgid(&pid))
	require.Equal(t, int32(os.Getpid()), pid)

	e.ok(e.acl.Finalize())
	e.is(aclRepeatFinalize, e.acl.Finalize())
	e.is(aclUninitialize, e.acl.GetDeviceCount(&n), "finalised")
	e.is(aclRepeatInit, e.acl.Init(nil), "no second life")

	nd := openACL(t, Config{NoDevice: true})
	nd.ok(nd.acl.Init(nil), "no NPU: AscendCL initialises all the same")
	nd.ok(nd.acl.GetDeviceCount(&n))
	require.Zero(t, n)
	nd.is(aclInvalidDeviceID, nd.acl.SetDevice(0))
	var p uint64
	nd.is(aclContextNull, nd.acl.Reserve(&p, 2*mib, 0, 0, 0))
}

func TestACLContexts(t *testing.T) {
	e := openACL(t, Config{})
	e.ok(e.acl.Init(nil))
	var p uint64
	e.is(aclContextNull, e.acl.Reserve(&p, 2*mib, 0, 0, 0), "no current context")
	require.Contains(t, e.recent(), "no current context")
	var cur uintptr
	e.is(aclContextNull, e.acl.GetCurrent(&cur))
	e.is(aclInvalidDeviceID, e.acl.SetDevice(2))
	e.is(aclInvalidDeviceID, e.acl.SetDevice(-1))
	e.is(aclContextNull, e.acl.ResetDevice(1), "never set")

	// aclrtSetDevice counts, and makes the default context current.
	e.ok(e.acl.SetDevice(1))
	e.ok(e.acl.SetDevice(1))
	require.Equal(t, int64(2), e.lib.Live("contexts"))
	var def uintptr
	e.ok(e.acl.GetCurrent(&def))
	e.ok(e.acl.Reserve(&p, 2*mib, 0, 0, 0))
	e.ok(e.acl.Release(p))
	e.is(aclInvalidHandle, e.acl.DestroyContext(def), "a default context goes with aclrtResetDevice")

	// An explicit context is current once made; destroyed, it goes with
	// its streams and is current no more.
	var ctx uintptr
	e.ok(e.acl.CreateContext(&ctx, 0))
	require.Equal(t, int64(3), e.lib.Live("contexts"))
	e.ok(e.acl.GetCurrent(&cur))
	require.Equal(t, ctx, cur)
	s := uintptr(0)
	e.ok(e.acl.CreateStream(&s))
	require.Equal(t, int64(1), e.lib.Live("streams"))
	e.ok(e.acl.DestroyContext(ctx))
	require.Zero(t, e.lib.Live("streams"), "the context's streams went with it")
	require.Equal(t, int64(2), e.lib.Live("contexts"))
	e.is(aclContextNull, e.acl.Reserve(&p, 2*mib, 0, 0, 0), "the destroyed context was current")
	e.is(aclInvalidHandle, e.acl.DestroyContext(ctx), "destroyed twice")
	e.is(aclInvalidHandle, e.acl.SetCurrent(ctx), "a destroyed context")
	e.is(aclInvalidHandle, e.acl.SetCurrent(0xdead0), "never a context")
	e.is(aclInvalidHandle, e.acl.DestroyContext(0xdead0))
	e.is(aclParamInvalid, e.acl.SetCurrent(0))
	e.is(aclInvalidDeviceID, e.acl.CreateContext(&ctx, 5))

	e.ok(e.acl.SetCurrent(def))
	e.ok(e.acl.ResetDevice(1))
	e.ok(e.acl.Reserve(&p, 2*mib, 0, 0, 0), "one aclrtSetDevice left")
	e.ok(e.acl.Release(p))
	e.ok(e.acl.ResetDevice(1))
	require.Zero(t, e.lib.Live("contexts"))
	e.is(aclContextNull, e.acl.Reserve(&p, 2*mib, 0, 0, 0), "the device's last reset ended its default context")
	e.is(aclContextNull, e.acl.ResetDevice(1))
}

func TestACLReservationsAreOddlyAligned(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	var rs []uint64
	for range 8 {
		r := e.reserve(3 * g)
		require.Zero(t, r%g, "aligned to the granularity")
		require.Equal(t, g, r%(2*g), "and deliberately never to twice it")
		require.Equal(t, "---p", protAt(t, r))
		rs = append(rs, r)
	}
	var p uint64
	e.is(aclParamInvalid, e.acl.Reserve(&p, 3*g, 2*g, 0, 0), "alignment must be 0")
	e.is(aclParamInvalid, e.acl.Reserve(&p, 3*g, 0, uintptr(rs[0]), 0), "hint must be NULL")
	e.is(aclParamInvalid, e.acl.Reserve(&p, 3*g, 0, 0, 1), "flags must be 0")
	e.is(aclParamInvalid, e.acl.Reserve(&p, g+4*kib, 0, 0, 0), "a size off the granularity")
	e.is(aclParamInvalid, e.acl.Reserve(&p, 0, 0, 0, 0))
	require.Equal(t, int64(8), e.lib.Live("reservations"))

	h := e.malloc(0, g)
	e.ok(e.acl.MapMem(rs[0]+g, g, 0, h, 0))
	e.is(aclParamInvalid, e.acl.Release(rs[0]), "something is mapped inside")
	e.is(aclParamInvalid, e.acl.Release(rs[1]+g), "not the start of a reservation")
	e.ok(e.acl.UnmapMem(rs[0] + g))
	e.ok(e.acl.FreePhysical(h))
	for _, r := range rs {
		e.ok(e.acl.Release(r))
	}
	e.is(aclParamInvalid, e.acl.Release(rs[0]), "released already")
	e.noLeaks()
}

func TestACLPhysicalMemoryAndMaps(t *testing.T) {
	e := startACL(t, Config{Capacity: 4 * mib, MinGranularity: 64 * kib, RecommendedGranularity: mib})
	g := e.gran
	var x uint64
	p := aclPropOn(0)
	e.ok(e.acl.Granularity(&p, granRecommen, &x))
	require.Equal(t, uint64(mib), x)
	e.is(aclParamInvalid, e.acl.Granularity(&p, 2, &x))

	var h uintptr
	for name, bad := range map[string]func(*aclProp){
		"handle type":     func(p *aclProp) { p.handleType = 2 },
		"allocation type": func(p *aclProp) { p.allocationType = 1 },
		"location type":   func(p *aclProp) { p.location.typ = 0 },
		"memory kind":     func(p *aclProp) { p.memAttr = 1 },
		"reserve":         func(p *aclProp) { p.reserve = 1 },
	} {
		q := aclPropOn(0)
		bad(&q)
		e.is(aclParamInvalid, e.acl.MallocPhysical(&h, g, &q, 0), name)
		e.is(aclParamInvalid, e.acl.Granularity(&q, granMinimum, &x), name)
	}
	for _, attr := range []int32{4, 5, 12, 13, 14, 16} {
		q := aclPropOn(1)
		q.memAttr = attr
		e.ok(e.acl.Granularity(&q, granMinimum, &x), attr)
	}
	q := aclPropOn(2)
	e.is(aclInvalidDeviceID, e.acl.MallocPhysical(&h, g, &q, 0))
	e.is(aclParamInvalid, e.acl.MallocPhysical(&h, g, &p, 1), "flags must be 0")
	e.is(aclParamInvalid, e.acl.MallocPhysical(&h, g+4*kib, &p, 0))
	e.is(aclParamInvalid, e.acl.MallocPhysical(&h, 0, &p, 0))
	require.Zero(t, e.lib.Live("allocations"))

	// Out of memory changes nothing; aclrtGetMemInfo sees what is used.
	a := e.malloc(0, 3*mib)
	e.is(aclMemoryAlloc, e.acl.MallocPhysical(&h, 2*mib, &p, 0))
	require.Equal(t, uint64(3*mib), e.lib.Used(0))
	var free, total uint64
	e.ok(e.acl.GetMemInfo(1, &free, &total))
	require.Equal(t, uint64(4*mib), total)
	require.Equal(t, uint64(mib), free)
	e.ok(e.acl.GetMemInfo(0, &free, &total), "DDR: the stand-in's NPU has none")
	require.Zero(t, total)
	e.is(aclParamInvalid, e.acl.GetMemInfo(9, &free, &total))

	// A map takes the whole handle at offset 0, inside one reservation,
	// over no mapping.
	r := e.reserve(8 * g)
	b := e.malloc(0, 2*g)
	e.is(aclParamInvalid, e.acl.MapMem(r, g, 0, b, 0), "part of the handle")
	e.is(aclParamInvalid, e.acl.MapMem(r, 4*g, 0, b, 0), "more than the handle")
	e.is(aclParamInvalid, e.acl.MapMem(r, 2*g, g, b, 0), "offset must be 0")
	e.is(aclParamInvalid, e.acl.MapMem(r, 2*g, 0, b, 1), "flags must be 0")
	e.is(aclParamInvalid, e.acl.MapMem(r+4*kib, 2*g, 0, b, 0), "misaligned")
	e.is(aclParamInvalid, e.acl.MapMem(r+7*g, 2*g, 0, b, 0), "past the reservation")
	e.is(aclInvalidHandle, e.acl.MapMem(r, 2*g, 0, 0xdead0, 0), "never a handle")
	e.ok(e.acl.MapMem(r, 2*g, 0, b, 0))
	e.is(aclParamInvalid, e.acl.MapMem(r+g, 2*g, 0, b, 0), "over a mapping")
	e.is(aclParamInvalid, e.acl.MapNoAccess(r+g, 2*g, 0, b, 0), "over a mapping")
	require.Equal(t, "rw-s", protAt(t, r), "aclrtMapMem's mapping is accessible at once")
	require.Equal(t, accessRW, e.lib.Access(r, 0), "to the handle's device")
	require.Equal(t, accessNone, e.lib.Access(r, 1), "and to no other")
	e.ok(e.acl.MapNoAccess(r+2*g, 2*g, 0, b, 0), "a handle maps at several addresses")
	require.Equal(t, "---s", protAt(t, r+2*g), "aclrtMemMapNoAccess's is inaccessible")
	require.Equal(t, accessNone, e.lib.Access(r+2*g, 0))

	e.is(aclParamInvalid, e.acl.UnmapMem(r+g), "not the start of a mapping")
	e.is(aclParamInvalid, e.acl.FreePhysical(b), "still mapped")
	require.Contains(t, e.recent(), "still mapped")
	e.ok(e.acl.UnmapMem(r))
	require.Equal(t, "---p", protAt(t, r), "the whole mapping went")
	require.Equal(t, int64(1), e.lib.Live("mappings"))
	e.ok(e.acl.UnmapMem(r + 2*g))
	e.is(aclParamInvalid, e.acl.UnmapMem(r), "nothing mapped")
	e.ok(e.acl.FreePhysical(b))
	e.is(aclInvalidHandle, e.acl.FreePhysical(b), "freed twice")
	e.is(aclInvalidHandle, e.acl.FreePhysical(0xdead0))
	e.ok(e.acl.FreePhysical(a))
	e.ok(e.acl.Release(r))
	e.noLeaks()
}

// TestACLSetAccessTakesOneWholeMapping: aclrtMemSetAccess takes exactly
// what aclrtMapMem mapped (Huawei's reference: virPtr and size must be
// aclrtMapMem's): a range over two mappings and a piece of one are refused
// and change nothing.
func TestACLSetAccessTakesOneWholeMapping(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r := e.reserve(4 * g)
	a, b := e.malloc(0, 2*g), e.malloc(0, 2*g)
	e.ok(e.acl.MapNoAccess(r, 2*g, 0, a, 0))
	e.ok(e.acl.MapNoAccess(r+2*g, 2*g, 0, b, 0))
	e.is(aclParamInvalid, e.setAccess(r, 4*g, 0, accessRW), "two mappings in one call")
	require.Equal(t, accessNone, e.lib.Access(r, 0), "refused: nothing changed")
	e.is(aclParamInvalid, e.setAccess(r+g, g, 0, accessRW), "the second half of one mapping")
	e.is(aclParamInvalid, e.setAccess(r, g, 0, accessRW), "the first half of one mapping")
	require.Contains(t, e.recent(), "one whole mapping")
	require.Equal(t, accessNone, e.lib.Access(r, 0), "refused: nothing changed")
	require.Equal(t, accessNone, e.lib.Access(r+g, 0))
	e.ok(e.setAccess(r, 2*g, 0, accessRW))
	e.ok(e.setAccess(r+2*g, 2*g, 1, accessRead))
	require.Equal(t, accessRW, e.lib.Access(r, 0))
	require.Equal(t, accessRW, e.lib.Access(r+g, 0))
	require.Equal(t, accessRead, e.lib.Access(r+3*g, 1))
	var f uint64
	loc := aclLocation{id: 0, typ: locDevice}
	e.ok(e.acl.GetAccess(r+g+5, &loc, &f))
	require.Equal(t, uint64(accessRW), f)
	loc.id = 1
	e.ok(e.acl.GetAccess(r+2*g, &loc, &f))
	require.Equal(t, uint64(accessRead), f)
	loc.id = 4
	e.is(aclInvalidDeviceID, e.acl.GetAccess(r, &loc, &f))

	d := aclAccessDesc{flags: 2, location: aclLocation{id: 0, typ: locDevice}}
	e.is(aclParamInvalid, e.acl.SetAccess(r, 2*g, &d, 1), "write-only is no access value")
	d = aclAccessDesc{flags: accessRW, location: aclLocation{id: 0, typ: 0}}
	e.is(aclParamInvalid, e.acl.SetAccess(r, 2*g, &d, 1), "a host location")
	d = aclAccessDesc{flags: accessRW, location: aclLocation{id: 9, typ: locDevice}}
	e.is(aclInvalidDeviceID, e.acl.SetAccess(r, 2*g, &d, 1))
	d = aclAccessDesc{flags: accessRW, location: aclLocation{id: 0, typ: locDevice}}
	d.rsv[11] = 1
	e.is(aclParamInvalid, e.acl.SetAccess(r, 2*g, &d, 1), "rsv must be zero")
	e.is(aclParamInvalid, e.acl.SetAccess(r, 2*g, &d, 0), "no descriptor")
	e.is(aclParamInvalid, e.setAccess(r+4*kib, 2*g, 0, accessRW), "misaligned")
	two := []aclAccessDesc{{accessRead, aclLocation{0, locDevice}, [12]byte{}}, {accessRW, aclLocation{1, locDevice}, [12]byte{}}}
	e.ok(e.acl.SetAccess(r, 2*g, &two[0], 2), "several descriptors at the 24-byte stride")
	require.Equal(t, accessRead, e.lib.Access(r, 0))
	require.Equal(t, accessRW, e.lib.Access(r+g, 1))

	e.ok(e.acl.UnmapMem(r))
	e.ok(e.acl.UnmapMem(r + 2*g))
	e.ok(e.acl.FreePhysical(a))
	e.ok(e.acl.FreePhysical(b))
	e.ok(e.acl.Release(r))
	e.noLeaks()
}

// TestACLReservationBindsOneDevice: as Huawei's reference for aclrtMapMem
// says, one reservation is never bound to the memory of two devices at
// once; the refused map changes nothing, and once the first device's
// mapping is gone the other's maps there.
func TestACLReservationBindsOneDevice(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	r, r2 := e.reserve(4*g), e.reserve(2*g)
	a, b := e.malloc(0, 2*g), e.malloc(1, 2*g)
	e.ok(e.acl.MapNoAccess(r, 2*g, 0, a, 0))
	e.is(aclParamInvalid, e.acl.MapNoAccess(r+2*g, 2*g, 0, b, 0), "device 1's memory beside device 0's")
	require.Contains(t, e.recent(), "holds memory of device 0")
	e.is(aclParamInvalid, e.acl.MapMem(r+2*g, 2*g, 0, b, 0), "aclrtMapMem alike")
	require.Equal(t, int64(1), e.lib.Live("mappings"), "refused: nothing mapped")
	require.Equal(t, "---p", protAt(t, r+2*g))
	e.ok(e.acl.MapNoAccess(r2, 2*g, 0, b, 0), "another reservation takes it")
	e.ok(e.acl.MapNoAccess(r+2*g, 2*g, 0, a, 0), "the same device's memory is fine")
	e.ok(e.acl.UnmapMem(r))
	e.is(aclParamInvalid, e.acl.MapNoAccess(r, 2*g, 0, b, 0), "device 0's is still mapped there")
	e.ok(e.acl.UnmapMem(r + 2*g))
	e.ok(e.acl.MapNoAccess(r, 2*g, 0, b, 0), "once device 0's is gone, device 1's maps")
	e.ok(e.acl.UnmapMem(r))
	e.ok(e.acl.UnmapMem(r2))
	e.ok(e.acl.FreePhysical(a))
	e.ok(e.acl.FreePhysical(b))
	e.ok(e.acl.Release(r))
	e.ok(e.acl.Release(r2))
	e.noLeaks()
}

func TestACLSyncCopy(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	// Two mappings: access is set a whole mapping at a time.
	r, h, h2 := e.reserve(2*g), e.malloc(0, g), e.malloc(0, g)
	e.ok(e.acl.MapMem(r, g, 0, h, 0), "read-write for device 0 at once")
	e.ok(e.acl.MapMem(r+g, g, 0, h2, 0))
	e.ok(e.setAccess(r+g, g, 0, accessRead))
	data := pattern(int(g), 3)
	e.ok(e.write(r, data))
	got, res := e.read(r, g)
	e.ok(res)
	require.Equal(t, data, got)

	e.is(aclParamInvalid, e.write(r+g, data), "read-only")
	require.Contains(t, e.recent(), "may not write")
	_, res = e.read(r+g-1, 2)
	e.ok(res, "readable throughout")
	e.use(1)
	_, res = e.read(r, 16)
	e.is(aclParamInvalid, res, "device 1 has no access")
	e.use(0)
	e.ok(e.write(r, data[:16]), "a refused copy is not sticky")

	buf := make([]byte, 16)
	src := pattern(16, 9)
	ptr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
	e.is(aclParamInvalid, e.acl.Memcpy(ptr(buf), 8, ptr(src), 16, aclHostToHost), "count over destMax")
	e.is(aclParamInvalid, e.acl.Memcpy(ptr(buf), 16, uintptr(r), 16, aclHostToDevice), "the kind lies about dst")
	e.is(aclParamInvalid, e.acl.Memcpy(uintptr(r), 16, ptr(src), 16, aclDeviceToDevice), "the kind lies about src")
	e.is(aclParamInvalid, e.acl.Memcpy(ptr(buf), 16, ptr(src), 16, 7), "no such kind")
	e.ok(e.acl.Memcpy(ptr(buf), 16, ptr(src), 16, aclHostToHost))
	require.Equal(t, src, buf)
	e.ok(e.acl.Memcpy(uintptr(r+64), 16, uintptr(r), 16, aclDeviceToDevice))
	got, _ = e.read(r+64, 16)
	require.Equal(t, data[:16], got)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(src)
	e.ok(e.acl.UnmapMem(r + g))
	e.ok(e.acl.FreePhysical(h2))
	e.unmapped(r, h)
	e.noLeaks()
}

func TestACLAsyncFailureIsTheStreamsAlone(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	// Two mappings: access is set a whole mapping at a time.
	r, h, h2 := e.reserve(2*g), e.malloc(0, g), e.malloc(0, g)
	e.ok(e.acl.MapMem(r, g, 0, h, 0), "read-write for device 0 at once")
	e.ok(e.acl.MapMem(r+g, g, 0, h2, 0))
	e.ok(e.setAccess(r+g, g, 0, accessNone))
	s := e.stream()
	p, buf := e.hostAlloc(int(g))
	copy(buf, pattern(int(g), 5))

	e.is(aclAddrUnaligned, e.acl.MemcpyAsync(uintptr(r+8), g, uintptr(p), 64, aclHostToDevice, s))
	e.is(aclAddrUnaligned, e.acl.MemcpyAsync(uintptr(r), g, uintptr(p)+8, 64, aclHostToDevice, s))
	e.is(aclAddrUnaligned, e.acl.MemsetAsync(uintptr(r+1), g, 0, 64, s))
	e.is(aclParamInvalid, e.acl.MemcpyAsync(uintptr(p), g, uintptr(r), 64, aclHostToDevice, s), "kind")
	e.is(aclParamInvalid, e.acl.MemsetAsync(uintptr(p), g, 0, 64, s), "a fill of host memory")

	// The copy into the inaccessible granule fails when it runs: reported
	// once, the work after it skipped until then, the context untouched.
	e.ok(e.acl.MemcpyAsync(uintptr(r+g), g, uintptr(p), g, aclHostToDevice, s))
	e.ok(e.acl.MemsetAsync(uintptr(r), g, 0xab, 64, s))
	e.is(aclSysDMA, e.acl.SyncStream(s))
	got, _ := e.read(r, 64)
	require.Equal(t, make([]byte, 64), got, "the fill after the failure was skipped")
	e.ok(e.acl.SyncStream(s), "taken")
	var x uint64
	e.ok(e.acl.Reserve(&x, g, 0, 0, 0), "no sticky fault: the context works")
	e.ok(e.acl.Release(x))
	e.ok(e.acl.MemsetAsync(uintptr(r), g, 0x1ab, 64, s), "value's low byte")
	e.ok(e.acl.SyncStream(s))
	got, _ = e.read(r, 64)
	require.Equal(t, bytes.Repeat([]byte{0xab}, 64), got)

	// An event recorded after the failure takes it; one recorded before
	// does not.
	var before, after uintptr
	e.ok(e.acl.CreateEvent(&before))
	e.ok(e.acl.CreateEvent(&after))
	e.ok(e.acl.RecordEvent(before, s))
	e.ok(e.acl.MemcpyAsync(uintptr(p), g, uintptr(r+g), g, aclDeviceToHost, s))
	e.ok(e.acl.RecordEvent(after, s))
	e.ok(e.acl.SyncEvent(before))
	e.is(aclSysDMA, e.acl.SyncEvent(after))
	e.ok(e.acl.SyncStream(s), "the event took the failure")
	require.Equal(t, pattern(int(g), 5), buf, "nothing moved")

	// Run-time injections, and the default (NULL) stream.
	e.lib.Fail("aclrtMemcpyAsync:exec", 1, 1, 507899)
	e.ok(e.acl.MemcpyAsync(uintptr(r), g, uintptr(p), g, aclHostToDevice, 0))
	e.is(507899, e.acl.SyncStream(0))
	e.ok(e.acl.SyncStream(0))
	e.lib.Fail("aclrtMemsetAsync:exec", 1, 1, 507899)
	e.ok(e.acl.MemsetAsync(uintptr(r), g, 0, 64, s))
	e.ok(e.acl.RecordEvent(after, s))
	e.is(507899, e.acl.SyncEvent(after), "an injected code travels through the event too")
	e.ok(e.acl.SyncStream(s))

	// A stream is used with its own context current.
	e.use(1)
	e.is(aclStreamContext, e.acl.MemsetAsync(uintptr(r), g, 0, 64, s))
	e.is(aclStreamContext, e.acl.SyncStream(s))
	e.is(aclStreamContext, e.acl.DestroyStream(s))
	e.use(0)
	e.ok(e.acl.DestroyStream(s))
	e.is(aclInvalidHandle, e.acl.SyncStream(s), "destroyed")
	e.is(aclInvalidHandle, e.acl.SyncStream(0xdead0), "never a stream")
	e.ok(e.acl.DestroyEvent(before))
	e.ok(e.acl.DestroyEvent(after))
	e.is(aclInvalidHandle, e.acl.SyncEvent(after))
	e.ok(e.acl.FreeHost(p))
	e.ok(e.acl.UnmapMem(r + g))
	e.ok(e.acl.FreePhysical(h2))
	e.unmapped(r, h)
	e.noLeaks()
}

func TestACLPeersAndHostMemory(t *testing.T) {
	e := startACL(t, Config{Devices: 3})
	var can int32
	e.ok(e.acl.CanAccessPeer(&can, 0, 2))
	require.Equal(t, int32(1), can)
	e.is(aclInvalidDeviceID, e.acl.CanAccessPeer(&can, 1, 1), "a device and itself")
	e.is(aclInvalidDeviceID, e.acl.CanAccessPeer(&can, 0, 3))
	e.ok(e.acl.EnablePeerAccess(1, 0))
	e.ok(e.acl.EnablePeerAccess(1, 0), "again: no error")
	e.is(aclInvalidDeviceID, e.acl.EnablePeerAccess(0, 0), "the current device itself")
	e.is(aclParamInvalid, e.acl.EnablePeerAccess(1, 1))
	n := startACL(t, Config{NoPeer: true})
	n.ok(n.acl.CanAccessPeer(&can, 0, 1))
	require.Zero(t, can)
	n.is(aclNotSupport, n.acl.EnablePeerAccess(1, 0))

	p, buf := e.hostAlloc(10000)
	require.Zero(t, uintptr(p)%64)
	copy(buf, pattern(len(buf), 1))
	var q unsafe.Pointer
	e.is(aclParamInvalid, e.acl.MallocHost(&q, 0))
	e.is(aclParamInvalid, e.acl.FreeHost(unsafe.Add(p, 64)))
	e.ok(e.acl.FreeHost(p))
	e.is(aclParamInvalid, e.acl.FreeHost(p), "freed already")
	e.noLeaks()
}

func TestACLNoVMMAndInjections(t *testing.T) {
	e := startACL(t, Config{NoVMM: true})
	var g, x uint64
	var h uintptr
	p := aclPropOn(0)
	e.is(aclNotSupport, e.acl.Granularity(&p, granMinimum, &g))
	e.is(aclNotSupport, e.acl.Reserve(&x, 2*mib, 0, 0, 0))
	e.is(aclNotSupport, e.acl.MallocPhysical(&h, 2*mib, &p, 0))
	e.is(aclNotSupport, e.acl.Import(1, 0, &h))

	f := startACL(t, Config{})
	calls := f.lib.Calls("aclrtMallocPhysical")
	f.lib.Fail("aclrtMallocPhysical", 1, 1, aclMemoryAlloc)
	f.is(aclMemoryAlloc, f.acl.MallocPhysical(&h, f.gran, &p, 0))
	require.Contains(t, f.recent(), "aclrtMallocPhysical: injected failure 207001")
	require.Zero(t, f.lib.Used(0), "an injected failure changes nothing")
	h = f.malloc(0, f.gran)
	require.Equal(t, calls+2, f.lib.Calls("aclrtMallocPhysical"), "injected calls are counted")
	f.lib.Fail("aclrtFreePhysical", 1, 0, 507899)
	f.is(507899, f.acl.FreePhysical(h))
	f.is(507899, f.acl.FreePhysical(h))
	f.lib.Clear()
	f.ok(f.acl.FreePhysical(h))
	f.noLeaks()
}

// TestACLTokens shares memory between two stand-in instances of this
// process, which the stand-in treats as two processes (each has books and
// tokens of its own; both have this process's ID). The parent and child
// processes of driver/acl's tests prove the same across processes.
func TestACLTokens(t *testing.T) {
	e := startACL(t, Config{MinGranularity: 64 * kib})
	o := startACL(t, Config{MinGranularity: 64 * kib})
	g := e.gran
	me := int32(os.Getpid())
	r, h := e.mapped(1, 2*g)
	e.ok(e.setAccess(r, 2*g, 0, accessRW))
	data := pattern(int(2*g), 7)
	e.ok(e.write(r, data))

	var tok, tok2 uint64
	e.is(aclParamInvalid, e.acl.Export(h, 2, 0, &tok), "handle type NONE only")
	e.is(aclParamInvalid, e.acl.Export(h, 0, 2, &tok), "flags 0 or 1")
	e.is(aclInvalidHandle, e.acl.Export(0xdead0, 0, 0, &tok))
	e.ok(e.acl.Export(h, 0, 0, &tok))
	require.NotZero(t, tok)
	e.is(aclParamInvalid, e.acl.Export(h, 0, 0, &tok2), "once per handle")
	require.Equal(t, int64(1), e.lib.Live("tokens"))
	require.Contains(t, unixSockets(t), tokenSocket(tok), "the token names a socket")

	var ih uintptr
	e.is(aclNotSupport, e.acl.Import(tok, 0, &ih), "an import in the exporting process")
	o.is(aclNoPermission, o.acl.Import(tok, 0, &ih), "not on the allow-list")
	require.Contains(t, o.recent(), "not on the allow-list")
	e.is(aclParamInvalid, e.acl.SetPids(tok, nil, 0))
	bad := []int32{0}
	e.is(aclParamInvalid, e.acl.SetPids(tok, &bad[0], 1))
	other := []int32{1}
	e.is(aclParamInvalid, o.acl.SetPids(tok, &other[0], 1), "a token this instance did not export")
	e.ok(e.acl.SetPids(tok, &other[0], 1))
	o.is(aclNoPermission, o.acl.Import(tok, 0, &ih), "still not on it")
	e.ok(e.acl.SetPids(tok, &me, 1))
	o.is(aclInvalidDeviceID, o.acl.Import(tok, 7, &ih))
	o.ok(o.acl.Import(tok, 0, &ih))
	var ih2 uintptr
	o.is(aclParamInvalid, o.acl.Import(tok, 0, &ih2), "one handle per token per process")
	o.is(aclParamInvalid, o.acl.Import(tok^0x5a5a, 0, &ih2), "nobody exports that")
	o.is(aclParamInvalid, o.acl.Export(ih, 0, 0, &tok2), "an imported handle is not exported again")
	require.Equal(t, uint64(2*g), o.lib.Used(1), "counted on the exporter's device")

	or := o.reserve(4 * g)
	o.is(aclParamInvalid, o.acl.MapMem(or, g, 0, ih, 0), "the import maps whole too")
	o.ok(o.acl.MapMem(or, 2*g, 0, ih, 0))
	// One reservation never binds imported and local memory at once
	// (Huawei's reference for aclrtMapMem).
	local := o.malloc(0, 2*g)
	o.is(aclParamInvalid, o.acl.MapNoAccess(or+2*g, 2*g, 0, local, 0), "local memory beside imported")
	require.Contains(t, o.recent(), "holds imported memory")
	require.Equal(t, int64(1), o.lib.Live("mappings"), "refused: nothing mapped")
	o.ok(o.acl.FreePhysical(local))
	o.ok(o.setAccess(or, 2*g, 0, accessRW))
	got, res := o.read(or, 2*g)
	o.ok(res)
	require.Equal(t, data, got, "one memory")

	// The exporter frees: the token ends, the importer keeps the memory.
	e.ok(e.acl.UnmapMem(r))
	e.ok(e.acl.FreePhysical(h))
	require.Zero(t, e.lib.Live("tokens"))
	require.NotContains(t, unixSockets(t), tokenSocket(tok), "the socket went with the handle")
	require.Zero(t, e.lib.Used(1))
	got, _ = o.read(or, 2*g)
	require.Equal(t, data, got, "the importer still reads it")
	o.ok(o.acl.UnmapMem(or))
	o.ok(o.acl.FreePhysical(ih))
	o.is(aclParamInvalid, o.acl.Import(tok, 0, &ih), "a revoked token is unknown")
	o.ok(o.acl.Release(or))
	e.ok(e.acl.Release(r))

	// Without PID validation any process imports.
	h = e.malloc(0, g)
	e.ok(e.acl.Export(h, 0, aclExportNoCheck, &tok))
	o.ok(o.acl.Import(tok, 1, &ih))
	o.ok(o.acl.FreePhysical(ih))
	e.ok(e.acl.FreePhysical(h))
	e.noLeaks()
	o.noLeaks()

	np := startACL(t, Config{NoPOSIXFD: true})
	h = np.malloc(0, np.gran)
	np.is(aclNotSupport, np.acl.Export(h, 0, 0, &tok), "noposix leaves sharing out")
	np.ok(np.acl.FreePhysical(h))
}

// tokenSocket is how /proc/net/unix shows the socket of token tok.
func tokenSocket(tok uint64) string {
	return fmt.Sprintf("@vmstandin:acl:%d:%016x", os.Getuid(), tok)
}

// unixSockets lists the Unix socket names /proc/net/unix shows.
func unixSockets(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	var names []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 8 {
			names = append(names, f[7])
		}
	}
	return strings.Join(names, "\n")
}
