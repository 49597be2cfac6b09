package cuda

//go:generate go run ../internal/forward -docs forward.txt -out forward.go core=../internal/accel:Core

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
)

// Driver is the CUDA driver. It implements driver.Driver, driver.Streams
// and driver.Sharing; its methods are safe for concurrent use. It does
// not implement driver.HostMapper: device memory is not host memory, and
// bytes move with Read, Write and the stream copies.
type Driver struct {
	// core checks every call against the contract, keeps the record of
	// what was made and runs the streams; the CUDA calls are made through
	// it.
	core *accel.Core
	rt   *cu // the runtime under core, for SyncStreamHandle
	wait WaitMode
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Books   = (*Driver)(nil)
	_ driver.Streams = (*Driver)(nil)
	_ driver.Sharing = (*Driver)(nil)
)

// unmade reports whether d is nil or a zero Driver, not one Open made:
// every method then answers ErrInvalid instead of dereferencing nothing.
func (d *Driver) unmade() bool { return d == nil || d.core == nil }

func errUnmade(op string) error {
	return errors.Wrapf(driver.ErrInvalid, "cuda: %s: the driver was not made by cuda.Open (nil or zero Driver)", op)
}

// Name is "cuda".
func (d *Driver) Name() string { return "cuda" }

// Wait is how the driver waits for the work it enqueues on CUDA streams:
// Options.Wait, with WaitAuto resolved.
func (d *Driver) Wait() WaitMode {
	if d.unmade() {
		return WaitAuto
	}
	return d.wait
}

// tearDown closes d whatever is left mapped: for the conformance suite.
func (d *Driver) tearDown() error { return d.core.TearDown() }

// SyncStreamHandle waits for the work queued so far on stream, a CUDA
// stream this driver did not make: a CUstream, or the cudaStream_t PyTorch
// hands a pluggable allocator (the runtime's handle is the driver's). 0 is
// the default stream of GPU dev's primary context. It calls
// cuStreamQuery, then, if the stream is busy, cuStreamSynchronize, on the
// calling OS thread with dev's primary context current, leaving the
// caller's context as it was. It is what
// libvmarena's vmarena_free waits with before memory the stream's work
// may still use goes back (CUDA's cuMemUnmap and cuMemRelease do not wait
// for it, as cudaFree does). A failure of the stream's work is reported
// (and, as cuStreamSynchronize does, taken from the stream); an unknown
// dev is ErrNoDevice, a closed driver ErrClosed, a library without
// streams ErrUnsupported, each having waited for nothing.
func (d *Driver) SyncStreamHandle(dev driver.DeviceID, stream uintptr) error {
	if d.unmade() {
		return errUnmade("SyncStreamHandle")
	}
	what := fmt.Sprintf("cuda: synchronize stream %#x of device %d", stream, dev)
	if err := driver.CheckDevice(func() string { return what }, dev, len(d.rt.ordinal)); err != nil {
		return err
	}
	if d.core.Closed() {
		return errors.Wrapf(driver.ErrClosed, "%s", what)
	}
	if d.rt.l.cuStreamSynchronize == nil || d.rt.l.cuStreamQuery == nil {
		return errors.Wrapf(driver.ErrUnsupported, "%s: %s lacks cuStreamQuery or cuStreamSynchronize", what, d.rt.l.path)
	}
	// cuStreamQuery first: an idle stream (the usual case at a free) costs
	// no wait; a busy one (CUDA_ERROR_NOT_READY) is waited for.
	const notReady = 600
	busy := false
	err := d.rt.on(dev, "cuStreamQuery", func() cuResult {
		r := d.rt.l.cuStreamQuery(stream)
		if r == notReady {
			busy, r = true, 0
		}
		return r
	})
	if err == nil && busy {
		err = d.rt.on(dev, "cuStreamSynchronize", func() cuResult { return d.rt.l.cuStreamSynchronize(stream) })
	}
	return errors.Wrapf(err, "%s", what)
}
