package transfer

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
)

// Staging says how an engine moves the bytes of device tensors (memory
// the process cannot address: tensor.Tensor.Addressable false): through
// one pinned host buffer of the driver, made at New and given back at
// Close, with copies on streams of one device.
type Staging struct {
	// Driver is the devices' driver; nil (the default) leaves the engine
	// without staging, and Register refuses device tensors
	// (ErrUnsupported).
	Driver driver.Driver
	// Device runs the copies: a tensor of another device needs peer
	// access from it, as every driver copy does.
	Device driver.DeviceID
	// Size is the pinned buffer's bytes, default 8 MiB: half for the
	// ops this engine issues, half for the ones it serves, each moved in
	// pieces of that half (rounded down to 64 bytes, at least 64).
	Size uint64
}

// DefaultStagingSize is Staging.Size when it is 0.
const DefaultStagingSize = 8 * units.MiB

// stagingAlign is the alignment of the halves (the drivers' async copies
// want 64 bytes on AscendCL).
const stagingAlign = 64

// staging is an engine's pinned buffer, in two halves with a stream
// each, so that an op this engine issues never waits for one it serves
// (an engine that puts to itself, or two engines putting to each
// other, would otherwise wait on each other's piece).
type staging struct {
	buf            *stream.HostBuffer
	issued, served stage
}

// stage is one half: a piece at a time, under mu.
type stage struct {
	mu lockrank.Mutex[lockrank.TransferStaging]
	b  []byte
	s  *stream.Stream
}

// newStaging makes cfg's staging buffer and streams; nil without a driver.
func newStaging(cfg Staging) (*staging, error) {
	if cfg.Driver == nil {
		return nil, nil
	}
	what := func() string {
		return fmt.Sprintf("transfer: staging of %s on %s device %d", units.Bytes(cfg.Size), cfg.Driver.Name(), cfg.Device)
	}
	if cfg.Size < 2*stagingAlign {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: at least %d bytes (two halves of %d)", what(), 2*stagingAlign, stagingAlign)
	}
	hb, err := stream.NewHostBuffer(cfg.Driver, cfg.Size)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	st := &staging{buf: hb}
	half := cfg.Size / 2 / stagingAlign * stagingAlign
	b := hb.Bytes()
	st.issued.b, st.served.b = b[:half:half], b[half:2*half:2*half]
	if st.issued.s, err = stream.New(cfg.Driver, cfg.Device); err == nil {
		if st.served.s, err = stream.New(cfg.Driver, cfg.Device); err != nil {
			err = errors.CombineErrors(err, st.issued.s.Destroy())
		}
	}
	if err != nil {
		return nil, errors.Wrapf(errors.CombineErrors(err, hb.Free()), "%s", what())
	}
	return st, nil
}

// close destroys the streams and gives the buffer back; no op runs.
func (st *staging) close() error {
	if st == nil {
		return nil
	}
	err := errors.CombineErrors(st.issued.s.Destroy(), st.served.s.Destroy())
	return errors.CombineErrors(err, st.buf.Free())
}

// move runs an op's bytes [off, off+n) of r's tensor through fn, in
// order, holding the tensor (tensor.Access, or AccessDevice for a device
// tensor) for the whole op, with before run first and after last under
// the same hold. write says the bytes arrive (fn fills them) or leave
// (fn sends them).
//
// For host memory fn is called once, with the bytes themselves. For a
// device tensor it is called per piece of st's half, under the half's
// lock: a leaving piece is copied device→host into the half (and the
// stream synced) before fn; an arriving one is filled by fn, then copied
// host→device and synced before the lock goes, so every byte is in the
// tensor when move returns. fn must not keep a piece past its return.
func (r *Registration) move(write bool, off, n uint64, st *stage, before func() error, fn func(b []byte) error, after func() error) error {
	if !r.enter() {
		return driver.Closed(fmt.Sprintf("transfer: registration %d is closed", r.id))
	}
	defer r.exit()
	called := false
	check := func(got uint64) error {
		called = true
		if got != r.n {
			return errors.AssertionFailedf("transfer: registration %d: the tensor has %d bytes, %d were registered", r.id, got, r.n)
		}
		return before()
	}
	var err error
	if !r.dev {
		err = r.t.Access(write, func(b []byte) error {
			if err := check(uint64(len(b))); err != nil {
				return err
			}
			if err := fn(b[off : off+n : off+n]); err != nil {
				return err
			}
			return after()
		})
	} else {
		err = r.t.AccessDevice(write, func(addr driver.Addr, got uint64) error {
			if err := check(got); err != nil {
				return err
			}
			for done := uint64(0); done < n; {
				k := min(n-done, uint64(len(st.b)))
				if err := st.piece(write, addr+driver.Addr(off+done), st.b[:k:k], fn); err != nil {
					return err
				}
				done += k
			}
			return after()
		})
	}
	if !called && errors.Is(err, driver.ErrClosed) {
		return errors.Wrapf(err, "transfer: registration %d is stale: its owner took the memory back", r.id)
	}
	return err
}

// piece moves one piece of a device op through the half: see move.
func (st *stage) piece(write bool, addr driver.Addr, b []byte, fn func(b []byte) error) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !write {
		if err := st.s.CopyDtoHSync(b, addr); err != nil {
			return stagingError{errors.Wrapf(err, "transfer: staging: copy %d bytes from the device at %#x", len(b), uint64(addr))}
		}
		return fn(b)
	}
	if err := fn(b); err != nil {
		return err
	}
	if err := st.s.CopyHtoDSync(addr, b); err != nil {
		return stagingError{errors.Wrapf(err, "transfer: staging: copy %d bytes to the device at %#x", len(b), uint64(addr))}
	}
	return nil
}

// stagingError is a failure of a staging copy (the driver's), as opposed
// to fn's: a served op answers it, after reading away what is left of a
// put's payload.
type stagingError struct{ error }

func (s stagingError) Unwrap() error { return s.error }

// stage is the engine's staging half for the ops it serves (served) or
// issues; nil without staging (no registration is then a device's).
func (e *Engine) stage(served bool) *stage {
	switch {
	case e.staging == nil:
		return nil
	case served:
		return &e.staging.served
	}
	return &e.staging.issued
}
