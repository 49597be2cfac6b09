package sim_test

import (
	"fmt"
	"log"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// Eight 80 GiB devices on any machine: the sim driver keeps the books of
// address space, chunks, mappings and access exactly as a real driver
// does, capacity included, but has no bytes behind them.
func ExampleNew() {
	drv, err := sim.New(sim.Options{Devices: 8, Capacity: 80 << 30})
	if err != nil {
		log.Fatal(err)
	}
	devs := drv.Devices()
	fmt.Println(len(devs), "devices of", devs[7].Capacity>>30, "GiB")

	base, err := drv.Reserve(1<<40, 0, 0) // 1 TiB of simulated address space
	if err != nil {
		log.Fatal(err)
	}
	h, err := drv.Create(7, 80<<30, driver.ChunkOptions{}) // all of device 7
	if err != nil {
		log.Fatal(err)
	}
	_, err = drv.Create(7, 2<<20, driver.ChunkOptions{})
	fmt.Println(errors.Is(err, driver.ErrOutOfMemory), drv.Used(7)>>30, "GiB used")

	if err := drv.Map(base, h); err != nil {
		log.Fatal(err)
	}
	if err := drv.SetAccess(base, 80<<30, 7, driver.AccessReadWrite); err != nil {
		log.Fatal(err)
	}
	acc, err := drv.Access(base, 7)
	if err != nil {
		log.Fatal(err)
	}
	err = drv.Read(base, make([]byte, 8)) // no memory to read
	fmt.Println(acc, errors.Is(err, driver.ErrUnsupported))

	if err := drv.Unmap(base, 80<<30); err != nil {
		log.Fatal(err)
	}
	if err := drv.Release(h); err != nil {
		log.Fatal(err)
	}
	if err := drv.Unreserve(base, 1<<40); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 8 devices of 80 GiB
	// true 80 GiB used
	// read-write true
}
