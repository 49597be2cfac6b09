package vmarena_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/sleep"
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

// A sleep manager on the memory Open made: a tag's memory goes back to
// the device while it sleeps (its bytes kept in host memory) and returns
// at the same address; Usage reads each device's bytes from the driver's
// books.
func ExampleMemory_NewSleep() {
	m, err := vmarena.Open(vmarena.Options{Capacity: 256 * vmarena.MiB})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	sm, err := m.NewSleep(sleep.Options{Device: m.Device()})
	if err != nil {
		log.Fatal(err)
	}
	p, err := sm.Alloc("weights", 64*vmarena.MiB)
	if err != nil {
		log.Fatal(err)
	}
	used := func() string {
		u, err := m.Usage()
		if err != nil {
			log.Fatal(err)
		}
		return vmarena.FormatSize(u[0].Used) + " of " + vmarena.FormatSize(u[0].Capacity)
	}
	fmt.Println("awake:", used())
	if err := sm.Sleep(sleep.Host, "weights"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("asleep:", used())
	if err := sm.Wake("weights"); err != nil {
		log.Fatal(err)
	}
	if err := sm.Free(p); err != nil { // Close refuses while it is live
		log.Fatal(err)
	}
	// Output:
	// awake: 66 MiB of 256 MiB
	// asleep: 0 B of 256 MiB
}
