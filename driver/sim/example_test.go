package sim_test

import (
	"errors"
	"fmt"
	"log"

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

// The sim driver counts the calls that change its record and prices them
// as an A100 would take them: here one 20 MiB chunk's worth of 2 MiB
// pages, created, mapped and granted one call at a time.
func ExampleDriver_Tally() {
	drv, err := sim.New(sim.Options{}) // priced by sim.A100
	if err != nil {
		log.Fatal(err)
	}
	base, err := drv.Reserve(20<<20, 0, 0)
	if err != nil {
		log.Fatal(err)
	}
	for off := uint64(0); off < 20<<20; off += 2 << 20 {
		h, err := drv.Create(0, 2<<20, driver.ChunkOptions{})
		if err != nil {
			log.Fatal(err)
		}
		if err := drv.Map(base+driver.Addr(off), h); err != nil {
			log.Fatal(err)
		}
		if err := drv.Release(h); err != nil { // freed with its mapping
			log.Fatal(err)
		}
	}
	if err := drv.SetAccess(base, 20<<20, 0, driver.AccessReadWrite); err != nil { // one call over ten mappings
		log.Fatal(err)
	}
	tally := drv.Tally()
	dev := tally.Devices[0]
	fmt.Printf("%d creates, %d maps, %d releases, %d set access: %v on device 0\n",
		dev.Create, dev.Map, dev.Release, dev.SetAccess, dev.Time(tally.Costs))
	fmt.Printf("%d reserve: %v in all, priced by %s\n", tally.Space.Reserve, tally.Time(), tally.Costs.Name)

	for off := uint64(0); off < 20<<20; off += 2 << 20 {
		if err := drv.Unmap(base+driver.Addr(off), 2<<20); err != nil {
			log.Fatal(err)
		}
	}
	if err := drv.Close(); err != nil { // unreserves what is left, uncounted
		log.Fatal(err)
	}
	fmt.Println(drv.Tally().Total().Unmap, "unmaps")
	// Output:
	// 10 creates, 10 maps, 10 releases, 1 set access: 1.98369ms on device 0
	// 1 reserve: 2.00269ms in all, priced by A100 (kvcached benchmarks/bench_vmm)
	// 10 unmaps
}
