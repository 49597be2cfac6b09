//go:build !(ucx && linux && cgo)

package ucx

import (
	"context"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Available is false: this build has no UCX binding (it needs -tags ucx,
// cgo, Linux and libucx-dev), and every call answers
// driver.ErrUnsupported.
const Available = false

// Worker stands for a UCP worker in a build without UCX: it has no value
// but the nil one.
type Worker struct{}

// Mem stands for a UCX registration in a build without UCX.
type Mem struct{}

// Endpoint stands for a UCP endpoint in a build without UCX.
type Endpoint struct{}

// Window stands for a window of active messages in a build without UCX.
type Window struct{}

// unsupported is the error of every call in a build without UCX.
func unsupported(call string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "ucx: %s: this build has no UCX", call),
		"build with -tags ucx, cgo enabled and libucx-dev installed (pkg-config ucx)")
}

// NewWorker answers driver.ErrUnsupported.
func NewWorker(rma bool) (*Worker, error) { return nil, unsupported("NewWorker") }

// Address answers driver.ErrUnsupported.
func (w *Worker) Address() ([]byte, error) { return nil, unsupported("Worker.Address") }

// Register answers driver.ErrUnsupported.
func (w *Worker) Register(addr uintptr, n uint64) (*Mem, error) {
	return nil, unsupported("Worker.Register")
}

// Connect answers driver.ErrUnsupported.
func (w *Worker) Connect(peer []byte) (*Endpoint, error) {
	return nil, unsupported("Worker.Connect")
}

// Close answers driver.ErrUnsupported.
func (w *Worker) Close() error { return unsupported("Worker.Close") }

// RKey answers driver.ErrUnsupported.
func (m *Mem) RKey() ([]byte, error) { return nil, unsupported("Mem.RKey") }

// Span answers driver.ErrUnsupported.
func (m *Mem) Span() (uintptr, uint64, error) { return 0, 0, unsupported("Mem.Span") }

// Close answers driver.ErrUnsupported.
func (m *Mem) Close() error { return unsupported("Mem.Close") }

// Put answers driver.ErrUnsupported.
func (e *Endpoint) Put(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return unsupported("Endpoint.Put")
}

// Get answers driver.ErrUnsupported.
func (e *Endpoint) Get(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return unsupported("Endpoint.Get")
}

// Flush answers driver.ErrUnsupported.
func (e *Endpoint) Flush(ctx context.Context) error { return unsupported("Endpoint.Flush") }

// Close answers driver.ErrUnsupported.
func (e *Endpoint) Close() error { return unsupported("Endpoint.Close") }

// Open answers driver.ErrUnsupported.
func (w *Worker) Open(addr uintptr, n uint64, writable bool) (*Window, uint64, error) {
	return nil, 0, unsupported("Worker.Open")
}

// Dropped answers driver.ErrUnsupported.
func (w *Worker) Dropped() (uint64, error) { return 0, unsupported("Worker.Dropped") }

// Wait answers driver.ErrUnsupported.
func (x *Window) Wait(ctx context.Context) error { return unsupported("Window.Wait") }

// Close answers driver.ErrUnsupported.
func (x *Window) Close() error { return unsupported("Window.Close") }

// Send answers driver.ErrUnsupported.
func (e *Endpoint) Send(window, off uint64, local uintptr, n uint64) error {
	return unsupported("Endpoint.Send")
}

// Fetch answers driver.ErrUnsupported.
func (e *Endpoint) Fetch(window, off, n, into, intoOff uint64) error {
	return unsupported("Endpoint.Fetch")
}
