package vaspace_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/vaspace"
)

// A terabyte of address space costs no memory: Reserve holds it up front,
// Carve claims sub-ranges of it for the layers above, and Free gives it
// back. Sizes are multiples of the driver's granularity (2 MiB here).
func ExampleSpace_Reserve() {
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	space := vaspace.New(drv)

	res, err := space.Reserve(1<<40, 1<<30) // 1 TiB at a 1 GiB boundary, nothing committed
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Size()>>30, "GiB reserved")

	kv, err := res.Carve(64<<30, 1<<30) // 64 GiB, aligned to 1 GiB
	if err != nil {
		log.Fatal(err)
	}
	weights, err := res.Carve(16<<30, 0) // the lowest free range: right after
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(kv.Base == res.Base(), weights.Base == kv.End(), len(res.Carved()))

	_, err = res.Carve(1<<20, 0) // not a multiple of 2 MiB: never rounded up
	fmt.Println(errors.Is(err, driver.ErrMisaligned))

	if err := res.Free(); err != nil { // carved ranges go with it
		log.Fatal(err)
	}
	_, err = res.Carve(2<<20, 0)
	fmt.Println(errors.Is(err, driver.ErrClosed), res.Size()>>30, "GiB")

	if err := space.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 1024 GiB reserved
	// true true 2
	// true
	// true 1024 GiB
}
