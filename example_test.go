package vmarena_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena"
)

// One import and one call: the host driver (this machine's memory, no
// GPU) with an allocator on its device 0, and one Close for all of it.
func Example() {
	m, err := vmarena.Open(vmarena.Options{Capacity: 256 * vmarena.MiB})
	if err != nil {
		log.Fatal(err)
	}
	al := m.Allocator()
	p, err := al.Alloc(64*vmarena.MiB, 0) // committed where it lies
	if err != nil {
		log.Fatal(err)
	}
	b, err := al.Bytes(p) // the host driver's memory, no copy
	if err != nil {
		log.Fatal(err)
	}
	copy(b, "hello")
	fmt.Println(string(b[:5]), vmarena.FormatSize(al.Stats().Committed), "committed")

	err = m.Close() // refused: the allocation is live, nothing is closed
	fmt.Println(errors.Is(err, vmarena.ErrBusy))
	if err := al.Free(p); err != nil {
		log.Fatal(err)
	}
	if err := m.Close(); err != nil { // the allocator, the address space, the memory, the driver
		log.Fatal(err)
	}

	n, err := vmarena.ParseSize("1.5GiB") // "80GB" is 80 × 10^9 bytes
	fmt.Println(n, err)
	// Output:
	// hello 66 MiB committed
	// true
	// 1610612736 <nil>
}
