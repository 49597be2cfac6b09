package dl

import (
	"sync"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Once loads each library path once per process, without a lock held
// while it loads: loading runs vendor code (dlopen, the library's
// constructors) that may block for as long as it likes — a path on a hung
// file system, a soname the loader finds as a FIFO — and a lock held
// across it would make every later load in the process wait too. A load
// runs on a goroutine of its own; every caller for the path, the first
// included, waits for it at most the wait it passes and is then refused
// with driver.ErrBusy, while the load goes on and later callers get its
// result if it ever ends. Loads of other paths never wait for it. The
// zero Once is ready to use.
type Once[T any] struct {
	// mu guards loads; nothing blocks under it.
	mu    sync.Mutex
	loads map[string]*pending[T]
}

// pending is one path's load: val and err are set before done is closed.
type pending[T any] struct {
	done  chan struct{}
	start time.Time
	val   T
	err   error
}

// Load returns load's result for path, running load the first time the
// path is asked for; a load that panics is an error, kept like any other
// result. If the load has not finished after wait, Load returns ErrBusy
// naming the path and how long its load has run.
func (o *Once[T]) Load(path string, wait time.Duration, load func() (T, error)) (T, error) {
	o.mu.Lock()
	if o.loads == nil {
		o.loads = map[string]*pending[T]{}
	}
	p, ok := o.loads[path]
	if !ok {
		p = &pending[T]{done: make(chan struct{}), start: time.Now()}
		o.loads[path] = p
		go func() {
			defer close(p.done)
			defer func() {
				if r := recover(); r != nil {
					p.err = errors.AssertionFailedf("loading %s panicked: %v", path, r)
				}
			}()
			p.val, p.err = load()
		}()
	}
	o.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.val, p.err
	case <-timer.C:
		var zero T
		return zero, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "loading %s has not finished after %v", path, time.Since(p.start).Round(time.Millisecond)),
			"the loader is blocked on the library (a FIFO, a hung file system?); later opens of other libraries are not held up")
	}
}
