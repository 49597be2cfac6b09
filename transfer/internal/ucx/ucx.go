// Package ucx is the binding to UCX (libucp) that transfer's "ucx" kind
// uses. This file is a placeholder so that package transfer compiles: the
// real binding (cgo, built with -tags ucx) is written on branch iss22-ucx
// and replaces this file at merge. Here nothing is available: every call
// answers driver.ErrUnsupported.
package ucx

import (
	"context"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Available is true only in a build with -tags ucx (cgo, libucx-dev).
const Available = false

func unsupported(what string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "ucx: %s: this build has no UCX", what),
		"build with -tags ucx (needs cgo and libucx-dev)")
}

// Worker is a UCP context and worker owned by one goroutine.
type Worker struct{}

// Mem is memory registered with a worker (ucp_mem_map).
type Mem struct{}

// Endpoint is a worker's connection to a peer worker.
type Endpoint struct{}

// NewWorker makes a worker; without UCX, ErrUnsupported.
func NewWorker() (*Worker, error) { return nil, unsupported("new worker") }

// Address is the worker's address, for a peer's Connect.
func (w *Worker) Address() ([]byte, error) { return nil, unsupported("worker address") }

// Register maps n bytes at addr (not Go heap memory) for remote access.
func (w *Worker) Register(addr uintptr, n uint64) (*Mem, error) {
	return nil, unsupported("register memory")
}

// RKey is the packed remote key of m.
func (m *Mem) RKey() ([]byte, error) { return nil, unsupported("rkey") }

// Close unmaps m.
func (m *Mem) Close() error { return unsupported("close memory") }

// Connect makes an endpoint to the worker at peer's address.
func (w *Worker) Connect(peer []byte) (*Endpoint, error) { return nil, unsupported("connect") }

// Put submits a write of n bytes at local to remote (under rkey).
func (e *Endpoint) Put(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return unsupported("put")
}

// Get submits a read of n bytes at remote (under rkey) into local.
func (e *Endpoint) Get(local uintptr, n uint64, remote uint64, rkey []byte) error {
	return unsupported("get")
}

// Flush waits for every op submitted on e to complete at the remote.
func (e *Endpoint) Flush(ctx context.Context) error { return unsupported("flush") }

// Close closes the endpoint.
func (e *Endpoint) Close() error { return unsupported("close endpoint") }

// Close closes the worker.
func (w *Worker) Close() error { return unsupported("close worker") }
