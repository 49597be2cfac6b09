package transfer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/vaspace"
)

// Two engines, as two processes would have them (here one process): the
// owner registers a tensor and sends its descriptor; the peer gets the
// bytes into a registration of its own. Once the owner lets the memory
// go, the old descriptor is refused.
func Example() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	ctx := context.Background()
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	must(err)
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 64 << 20})
	must(err)
	src, err := tensor.OnArena(a, tensor.Uint8, 4096) // the owner's memory: an arena's
	must(err)
	dst, err := tensor.OnArena(a, tensor.Uint8, 4096) // the peer's
	must(err)
	must(src.Access(true, func(b []byte) error { copy(b, "keys and values"); return nil }))

	e, err := transfer.New(transfer.Config{Kind: "tcp"}) // or "ucx"; transfer.Kinds() says what this build has
	must(err)
	reg, err := e.Register(src) // a contiguous tensor over driver memory
	must(err)
	desc, err := reg.Descriptor() // address, length, id, generation, UCX remote key
	must(err)
	wire, err := desc.MarshalBinary() // sent to the peer, out of band, with e.Addr()
	must(err)

	pe, err := transfer.New(transfer.Config{}) // the peer's engine
	must(err)
	mine, err := pe.Register(dst)
	must(err)
	var remote transfer.Descriptor
	must(remote.UnmarshalBinary(wire))
	peer, err := pe.Connect(ctx, e.Addr())
	must(err)
	must(peer.Get(ctx, transfer.Op{Local: mine, Remote: remote, Len: remote.Len}))
	must(dst.Access(false, func(b []byte) error { fmt.Printf("%s\n", b[:15]); return nil }))

	must(src.Release()) // the owner lets the memory go: the registration is stale
	err = peer.Get(ctx, transfer.Op{Local: mine, Remote: remote, Len: remote.Len})
	fmt.Println(errors.Is(err, driver.ErrClosed))

	must(peer.Close())
	must(pe.Close()) // its registrations too
	must(e.Close())
	must(dst.Release())
	must(a.Close())
	must(drv.Close())
	// Output:
	// keys and values
	// true
}
