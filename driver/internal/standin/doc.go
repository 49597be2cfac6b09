// Package standin builds and opens a C stand-in of an accelerator driver
// library — NVIDIA's libcuda.so.1 and Huawei's libascendcl.so — so
// that the Go drivers that load those libraries at run time (driver/cuda,
// driver/acl) can be tested on a machine without the accelerator, through
// exactly the path they take on one: dlopen, symbol lookup, C calls with the
// real signatures, calling convention and result codes.
//
// The library is C compiled by the tests with the system compiler (no cgo;
// purego loads it in both CGO_ENABLED modes). Its sources are embedded here:
//
//	c/vdev.h, c/vdev.c  the emulated device, vendor-neutral: devices with a
//	                    capacity, reservations, physical allocations,
//	                    mappings with per-device access per granule,
//	                    shareable memfds, streams run by worker threads,
//	                    events, pinned host memory, fault injection, work
//	                    held on a stream the driver never made (Lib.Hold), call
//	                    and object counters
//	c/vshare.c          memory shared with other processes by a 64-bit
//	                    token with an allow-list of importers (AscendCL's
//	                    model), over abstract Unix sockets: see its comment
//	c/cuda.c            the CUDA front-end: the cu* symbols, CUDA's structs,
//	                    enums and result codes over the emulated device
//	c/acl.c             the AscendCL front-end: the acl* symbols, AscendCL's
//	                    structs, enums and error codes, explicit contexts,
//	                    tokens, and the strict readings where AscendCL's
//	                    documents are silent (listed at its top)
//
// # What it proves
//
// The emulated device enforces the rules of the real virtual memory APIs on
// host memory, with real system calls: device addresses are process
// addresses reserved with mmap, physical memory is memfd memory committed
// with fallocate, a mapping is mmap MAP_SHARED|MAP_FIXED, access is
// mprotect. Creating past capacity is out of memory and changes nothing;
// sizes, addresses and offsets are held to the granularity; a map never
// overwrites a mapping; memory goes when its handle is released and its last
// mapping is gone; a new mapping is inaccessible until access is set, per
// device and per granule, by calls that take whole mappings (cuMemSetAccess
// a run of adjacent ones, as on an H100; aclrtMemSetAccess exactly one) —
// per-granule grants come from mappings of one granule each —
// (AscendCL's aclrtMapMem excepted: its mapping is
// read-write for its device at once, aclrtMemMapNoAccess's is not); every
// copy a device makes is checked against that access before a byte moves,
// and an asynchronous violation is a sticky
// CUDA_ERROR_ILLEGAL_ADDRESS (AscendCL: ACL_ERROR_RT_SYS_DMA on the stream
// alone), never a segfault. A Go driver that passes its
// tests over the stand-in calls the right symbols with the right arguments in
// the right order, handles every error the real library reports for those
// rules, cleans up what it creates (Lib.Live counts what is left), and copes
// with failures injected at any call (Lib.Fail).
//
// # What it cannot prove
//
// It runs on host memory: timing, bandwidth and concurrency of the real
// device are not modelled (a stream is a thread, a copy is memmove), nor the
// real driver's undocumented behaviours, its limits (mapping counts, address
// space size), or anything a kernel launch would do. Where the real library's
// behaviour is not documented the stand-in picks the strict reading and says
// so in the C source; a difference found on real hardware is a fix there.
//
// # What it must never do
//
// It is for tests only, although it is an ordinary package so that the
// tests of other packages can import it. It never dlcloses a library it
// opened (stream worker threads may outlive a test, and the real libcuda is
// never unloaded either), and it never writes outside os.TempDir and the
// test's own temporary directory; the tokens it shares memory by are
// abstract sockets, which are no files at all.
package standin
