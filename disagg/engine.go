// This file joins disagg to the transfer engine (package transfer): a
// Ref is a registration's marshalled Descriptor.

package disagg

import (
	"context"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
)

// EngineExporter is the prefill side's half of the transfer engine e:
// Export registers the extent's tensor and hands out its Descriptor,
// marshalled, as the Ref; the release closes the registration.
func EngineExporter(e *transfer.Engine) Exporter { return engineExporter{e} }

// EngineFetcher is the decode side's half of the transfer engine e,
// connected to the prefill side's engine by p: Fetch registers each
// destination, issues one Get with an Op per extent, and closes the
// registrations. A ref whose length is not its destination's is refused
// (ErrInvalid) before anything moves.
func EngineFetcher(e *transfer.Engine, p *transfer.Peer) Fetcher { return engineFetcher{e, p} }

type engineExporter struct{ e *transfer.Engine }

func (x engineExporter) Export(t *tensor.Tensor) (Ref, func() error, error) {
	r, err := x.e.Register(t)
	if err != nil {
		return Ref{}, nil, errors.Wrap(err, "disagg: export an extent")
	}
	d, err := r.Descriptor()
	if err == nil {
		var b []byte
		if b, err = d.MarshalBinary(); err == nil {
			return Ref{Desc: b, Len: r.Len()}, r.Close, nil
		}
	}
	return Ref{}, nil, errors.CombineErrors(errors.Wrap(err, "disagg: export an extent"), r.Close())
}

type engineFetcher struct {
	e *transfer.Engine
	p *transfer.Peer
}

func (f engineFetcher) Fetch(ctx context.Context, dst []*tensor.Tensor, src []Ref) (err error) {
	if len(dst) != len(src) {
		return errors.Wrapf(driver.ErrInvalid, "disagg: fetch %d extents into %d destinations", len(src), len(dst))
	}
	ops := make([]transfer.Op, 0, len(dst))
	defer func() {
		for _, op := range ops {
			err = errors.CombineErrors(err, op.Local.Close())
		}
	}()
	for i := range dst {
		var d transfer.Descriptor
		if err := d.UnmarshalBinary(src[i].Desc); err != nil {
			return errors.Wrapf(err, "disagg: fetch extent %d", i)
		}
		r, err := f.e.Register(dst[i])
		if err != nil {
			return errors.Wrapf(err, "disagg: fetch extent %d", i)
		}
		ops = append(ops, transfer.Op{Local: r, Remote: d, Len: src[i].Len})
		if n := r.Len(); src[i].Len != n {
			// A shorter ref would leave the rest of the destination as it
			// was, a longer one is refused by the engine: both before any
			// byte moves.
			return errors.Wrapf(driver.ErrInvalid, "disagg: fetch extent %d: the ref says %d bytes, its destination has %d", i, src[i].Len, n)
		}
	}
	return f.p.Get(ctx, ops...)
}
