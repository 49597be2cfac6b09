//go:build ucx && linux && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

// vmx_ep_state is what an endpoint's error callback records: C memory,
// whose address is the callback's argument, so no Go pointer goes to C.
typedef struct {
	ucs_status_t status;
} vmx_ep_state;

static void vmx_ep_err(void *arg, ucp_ep_h ep, ucs_status_t status) {
	vmx_ep_state *s = arg;
	if (s->status == UCS_OK) {
		s->status = status;
	}
}

// vmx_init makes a context (RMA, wakeup) from the UCX_* environment and a
// single-threaded worker on it, and returns the worker's event fd. On
// failure *call names the UCP call that failed and nothing is left.
static ucs_status_t vmx_init(ucp_context_h *ctx, ucp_worker_h *w, int *efd, const char **call) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		*call = "ucp_config_read";
		return st;
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 0;
	st = ucp_init(&p, cfg, ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK) {
		*call = "ucp_init";
		return st;
	}
	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof wp);
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(*ctx, &wp, w);
	if (st != UCS_OK) {
		*call = "ucp_worker_create";
		ucp_cleanup(*ctx);
		return st;
	}
	st = ucp_worker_get_efd(*w, efd);
	if (st != UCS_OK) {
		*call = "ucp_worker_get_efd";
		ucp_worker_destroy(*w);
		ucp_cleanup(*ctx);
		return st;
	}
	return UCS_OK;
}

// vmx_sleep progresses w until it has nothing more to do, arms it, and
// unless an event came in meanwhile (UCS_ERR_BUSY: progress again) waits
// on its event fd for up to timeout_ms.
static ucs_status_t vmx_sleep(ucp_worker_h w, int efd, int timeout_ms) {
	while (ucp_worker_progress(w) != 0) {
	}
	ucs_status_t st = ucp_worker_arm(w);
	if (st == UCS_ERR_BUSY) {
		return UCS_OK;
	}
	if (st != UCS_OK) {
		return st;
	}
	struct pollfd pfd = {.fd = efd, .events = POLLIN};
	poll(&pfd, 1, timeout_ms);
	return UCS_OK;
}

// vmx_ptr_status is a request pointer's status: UCS_OK for NULL (done at
// once), the error it encodes, or UCS_INPROGRESS for a request.
static ucs_status_t vmx_ptr_status(ucs_status_ptr_t p) {
	if (p == NULL) {
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(p)) {
		return UCS_PTR_STATUS(p);
	}
	return UCS_INPROGRESS;
}

static ucs_status_t vmx_address(ucp_worker_h w, void **addr, size_t *n) {
	ucp_address_t *a;
	ucs_status_t st = ucp_worker_get_address(w, &a, n);
	*addr = a;
	return st;
}

static void vmx_release_address(ucp_worker_h w, void *addr) {
	ucp_worker_release_address(w, addr);
}

static ucs_status_t vmx_mem_map(ucp_context_h ctx, uintptr_t addr, size_t n, ucp_mem_h *memh) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = n;
	return ucp_mem_map(ctx, &p, memh);
}

static ucs_status_t vmx_mem_span(ucp_mem_h memh, uintptr_t *addr, size_t *n) {
	ucp_mem_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	ucs_status_t st = ucp_mem_query(memh, &a);
	*addr = (uintptr_t)a.address;
	*n = a.length;
	return st;
}

static ucs_status_t vmx_ep_create(ucp_worker_h w, const void *addr, vmx_ep_state *s, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = vmx_ep_err;
	p.err_handler.arg = s;
	return ucp_ep_create(w, &p, ep);
}

static ucs_status_ptr_t vmx_put(ucp_ep_h ep, uintptr_t local, size_t n, uint64_t remote, ucp_rkey_h rkey) {
	ucp_request_param_t p;
	p.op_attr_mask = 0;
	return ucp_put_nbx(ep, (const void *)local, n, remote, rkey, &p);
}

static ucs_status_ptr_t vmx_get(ucp_ep_h ep, uintptr_t local, size_t n, uint64_t remote, ucp_rkey_h rkey) {
	ucp_request_param_t p;
	p.op_attr_mask = 0;
	return ucp_get_nbx(ep, (void *)local, n, remote, rkey, &p);
}

static ucs_status_ptr_t vmx_flush(ucp_ep_h ep) {
	ucp_request_param_t p;
	p.op_attr_mask = 0;
	return ucp_ep_flush_nbx(ep, &p);
}

static ucs_status_ptr_t vmx_close(ucp_ep_h ep, int force) {
	ucp_request_param_t p;
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	return ucp_ep_close_nbx(ep, &p);
}
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Available is true: this build has the UCX binding.
const Available = true

// idleTimeout is the longest the worker goroutine sleeps in poll(2) with
// nothing in flight. Events (a peer's bytes on a socket, a signal from Go)
// wake it at once; the timeout only bounds what a lost wakeup could cost
// and lets UCX's own timers (keepalive) run, at a few wakeups a second.
const idleTimeout = 100 * time.Millisecond

// closeWait bounds each wait the worker goroutine makes inline while it
// closes an endpoint: for the endpoint's requests in flight, then for
// ucp_ep_close_nbx. A peer that does not answer within it is left behind
// (the endpoint is released by ucp_worker_destroy at the latest).
const closeWait = 2 * time.Second

// rkeyLimit bounds an endpoint's cache of unpacked remote keys: a peer
// that registers and drops memory all the time (a KV cache's pages) hands
// out a new key each time. When the cache is full and no op is in flight
// (an unpacked key must outlive the ops that use it) it is emptied.
const rkeyLimit = 256

// connectAttempts and connectWait bound Connect. UCX 1.13 resets about
// one connection in ten during wireup (seen in the transfer tests), which
// shows at the first flush, so Connect flushes each new endpoint and tries
// again when that fails.
const (
	connectAttempts = 5
	connectWait     = 5 * time.Second
)

// Worker is a UCP context and worker served by one goroutine locked to
// its OS thread.
//
// Lock order: mu is a leaf; the worker goroutine takes it only to take
// the calls queued. The fields after "The goroutine's" are touched only by
// the worker goroutine.
type Worker struct {
	// mu guards closed and calls; holding it while calling
	// ucp_worker_signal orders every signal before the worker's
	// destruction, which happens only after closed is set.
	mu     sync.Mutex
	closed bool
	calls  []func()
	// sig is the worker handle for ucp_worker_signal: set before serving
	// starts, never changed.
	sig C.ucp_worker_h
	// done is closed when the goroutine has destroyed the worker and
	// context and ended; closeErr is then the first error of that.
	done     chan struct{}
	closeErr error
	// retries counts the Connect attempts that failed and were tried
	// again (for tests and reports).
	retries atomic.Uint64

	// The goroutine's: the UCP handles, and what lives on them.
	ctx    C.ucp_context_h
	worker C.ucp_worker_h
	efd    C.int
	eps    map[*Endpoint]struct{}
	mems   map[*Mem]struct{}
	// states are error-callback records of endpoints whose close did not
	// complete: freed after ucp_worker_destroy, when no callback can run.
	states []*C.vmx_ep_state
}

// Mem is a registration (ucp_mem_map) of memory the caller mapped.
type Mem struct {
	w *Worker
	// The worker goroutine's: memh is nil once unmapped.
	memh C.ucp_mem_h
}

// Endpoint is a connection from a Worker to a peer worker.
type Endpoint struct {
	w *Worker
	// The worker goroutine's: ep is nil once closed.
	ep    C.ucp_ep_h
	state *C.vmx_ep_state // C memory the error callback writes
	// rkeys are the remote keys unpacked on ep, by their packed bytes; at
	// most rkeyLimit of them outlive a moment with no op in flight.
	rkeys     map[string]C.ucp_rkey_h
	rkeyLimit int
	// ops are the put and get requests in flight; err is the first error
	// of one since the last Flush answered.
	ops []C.ucs_status_ptr_t
	err error
	// flushes are the flushes in flight, in the order they were asked.
	flushes []*flush
}

// flush is one ucp_ep_flush_nbx request and who waits for it.
type flush struct {
	req C.ucs_status_ptr_t
	// done gets the answer once (buffered: an abandoned flush's answer is
	// dropped there).
	done chan error
	// abandoned is set when the waiter's context ended: the request was
	// cancelled and no longer counts as in flight, so the goroutine sleeps
	// instead of spinning on a flush that may never complete.
	abandoned bool
}

// ucsError is the error of UCP call call returning st.
func ucsError(call string, st C.ucs_status_t) error {
	var mark error
	switch st {
	case C.UCS_ERR_NO_DEVICE, C.UCS_ERR_UNSUPPORTED:
		mark = driver.ErrUnsupported
	case C.UCS_ERR_INVALID_PARAM, C.UCS_ERR_INVALID_ADDR:
		mark = driver.ErrInvalid
	case C.UCS_ERR_NO_MEMORY, C.UCS_ERR_NO_RESOURCE, C.UCS_ERR_EXCEEDS_LIMIT:
		mark = driver.ErrOutOfMemory
	default:
		mark = driver.ErrDeviceFault
	}
	err := errors.Wrapf(mark, "ucx: %s: %s (UCX status %d)", call, C.GoString(C.ucs_status_string(st)), int(st))
	if st == C.UCS_ERR_UNREACHABLE {
		// UCX says the same when no transport of UCX_TLS can carry an
		// endpoint to the peer (UCX 1.13's shared memory transports alone,
		// with peer error handling) and when the peer's worker is gone.
		err = errors.WithHint(err, "the peer's worker may be gone, or no transport in UCX_TLS reaches it (with UCX 1.13, shared memory needs tcp beside it: UCX_TLS=sm,tcp)")
	}
	return err
}

// unmade is the error of method called on a nil or zero value.
func unmade(method string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "ucx: %s on a nil or zero value", method),
		"make a Worker with NewWorker, and Mem and Endpoint values with its Register and Connect")
}

func (w *Worker) unmade() bool   { return w == nil || w.done == nil }
func (m *Mem) unmade() bool      { return m == nil || m.w.unmade() }
func (e *Endpoint) unmade() bool { return e == nil || e.w.unmade() }

// NewWorker makes a UCP context (RMA and wakeup features, configured by
// the UCX_* environment) and a worker on it, served by a new goroutine
// locked to its OS thread.
func NewWorker() (*Worker, error) {
	w := &Worker{
		done: make(chan struct{}),
		eps:  map[*Endpoint]struct{}{},
		mems: map[*Mem]struct{}{},
	}
	started := make(chan error, 1)
	go w.serve(started)
	if err := <-started; err != nil {
		<-w.done
		return nil, err
	}
	return w, nil
}

// serve is the worker goroutine: it makes the context and worker, runs
// the calls handed to it, progresses the worker, and at Close destroys
// everything.
func (w *Worker) serve(started chan<- error) {
	runtime.LockOSThread()
	// The goroutine ends locked, so its thread ends with it: nothing else
	// runs on a thread UCX may have kept state for.
	defer close(w.done)
	var call *C.char
	if st := C.vmx_init(&w.ctx, &w.worker, &w.efd, &call); st != C.UCS_OK {
		started <- ucsError(C.GoString(call), st)
		return
	}
	w.sig = w.worker
	started <- nil
	for {
		w.mu.Lock()
		calls, closing := w.calls, w.closed
		w.calls = nil
		w.mu.Unlock()
		for _, c := range calls {
			c()
		}
		if closing {
			// No call is queued after closed was set.
			w.closeErr = w.shutdown()
			return
		}
		if w.inFlight() {
			C.ucp_worker_progress(w.worker)
		} else if st := C.vmx_sleep(w.worker, w.efd, C.int(idleTimeout/time.Millisecond)); st != C.UCS_OK {
			// ucp_worker_arm failed: progress as if busy, after a pause, so
			// the worker still serves.
			time.Sleep(time.Millisecond)
		}
		w.reap()
	}
}

// run hands fn to the worker goroutine and returns its error.
func (w *Worker) run(what string, fn func() error) error {
	res := make(chan error, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return driver.Closed("ucx: " + what + " after the worker's Close")
	}
	w.calls = append(w.calls, func() { res <- fn() })
	C.ucp_worker_signal(w.sig)
	w.mu.Unlock()
	return <-res
}

// isClosed reports whether Close was called.
func (w *Worker) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// inFlight reports whether some request is outstanding that the goroutine
// must progress without sleeping.
func (w *Worker) inFlight() bool {
	for e := range w.eps {
		if len(e.ops) > 0 {
			return true
		}
		for _, f := range e.flushes {
			if !f.abandoned {
				return true
			}
		}
	}
	return false
}

// reap completes the requests that are done on every endpoint.
func (w *Worker) reap() {
	for e := range w.eps {
		e.reap()
	}
}

// reap frees e's completed requests, keeps the first error of its ops,
// and answers the flushes that are done.
func (e *Endpoint) reap() {
	kept := e.ops[:0]
	for _, r := range e.ops {
		st := C.ucp_request_check_status(unsafe.Pointer(r))
		if st == C.UCS_INPROGRESS {
			kept = append(kept, r)
			continue
		}
		C.ucp_request_free(unsafe.Pointer(r))
		if st != C.UCS_OK && e.err == nil {
			e.err = ucsError("ucp_put_nbx/ucp_get_nbx", st)
		}
	}
	clear(e.ops[len(kept):])
	e.ops = kept
	for len(e.flushes) > 0 {
		f := e.flushes[0]
		st := C.ucp_request_check_status(unsafe.Pointer(f.req))
		if st == C.UCS_INPROGRESS {
			break
		}
		C.ucp_request_free(unsafe.Pointer(f.req))
		e.flushes = e.flushes[1:]
		f.done <- e.answer(st)
	}
}

// answer is a completed flush's error: the first error of an op since the
// last flush answered, else the flush's own, else the endpoint's failure.
func (e *Endpoint) answer(st C.ucs_status_t) error {
	err := e.err
	e.err = nil
	switch {
	case err != nil:
		return err
	case st != C.UCS_OK:
		return ucsError("ucp_ep_flush_nbx", st)
	}
	return e.failed()
}

// failed is the endpoint's error when its peer failed (the error callback
// ran), else nil.
func (e *Endpoint) failed() error {
	if st := e.state.status; st != C.UCS_OK {
		return errors.WithHint(ucsError("the endpoint's peer", st), "the peer process or its connection failed: connect again")
	}
	return nil
}

// Address returns the worker's address, for a peer's Connect.
func (w *Worker) Address() ([]byte, error) {
	if w.unmade() {
		return nil, unmade("Worker.Address")
	}
	var b []byte
	err := w.run("Address", func() error {
		var addr unsafe.Pointer
		var n C.size_t
		if st := C.vmx_address(w.worker, &addr, &n); st != C.UCS_OK {
			return ucsError("ucp_worker_get_address", st)
		}
		b = C.GoBytes(addr, C.int(n))
		C.vmx_release_address(w.worker, addr)
		return nil
	})
	return b, err
}

// Register maps n bytes at addr for remote access (ucp_mem_map of
// existing memory). addr must be memory the caller mapped, not Go memory,
// and stay mapped until the Mem is closed.
func (w *Worker) Register(addr uintptr, n uint64) (*Mem, error) {
	if w.unmade() {
		return nil, unmade("Worker.Register")
	}
	if addr == 0 || n == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "ucx: Register: address %#x, %d bytes (both must be non-zero)", addr, n)
	}
	m := &Mem{w: w}
	err := w.run("Register", func() error {
		if st := C.vmx_mem_map(w.ctx, C.uintptr_t(addr), C.size_t(n), &m.memh); st != C.UCS_OK {
			return ucsError(fmt.Sprintf("ucp_mem_map of %d bytes at %#x", n, addr), st)
		}
		w.mems[m] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// RKey returns the registration's packed remote key (ucp_rkey_pack), for a
// peer's Put and Get.
func (m *Mem) RKey() ([]byte, error) {
	if m.unmade() {
		return nil, unmade("Mem.RKey")
	}
	var b []byte
	err := m.w.run("Mem.RKey", func() error {
		if m.memh == nil {
			return driver.Closed("ucx: Mem.RKey after the Mem's Close")
		}
		var buf unsafe.Pointer
		var n C.size_t
		if st := C.ucp_rkey_pack(m.w.ctx, m.memh, &buf, &n); st != C.UCS_OK {
			return ucsError("ucp_rkey_pack", st)
		}
		b = C.GoBytes(buf, C.int(n))
		C.ucp_rkey_buffer_release(buf)
		return nil
	})
	return b, err
}

// Span is the memory the registration covers as UCX made it
// (ucp_mem_query): UCX may round the address and length Register was
// given outward (UCX 1.13 aligns both to 16 bytes), and a remote key
// names this span, not Register's range.
func (m *Mem) Span() (addr uintptr, n uint64, err error) {
	if m.unmade() {
		return 0, 0, unmade("Mem.Span")
	}
	err = m.w.run("Mem.Span", func() error {
		if m.memh == nil {
			return driver.Closed("ucx: Mem.Span after the Mem's Close")
		}
		var a C.uintptr_t
		var l C.size_t
		if st := C.vmx_mem_span(m.memh, &a, &l); st != C.UCS_OK {
			return ucsError("ucp_mem_query", st)
		}
		addr, n = uintptr(a), uint64(l)
		return nil
	})
	return addr, n, err
}

// Close unmaps the registration (ucp_mem_unmap). Closing twice, or after
// the worker's Close, is nil.
func (m *Mem) Close() error {
	if m.unmade() {
		return unmade("Mem.Close")
	}
	err := m.w.run("Mem.Close", func() error { return m.w.unmap(m) })
	if err != nil && m.w.isClosed() && errors.Is(err, driver.ErrClosed) {
		return nil
	}
	return err
}

// unmap unmaps m unless it is already.
func (w *Worker) unmap(m *Mem) error {
	if m.memh == nil {
		return nil
	}
	st := C.ucp_mem_unmap(w.ctx, m.memh)
	m.memh = nil
	delete(w.mems, m)
	if st != C.UCS_OK {
		return ucsError("ucp_mem_unmap", st)
	}
	return nil
}

// Connect makes an endpoint to the worker whose Address is peer, with
// peer error handling (a failed peer fails the endpoint's requests instead
// of leaving them in flight), and flushes it so that a failed wireup shows
// here; it tries up to connectAttempts times when the wireup fails (UCX
// 1.13 resets a connection now and then), but answers at once when the
// peer does not answer within connectWait (Connect then takes up to
// connectWait plus twice closeWait).
func (w *Worker) Connect(peer []byte) (*Endpoint, error) {
	if w.unmade() {
		return nil, unmade("Worker.Connect")
	}
	if len(peer) == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "ucx: Connect: the peer's address is empty")
	}
	var last error
	for attempt := 1; attempt <= connectAttempts; attempt++ {
		e, err, wireup := w.connect(peer)
		if err == nil {
			return e, nil
		}
		// A wireup that failed is worth another try; an endpoint UCX
		// refused to create, or a peer that did not answer within
		// connectWait, is not.
		if !wireup || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		last = err
		if attempt < connectAttempts {
			w.retries.Add(1)
		}
	}
	return nil, errors.Wrapf(last, "ucx: Connect: %d attempts failed, the last", connectAttempts)
}

// connect is one attempt of Connect; wireup says whether an error is that
// of the first flush.
func (w *Worker) connect(peer []byte) (_ *Endpoint, _ error, wireup bool) {
	e := &Endpoint{w: w, rkeys: map[string]C.ucp_rkey_h{}, rkeyLimit: rkeyLimit}
	err := w.run("Connect", func() error {
		addr := C.CBytes(peer)
		defer C.free(addr)
		e.state = (*C.vmx_ep_state)(C.calloc(1, C.size_t(unsafe.Sizeof(C.vmx_ep_state{}))))
		if st := C.vmx_ep_create(w.worker, addr, e.state, &e.ep); st != C.UCS_OK {
			C.free(unsafe.Pointer(e.state))
			return ucsError("ucp_ep_create", st)
		}
		w.eps[e] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectWait)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		_ = e.Close()
		return nil, errors.Wrap(err, "ucx: Connect: the first flush (wireup)"), true
	}
	return e, nil, false
}

// rkey returns the endpoint's unpacked handle of key, unpacking it on
// first use.
func (e *Endpoint) rkey(key []byte) (C.ucp_rkey_h, error) {
	if h, ok := e.rkeys[string(key)]; ok {
		return h, nil
	}
	if len(e.rkeys) >= e.rkeyLimit && len(e.ops) == 0 {
		e.dropRKeys()
	}
	var h C.ucp_rkey_h
	if st := C.ucp_ep_rkey_unpack(e.ep, unsafe.Pointer(&key[0]), &h); st != C.UCS_OK {
		return nil, ucsError("ucp_ep_rkey_unpack", st)
	}
	e.rkeys[string(key)] = h
	return h, nil
}

// dropRKeys destroys every remote key unpacked on e.
func (e *Endpoint) dropRKeys() {
	for k, h := range e.rkeys {
		C.ucp_rkey_destroy(h)
		delete(e.rkeys, k)
	}
}

// Put submits a write of n bytes from local to the peer's remote address,
// in memory the peer registered with rkey (ucp_put_nbx). local must be
// memory the caller mapped, not Go memory, left alone until Flush answers.
// An error of the write itself shows at the next Flush.
func (e *Endpoint) Put(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return e.submit("Put", local, n, remote, rkey)
}

// Get submits a read of n bytes from the peer's remote address into local
// (ucp_get_nbx); the bytes are there once Flush answers nil. local must be
// memory the caller mapped, not Go memory.
func (e *Endpoint) Get(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return e.submit("Get", local, n, remote, rkey)
}

// submit is Put or Get.
func (e *Endpoint) submit(op string, local uintptr, n uint64, remote uint64, rkey []byte) error {
	if e.unmade() {
		return unmade("Endpoint." + op)
	}
	if local == 0 || n == 0 || len(rkey) == 0 {
		return errors.Wrapf(driver.ErrInvalid, "ucx: %s: local address %#x, %d bytes, a %d-byte remote key (all must be non-zero)",
			op, local, n, len(rkey))
	}
	if remote+n < remote {
		return errors.Wrapf(driver.ErrInvalid, "ucx: %s: %d bytes at remote address %#x wrap around", op, n, remote)
	}
	return e.w.run("Endpoint."+op, func() error {
		if e.ep == nil {
			return driver.Closed("ucx: Endpoint." + op + " after the endpoint's Close")
		}
		if err := e.failed(); err != nil {
			return err
		}
		h, err := e.rkey(rkey)
		if err != nil {
			return err
		}
		var req C.ucs_status_ptr_t
		call := "ucp_put_nbx"
		if op == "Put" {
			req = C.vmx_put(e.ep, C.uintptr_t(local), C.size_t(n), C.uint64_t(remote), h)
		} else {
			call = "ucp_get_nbx"
			req = C.vmx_get(e.ep, C.uintptr_t(local), C.size_t(n), C.uint64_t(remote), h)
		}
		switch st := C.vmx_ptr_status(req); st {
		case C.UCS_OK:
		case C.UCS_INPROGRESS:
			e.ops = append(e.ops, req)
		default:
			return ucsError(call, st)
		}
		return nil
	})
}

// Flush waits until every Put and Get submitted on e has completed at the
// remote (ucp_ep_flush_nbx) and returns the first error of one since the
// last Flush, or the endpoint's failure. When ctx ends first it cancels
// the flush and returns ctx's error, wrapped.
func (e *Endpoint) Flush(ctx context.Context) error {
	if e.unmade() {
		return unmade("Endpoint.Flush")
	}
	if ctx == nil {
		return errors.Wrapf(driver.ErrInvalid, "ucx: Endpoint.Flush: the context is nil")
	}
	if err := ctx.Err(); err != nil {
		return errors.Wrap(err, "ucx: Endpoint.Flush")
	}
	var f *flush
	err := e.w.run("Endpoint.Flush", func() error {
		if e.ep == nil {
			return driver.Closed("ucx: Endpoint.Flush after the endpoint's Close")
		}
		if err := e.failed(); err != nil {
			return err
		}
		req := C.vmx_flush(e.ep)
		switch st := C.vmx_ptr_status(req); st {
		case C.UCS_INPROGRESS:
			f = &flush{req: req, done: make(chan error, 1)}
			e.flushes = append(e.flushes, f)
			return nil
		default:
			e.reap()
			return e.answer(st)
		}
	})
	if err != nil || f == nil {
		return err
	}
	select {
	case err := <-f.done:
		return err
	case <-ctx.Done():
	}
	_ = e.w.run("Endpoint.Flush's cancel", func() error {
		if e.ep != nil && !f.abandoned {
			f.abandoned = true
			C.ucp_request_cancel(e.w.worker, unsafe.Pointer(f.req))
		}
		return nil
	})
	select {
	case err := <-f.done: // it completed meanwhile
		return err
	default:
	}
	return errors.Wrap(ctx.Err(), "ucx: Endpoint.Flush")
}

// Close closes the endpoint: it waits up to closeWait for its requests in
// flight, closes it (ucp_ep_close_nbx, forced when its peer failed or a
// request outlived the wait, which cancels those), and destroys its remote
// keys. Closing twice, or after the worker's Close, is nil.
func (e *Endpoint) Close() error {
	if e.unmade() {
		return unmade("Endpoint.Close")
	}
	err := e.w.run("Endpoint.Close", func() error { return e.w.closeEndpoint(e) })
	if err != nil && e.w.isClosed() && errors.Is(err, driver.ErrClosed) {
		return nil
	}
	return err
}

// closeEndpoint is Endpoint.Close on the worker goroutine.
func (w *Worker) closeEndpoint(e *Endpoint) error {
	if e.ep == nil {
		return nil
	}
	deadline := time.Now().Add(closeWait)
	for (len(e.ops) > 0 || len(e.flushes) > 0) && e.state.status == C.UCS_OK && time.Now().Before(deadline) {
		C.ucp_worker_progress(w.worker)
		e.reap()
	}
	force := C.int(0)
	if e.state.status != C.UCS_OK || len(e.ops) > 0 || len(e.flushes) > 0 {
		// A failed peer, or one that left requests in flight past
		// closeWait: close without its confirmation, which completes every
		// request of the endpoint (UCS_ERR_CANCELED).
		force = 1
	}
	req := C.vmx_close(e.ep, force)
	e.ep = nil
	delete(w.eps, e)
	st := C.vmx_ptr_status(req)
	for st == C.UCS_INPROGRESS && time.Now().Before(deadline.Add(closeWait)) {
		C.ucp_worker_progress(w.worker)
		st = C.ucp_request_check_status(unsafe.Pointer(req))
	}
	// The requests still held are let go (ucp_request_free releases one
	// when it completes), and then the remote keys: ucp_rkey_destroy needs
	// the worker, not the endpoint, and no op in flight that uses the key.
	for _, r := range e.ops {
		C.ucp_request_free(unsafe.Pointer(r))
	}
	e.ops = nil
	for _, f := range e.flushes {
		C.ucp_request_free(unsafe.Pointer(f.req))
		f.done <- driver.Closed("ucx: Endpoint.Flush: the endpoint was closed")
	}
	e.flushes = nil
	e.dropRKeys()
	if C.vmx_ptr_status(req) == C.UCS_INPROGRESS { // a request, done or not
		C.ucp_request_free(unsafe.Pointer(req))
	}
	if st == C.UCS_INPROGRESS {
		// The close goes on without us: its callback may still write the
		// state, which is freed after the worker is destroyed.
		w.states = append(w.states, e.state)
		return nil
	}
	C.free(unsafe.Pointer(e.state))
	e.state = nil
	// A peer that failed (or reset the connection as it closed) is the
	// reason for a forced close, not an error of Close.
	if st != C.UCS_OK && force == 0 && st != C.UCS_ERR_CONNECTION_RESET && st != C.UCS_ERR_ENDPOINT_TIMEOUT {
		return ucsError("ucp_ep_close_nbx", st)
	}
	return nil
}

// Close closes every endpoint and registration, destroys the worker and
// the context, and ends the goroutine. Closing twice is nil.
func (w *Worker) Close() error {
	if w.unmade() {
		return unmade("Worker.Close")
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return nil
	}
	w.closed = true
	C.ucp_worker_signal(w.sig)
	w.mu.Unlock()
	<-w.done
	return w.closeErr
}

// shutdown is Close on the worker goroutine.
func (w *Worker) shutdown() error {
	var first error
	for e := range w.eps {
		if err := w.closeEndpoint(e); err != nil && first == nil {
			first = err
		}
	}
	for m := range w.mems {
		if err := w.unmap(m); err != nil && first == nil {
			first = err
		}
	}
	C.ucp_worker_destroy(w.worker)
	C.ucp_cleanup(w.ctx)
	for _, s := range w.states {
		C.free(unsafe.Pointer(s))
	}
	w.states = nil
	return first
}
