package queue

import (
	"bytes"
	"runtime"
	"strconv"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// A host function runs on its stream's goroutine, and that stream finishes
// nothing until the host function returns. A call from a host function
// that waits for work ordered after it — its own stream, an event recorded
// behind it, a stream waiting on such an event, or a host function itself
// waiting for one of these — would never return. CUDA forbids every API
// call from a host function; the engine refuses the ones that would wait
// for their caller, at once, with ErrBusy (the stream is busy running the
// very function that asks, and no retry from there can succeed), and lets
// the others run: a wait for work that does not depend on the caller
// finishes.
//
// Calls are known to come from a host function by the goroutine that makes
// them (goid): only a stream's goroutine runs its operations. A host
// function that hands the call to a goroutine of its own and waits for it
// is not recognised.

// selfWaitHint is the hint of every refusal.
const selfWaitHint = "host functions must not call the stream API on their own stream; CUDA forbids API calls from host functions"

// goid returns the calling goroutine's id, read from the header that
// runtime.Stack writes ("goroutine 18 [running]:"); Go has no other way to
// it. It costs a short traceback, so the engine asks only when a call is
// about to wait while some stream runs a host function. 0 when the header
// cannot be read: then no call is recognised as a host function's, and the
// engine waits as it would without the check.
func goid() uint64 {
	var buf [64]byte
	b, ok := bytes.CutPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if !ok {
		return 0
	}
	if i := bytes.IndexByte(b, ' '); i > 0 {
		if id, err := strconv.ParseUint(string(b[:i]), 10, 64); err == nil {
			return id
		}
	}
	return 0
}

// callerLocked returns the stream whose host function is making the
// current call, or nil when the call does not come from one.
func (e *Engine) callerLocked() *stream {
	if e.hostRunning == 0 {
		return nil
	}
	return e.workers[goid()]
}

// waitLocked waits until done reports true; n is what it waits for. When
// the caller is a host function that n waits for, it returns the refusal
// at once instead. While a host function waits, its stream records n, so
// that a second host function closing a cycle through it is refused too.
func (e *Engine) waitLocked(what string, n need, done func() bool) error {
	if caller := e.callerLocked(); caller != nil {
		if e.waitsForLocked(caller, n) {
			return e.selfWaitErr(what, caller, n)
		}
		caller.blocked = &n
		defer func() { caller.blocked = nil }()
	}
	for !done() {
		e.cond.Wait()
	}
	return nil
}

// waitsForLocked reports whether n can be met only after caller's running
// operation returns: whether n reaches it through the operations n waits
// for — waits on points, and host functions blocked in a wait — however
// many streams that crosses.
func (e *Engine) waitsForLocked(caller *stream, n need) bool {
	return !e.closed && e.reachesLocked(caller, n, map[*stream]uint64{})
}

// reachesLocked walks n: seen holds, by stream, how many of its operations
// the walk has looked through already.
func (e *Engine) reachesLocked(caller *stream, n need, seen map[*stream]uint64) bool {
	st := n.st
	if st == nil || st.done >= n.pos {
		return false
	}
	if st == caller {
		return true // operation done+1, at or before n.pos, is the caller's
	}
	from := max(st.done, seen[st]) // operations up to from are looked through
	if from >= n.pos {
		return false
	}
	seen[st] = n.pos
	k := st.done + 1 // the number of the operation looked at
	if st.running {
		if k > from {
			if o := st.cur; o.wait != nil && !o.wait.done && e.reachesLocked(caller, need{o.wait.st, o.wait.pos}, seen) {
				return true
			}
			if st.blocked != nil && e.reachesLocked(caller, *st.blocked, seen) {
				return true
			}
		}
		k++
	}
	for _, o := range st.queue {
		if k > n.pos {
			break
		}
		if k > from && o.wait != nil && !o.wait.done && e.reachesLocked(caller, need{o.wait.st, o.wait.pos}, seen) {
			return true
		}
		k++
	}
	return false
}

// selfWaitErr is the refusal of a wait for n by caller's host function.
func (e *Engine) selfWaitErr(what string, caller *stream, n need) error {
	var err error
	if n.st == caller {
		err = errors.Wrapf(driver.ErrBusy, "%s: %s from a host function running on stream %d: it would wait for that stream, which finishes nothing until the host function returns",
			e.name, what, caller.id)
	} else {
		err = errors.Wrapf(driver.ErrBusy, "%s: %s from a host function running on stream %d: it would wait for stream %d, which is ordered after that host function (through events, or a host function waiting for it)",
			e.name, what, caller.id, n.st.id)
	}
	return errors.WithHint(err, selfWaitHint)
}
