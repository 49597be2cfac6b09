package physical_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
)

// Creating a chunk commits its memory on the device at once, so running out
// is an error at Create, never a fault later; a size that is not a multiple
// of the device's granularity is refused, not rounded up. Usage counts what
// each device holds, and Release gives it back.
func ExampleMemory_Create() {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	mem := physical.New(drv)

	c, err := mem.Create(1, 6<<20, driver.ChunkOptions{}) // 6 MiB on device 1
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Size()>>20, "MiB on device", c.Device())

	_, err = mem.Create(1, 4<<20, driver.ChunkOptions{}) // 2 MiB are left
	fmt.Println(errors.Is(err, driver.ErrOutOfMemory))
	_, err = mem.Create(0, 1<<20, driver.ChunkOptions{}) // the granularity is 2 MiB
	fmt.Println(errors.Is(err, driver.ErrMisaligned))

	u, err := mem.Usage(1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.Used>>20, "of", u.Capacity>>20, "MiB used,", u.Chunks, "chunk")

	if err := c.Release(); err != nil { // not mapped: the memory goes back now
		log.Fatal(err)
	}
	u, err = mem.Usage(1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.Used>>20, "MiB used, peak", u.Peak>>20, "MiB")

	if err := mem.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 6 MiB on device 1
	// true
	// true
	// 6 of 8 MiB used, 1 chunk
	// 0 MiB used, peak 6 MiB
}
