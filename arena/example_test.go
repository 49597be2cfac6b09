package arena_test

import (
	"fmt"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The allocator from the README: memory committed where an allocation
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
