package arena_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The allocator of docs/arena.md: memory committed where an allocation
// lies, kept after Free for the next Alloc, and given back by Trim from
// wherever it lies.
func ExampleAllocator() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	drv, err := host.New(host.Options{Capacity: 256 << 20})
	must(err)
	space, mem := vaspace.New(drv), physical.New(drv)
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Device: 0, Max: 80 << 30})
	must(err)

	p, err := al.Alloc(64<<20, 0) // 64 MiB, committed where it lies (and one 2 MiB chunk ahead)
	must(err)
	must(al.Free(p)) // the memory stays for the next Alloc...
	fmt.Println(al.Stats().Committed>>20, "MiB committed")
	must(al.Trim())  // ...until given back, wherever it lies
	st := al.Stats() // committed, map/unmap events, decommits, stitches, OOM retries
	fmt.Println(st.Committed>>20, "MiB committed,", st.Decommits, "decommit")

	must(al.Close())
	must(drv.Close())
	// Output:
	// 66 MiB committed
	// 0 MiB committed, 1 decommit
}

// An arena grows in place: its base never moves, growing commits only the
// new chunks, and views handed out stay valid. A live view pins its bytes:
// the arena refuses to shrink under it.
func ExampleArena_Grow() {
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 1 << 30}) // 1 GiB reserved
	if err != nil {
		log.Fatal(err)
	}
	base := a.Base()
	v, err := a.Append(5, 0) // grows by 5 bytes: one 2 MiB chunk committed
	if err != nil {
		log.Fatal(err)
	}
	b, err := v.Bytes() // device 0's memory, no copy
	if err != nil {
		log.Fatal(err)
	}
	copy(b, "hello")

	if err := a.Grow(8 << 20); err != nil { // four more chunks, after the first
		log.Fatal(err)
	}
	fmt.Println(a.Base() == base, a.Len()-5 == 8<<20, a.Committed()>>20, "MiB committed")
	fmt.Println(string(b)) // the view's bytes, where they were

	err = a.Resize(0) // the view still covers [0, 5)
	fmt.Println(errors.Is(err, driver.ErrBusy))
	if err := v.Release(); err != nil {
		log.Fatal(err)
	}
	if err := a.Resize(0); err != nil {
		log.Fatal(err)
	}
	if err := a.Trim(); err != nil { // the chunks past Len go back to the device
		log.Fatal(err)
	}
	fmt.Println(a.Len(), a.Committed()>>20, "MiB committed")

	if err := a.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// true true 10 MiB committed
	// hello
	// true
	// 0 0 MiB committed
}
