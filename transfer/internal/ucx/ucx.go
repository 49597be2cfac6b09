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

// vmx_init makes a context (active messages, wakeup, and RMA when rma is
// set) from the UCX_* environment and a single-threaded worker on it, and
// returns the worker's event fd. On failure *call names the UCP call that
// failed and nothing is left.
static ucs_status_t vmx_init(ucp_context_h *ctx, ucp_worker_h *w, int *efd, int rma, const char **call) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		*call = "ucp_config_read";
		return st;
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0);
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

// Active messages: the ids of the three this binding sends (amWrite,
// amFetch and amData in message.go, which says what they carry), each
// with a header of VMX_AM_HDR bytes (amHeaderSize).
enum {
	VMX_AM_WRITE = 1,
	VMX_AM_FETCH = 2,
	VMX_AM_DATA  = 3,
	VMX_AM_HDR   = 40
};

// vmxAMRecv (Go, ucx_am.go) takes every active message the worker
// receives, on the worker's thread, inside ucp_worker_progress.
extern void vmxAMRecv(uintptr_t w, unsigned int id, void *hdr, size_t hlen, void *data, size_t n, ucp_ep_h reply);

static ucs_status_t vmx_am_recv(unsigned int id, void *arg, const void *hdr, size_t hlen, void *data, size_t n,
                                const ucp_am_recv_param_t *p) {
	if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		// This binding sends eager messages only: a rendezvous is not
		// ours, and its data is never fetched.
		return UCS_OK;
	}
	ucp_ep_h reply = (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? p->reply_ep : NULL;
	vmxAMRecv((uintptr_t)arg, id, (void *)hdr, hlen, data, n, reply);
	return UCS_OK; // the data is copied: UCX may release it
}

static ucs_status_t vmx_am_write(void *arg, const void *h, size_t hl, void *d, size_t n, const ucp_am_recv_param_t *p) {
	return vmx_am_recv(VMX_AM_WRITE, arg, h, hl, d, n, p);
}

static ucs_status_t vmx_am_fetch(void *arg, const void *h, size_t hl, void *d, size_t n, const ucp_am_recv_param_t *p) {
	return vmx_am_recv(VMX_AM_FETCH, arg, h, hl, d, n, p);
}

static ucs_status_t vmx_am_data(void *arg, const void *h, size_t hl, void *d, size_t n, const ucp_am_recv_param_t *p) {
	return vmx_am_recv(VMX_AM_DATA, arg, h, hl, d, n, p);
}

// vmx_set_am sets the worker's handlers of the three ids, each called
// with arg and with the whole message.
static ucs_status_t vmx_set_am(ucp_worker_h w, uintptr_t arg) {
	ucp_am_recv_callback_t cbs[3] = {vmx_am_write, vmx_am_fetch, vmx_am_data};
	for (unsigned int i = 0; i < 3; i++) {
		ucp_am_handler_param_t p;
		memset(&p, 0, sizeof p);
		p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
		               UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
		p.id = VMX_AM_WRITE + i;
		p.flags = UCP_AM_FLAG_WHOLE_MSG;
		p.cb = cbs[i];
		p.arg = (void *)arg;
		ucs_status_t st = ucp_worker_set_am_recv_handler(w, &p);
		if (st != UCS_OK) {
			return st;
		}
	}
	return UCS_OK;
}

// vmx_am_send sends an eager active message (never rendezvous: its
// receiver fetches nothing), with the reply endpoint when reply is set.
// hdr and data must stay until the request completes.
static ucs_status_ptr_t vmx_am_send(ucp_ep_h ep, unsigned int id, const void *hdr, uintptr_t data, size_t n, int reply) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
	return ucp_am_send_nbx(ep, id, hdr, VMX_AM_HDR, (const void *)data, n, &p);
}

// vmx_copy_in and vmx_copy_out copy between a message and memory the
// caller mapped, named by its address as a number.
static void vmx_copy_in(uintptr_t dst, const void *src, size_t n) {
	memcpy((void *)dst, src, n);
}

static void vmx_copy_out(void *dst, uintptr_t src, size_t n) {
	memcpy(dst, (const void *)src, n);
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
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

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
	// rma is NewWorker's: whether the context has UCX's RMA feature.
	rma bool

	// The goroutine's: the UCP handles, and what lives on them.
	ctx    C.ucp_context_h
	worker C.ucp_worker_h
	efd    C.int
	eps    map[*Endpoint]struct{}
	mems   map[*Mem]struct{}
	// states are error-callback records of endpoints whose close did not
	// complete: freed after ucp_worker_destroy, when no callback can run.
	states []*C.vmx_ep_state
	// handle names the worker to the active-message callback (its arg):
	// an integer, not a Go pointer; deleted after ucp_worker_destroy.
	handle cgo.Handle
	// windows are the open windows by token; replies are the sends of
	// fetched bytes in flight (on UCX's reply endpoints, not this
	// worker's Endpoints); leftovers are C buffers of sends whose
	// endpoint was closed while they were in flight, freed after
	// ucp_worker_destroy.
	windows   map[uint64]*Window
	replies   []sent
	leftovers []unsafe.Pointer
	// dropped counts the active messages dropped: for no open window, or
	// outside the one they name (read by Dropped from any goroutine).
	dropped atomic.Uint64
}

// sent is a request in flight and the C buffer (a header, and for a
// reply its bytes) it reads until it completes; buf is nil for RMA.
type sent struct {
	req C.ucs_status_ptr_t
	buf unsafe.Pointer
}

// Window is memory of this process that peers' active messages may write
// (Endpoint.Send, and the answers of Endpoint.Fetch) or fetch from, named
// to them by its token, until Close. The worker checks every message
// against it: bytes go only inside the window, and a message for a
// closed or unknown token is dropped.
type Window struct {
	w        *Worker
	token    uint64
	addr     uintptr
	n        uint64
	writable bool
	// done is closed once the window is full (every byte written, or
	// handed to UCX for a fetch), failed, or closed; err is then its
	// error, set before.
	done chan struct{}
	err  error
	// The worker goroutine's.
	got           uint64
	ended, closed bool
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
	ops []sent
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

// NewWorker makes a UCP context (active messages, wakeup and, when rma is
// set, RMA: configured by the UCX_* environment) and a worker on it,
// served by a new goroutine locked to its OS thread. Without RMA the
// worker neither puts nor gets (ErrUnsupported) nor serves a peer's: UCX
// installs no handler of the messages that emulate them where the
// transport has no RDMA (tcp), and drops them with a warning, so a peer
// writes this process's memory only through its open windows.
func NewWorker(rma bool) (*Worker, error) {
	w := &Worker{
		rma:     rma,
		done:    make(chan struct{}),
		eps:     map[*Endpoint]struct{}{},
		mems:    map[*Mem]struct{}{},
		windows: map[uint64]*Window{},
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
	rma := C.int(0)
	if w.rma {
		rma = 1
	}
	if st := C.vmx_init(&w.ctx, &w.worker, &w.efd, rma, &call); st != C.UCS_OK {
		started <- ucsError(C.GoString(call), st)
		return
	}
	w.handle = cgo.NewHandle(w)
	if st := C.vmx_set_am(w.worker, C.uintptr_t(w.handle)); st != C.UCS_OK {
		C.ucp_worker_destroy(w.worker)
		C.ucp_cleanup(w.ctx)
		w.handle.Delete()
		started <- ucsError("ucp_worker_set_am_recv_handler", st)
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
	if len(w.replies) > 0 {
		return true
	}
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
	w.replies = reapSent(w.replies, nil)
}

// reapSent frees the completed requests of reqs and their buffers, and
// returns those still in flight; the first error of one is kept in *err
// (when err is not nil and *err is nil).
func reapSent(reqs []sent, err *error) []sent {
	kept := reqs[:0]
	for _, r := range reqs {
		st := C.ucp_request_check_status(unsafe.Pointer(r.req))
		if st == C.UCS_INPROGRESS {
			kept = append(kept, r)
			continue
		}
		C.ucp_request_free(unsafe.Pointer(r.req))
		C.free(r.buf) // nil for RMA: free(NULL) does nothing
		if st != C.UCS_OK && err != nil && *err == nil {
			*err = ucsError("a put, get or send of the endpoint", st)
		}
	}
	clear(reqs[len(kept):])
	return kept
}

// reap frees e's completed requests, keeps the first error of its ops,
// and answers the flushes that are done.
func (e *Endpoint) reap() {
	e.ops = reapSent(e.ops, &e.err)
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
	if !e.w.rma {
		return errors.Wrapf(driver.ErrUnsupported, "ucx: %s: the worker was made without RMA (NewWorker(false)): use Send and Fetch", op)
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
			e.ops = append(e.ops, sent{req: req})
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
		C.ucp_request_free(unsafe.Pointer(r.req))
		if r.buf != nil {
			// UCX may still read it: freed after the worker is destroyed.
			w.leftovers = append(w.leftovers, r.buf)
		}
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
	for _, x := range w.windows {
		x.end(driver.Closed("ucx: Window: the worker was closed"))
		x.closed = true
	}
	clear(w.windows)
	C.ucp_worker_destroy(w.worker)
	C.ucp_cleanup(w.ctx)
	w.handle.Delete()
	for _, s := range w.states {
		C.free(unsafe.Pointer(s))
	}
	w.states = nil
	// The worker's requests went with it: their buffers are free now.
	for _, r := range w.replies {
		C.free(r.buf)
	}
	w.replies = nil
	for _, b := range w.leftovers {
		C.free(b)
	}
	w.leftovers = nil
	return first
}

// The C side's message ids and header size are message.go's (an index
// out of range, at compile time, if not).
var _ = [1]struct{}{}[(C.VMX_AM_WRITE^amWrite)|(C.VMX_AM_FETCH^amFetch)|(C.VMX_AM_DATA^amData)|(C.VMX_AM_HDR^amHeaderSize)]

// amChunk bounds the bytes of one active message: Send and a fetch's
// answer split larger ranges, so that what UCX assembles for one message
// on the receiving side stays this small.
const amChunk = 256 << 10

// Open makes a window over n bytes at addr, memory the caller mapped (not
// Go memory) and keeps mapped until the window is closed: peers may write
// into it (writable) or fetch from it, at the token it answers, until
// Close. A window is full once its n bytes were written, or handed to UCX
// for fetches (copied: the memory is not read after that).
func (w *Worker) Open(addr uintptr, n uint64, writable bool) (*Window, uint64, error) {
	if w.unmade() {
		return nil, 0, unmade("Worker.Open")
	}
	if addr == 0 || n == 0 || uint64(addr)+n < uint64(addr) {
		return nil, 0, errors.Wrapf(driver.ErrInvalid, "ucx: Open: address %#x, %d bytes (both non-zero, no wrap)", addr, n)
	}
	x := &Window{w: w, addr: addr, n: n, writable: writable, done: make(chan struct{})}
	err := w.run("Open", func() error {
		var b [8]byte
		for x.token == 0 || w.windows[x.token] != nil {
			_, _ = rand.Read(b[:]) // never fails (crypto/rand)
			x.token = binary.LittleEndian.Uint64(b[:])
		}
		w.windows[x.token] = x
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return x, x.token, nil
}

func (x *Window) unmade() bool { return x == nil || x.w.unmade() }

// Wait waits until the window is full and answers nil, or answers the
// reason it never will be: a message for it outside its bytes, more bytes
// than it holds, its Close, or ctx's end (wrapped).
func (x *Window) Wait(ctx context.Context) error {
	if x.unmade() {
		return unmade("Window.Wait")
	}
	if ctx == nil {
		return errors.Wrapf(driver.ErrInvalid, "ucx: Window.Wait: the context is nil")
	}
	select {
	case <-x.done:
		return x.err
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "ucx: Window.Wait")
	}
}

// Close closes the window: messages for it are dropped from then on, and
// its memory is not touched again. Closing twice, or after the worker's
// Close, is nil.
func (x *Window) Close() error {
	if x.unmade() {
		return unmade("Window.Close")
	}
	err := x.w.run("Window.Close", func() error {
		if !x.closed {
			x.closed = true
			delete(x.w.windows, x.token)
			x.end(driver.Closed("ucx: Window: it was closed before it was full"))
		}
		return nil
	})
	if err != nil && x.w.isClosed() && errors.Is(err, driver.ErrClosed) {
		return nil
	}
	return err
}

// end answers the window's waiters with err (nil: full), once.
func (x *Window) end(err error) {
	if !x.ended {
		x.ended, x.err = true, err
		close(x.done)
	}
}

// count adds k bytes to what the window got, and ends it when full.
func (x *Window) count(k uint64) {
	x.got += k
	switch {
	case x.got > x.n:
		x.end(errors.Wrapf(driver.ErrDeviceFault, "ucx: Window: %d bytes came for a window of %d", x.got, x.n))
	case x.got == x.n:
		x.end(nil)
	}
}

// Dropped is the number of active messages the worker dropped so far:
// for a window that is not open, of the wrong direction, or outside the
// window's bytes.
func (w *Worker) Dropped() (uint64, error) {
	if w.unmade() {
		return 0, unmade("Worker.Dropped")
	}
	return w.dropped.Load(), nil
}

// Send submits a write of n bytes from local into the peer's window at
// off, as eager active messages of at most amChunk bytes each. local must
// be memory the caller mapped, not Go memory, left alone until Flush
// answers. The peer's worker checks each message against its window and
// drops what is outside it; an error of a send itself shows at the next
// Flush.
func (e *Endpoint) Send(window, off uint64, local uintptr, n uint64) error {
	if e.unmade() {
		return unmade("Endpoint.Send")
	}
	if window == 0 || local == 0 || n == 0 || off+n < off {
		return errors.Wrapf(driver.ErrInvalid, "ucx: Send: window %#x, local address %#x, %d bytes at %d (window, address and length non-zero, no wrap)",
			window, local, n, off)
	}
	return e.w.run("Endpoint.Send", func() error {
		if e.ep == nil {
			return driver.Closed("ucx: Endpoint.Send after the endpoint's Close")
		}
		if err := e.failed(); err != nil {
			return err
		}
		for done := uint64(0); done < n; {
			k := min(n-done, amChunk)
			if err := e.am(amWrite, amHeader{token: window, off: off + done}, local+uintptr(done), k, false); err != nil {
				return err
			}
			done += k
		}
		return nil
	})
}

// Fetch asks the peer for n bytes of its window at off, to be written
// into this worker's window into at intoOff: into fills (Window.Wait) as
// they come. The peer's worker checks the request against its window and
// drops one outside it.
func (e *Endpoint) Fetch(window, off, n, into, intoOff uint64) error {
	if e.unmade() {
		return unmade("Endpoint.Fetch")
	}
	if window == 0 || into == 0 || n == 0 || off+n < off || intoOff+n < intoOff {
		return errors.Wrapf(driver.ErrInvalid, "ucx: Fetch: %d bytes at %d of window %#x into %d of window %#x (windows and length non-zero, no wrap)",
			n, off, window, intoOff, into)
	}
	return e.w.run("Endpoint.Fetch", func() error {
		if e.ep == nil {
			return driver.Closed("ucx: Endpoint.Fetch after the endpoint's Close")
		}
		if err := e.failed(); err != nil {
			return err
		}
		return e.am(amFetch, amHeader{token: window, off: off, n: n, into: into, intoOff: intoOff}, 0, 0, true)
	})
}

// am sends one active message on e with header h (copied to C memory,
// kept until the send completes) and n bytes at data.
func (e *Endpoint) am(id int, h amHeader, data uintptr, n uint64, reply bool) error {
	buf := cHeader(h, 0)
	rep := C.int(0)
	if reply {
		rep = 1
	}
	st := keep(C.vmx_am_send(e.ep, C.uint(id), buf, C.uintptr_t(data), C.size_t(n), rep), buf, &e.ops)
	if st != C.UCS_OK {
		return ucsError("ucp_am_send_nbx", st)
	}
	return nil
}

// keep files the request of a send that reads buf: kept in *reqs with buf
// while in flight (UCS_OK), else buf is freed and the send's status
// answered (UCS_OK: it completed at once).
func keep(req C.ucs_status_ptr_t, buf unsafe.Pointer, reqs *[]sent) C.ucs_status_t {
	st := C.vmx_ptr_status(req)
	if st == C.UCS_INPROGRESS {
		*reqs = append(*reqs, sent{req: req, buf: buf})
		return C.UCS_OK
	}
	C.free(buf)
	return st
}

// received is an active message the worker got (vmxAMRecv), on the
// worker goroutine inside ucp_worker_progress: it is checked against the
// window it names, and its bytes copied into it (write, data) or a fetch
// answered from it on the reply endpoint. Anything else is dropped.
func (w *Worker) received(id C.uint, hdr unsafe.Pointer, hlen uintptr, data unsafe.Pointer, n uintptr, reply C.ucp_ep_h) {
	var x *Window
	look := func(token uint64) (windowView, bool) {
		if x = w.windows[token]; x == nil || x.ended {
			return windowView{}, false
		}
		return windowView{n: x.n, writable: x.writable}, true
	}
	v, h, k := admit(int(id), unsafe.Slice((*byte)(hdr), hlen), uint64(n), reply != nil, look)
	switch v {
	case dropped:
		w.dropped.Add(1)
		return
	case outside:
		w.dropped.Add(1)
		x.end(errors.Wrapf(driver.ErrInvalid, "ucx: Window: a message for bytes at %d outside a window of %d", h.off, x.n))
		return
	}
	src := uint64(x.addr) + h.off
	if id != amFetch {
		C.vmx_copy_in(C.uintptr_t(src), data, C.size_t(k))
		x.count(k)
		return
	}
	// A fetch: the bytes are copied out now (the window's memory is not
	// read after the message), and sent in chunks on the reply endpoint.
	for done := uint64(0); done < k; {
		c := min(k-done, amChunk)
		buf := cHeader(amHeader{token: h.into, off: h.intoOff + done}, c)
		bytes := unsafe.Add(buf, amHeaderSize)
		C.vmx_copy_out(bytes, C.uintptr_t(src+done), C.size_t(c))
		req := C.vmx_am_send(reply, amData, buf, C.uintptr_t(uintptr(bytes)), C.size_t(c), 0)
		if st := keep(req, buf, &w.replies); st != C.UCS_OK {
			// The peer's connection failed: the fetch never fills there.
			x.end(ucsError("ucp_am_send_nbx of fetched bytes", st))
			return
		}
		done += c
	}
	x.count(k)
}

// cHeader is C memory holding h encoded, and room for extra bytes after
// it; the caller frees it (keep does).
func cHeader(h amHeader, extra uint64) unsafe.Pointer {
	buf := C.malloc(C.size_t(amHeaderSize + extra))
	b := h.encode()
	C.memcpy(buf, unsafe.Pointer(&b[0]), amHeaderSize)
	return buf
}
