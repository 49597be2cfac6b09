package host_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
)

// The driver contract on this machine's memory, called directly (the
// layers above — vaspace, physical, mapping — keep the books for you):
// reserve address space, commit a chunk on a logical device, map it twice,
// grant access, and write through one mapping what the other reads.
func ExampleNew() {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range drv.Devices() {
		fmt.Println(d.Name, d.Capacity>>20, "MiB, granularity", d.MinGranularity>>20, "MiB")
	}

	base, err := drv.Reserve(1<<30, 0, 0) // 1 GiB of PROT_NONE address space
	if err != nil {
		log.Fatal(err)
	}
	h, err := drv.Create(0, 2<<20, driver.ChunkOptions{}) // 2 MiB of device 0's memfd heap
	if err != nil {
		log.Fatal(err)
	}
	alias := base + 512<<20
	for _, addr := range []driver.Addr{base, alias} { // one chunk, two addresses
		if err := drv.Map(addr, h); err != nil {
			log.Fatal(err)
		}
		if err := drv.SetAccess(addr, 2<<20, 0, driver.AccessReadWrite); err != nil {
			log.Fatal(err)
		}
	}
	acc, err := drv.Access(base, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("device 1 may", acc)

	if err := drv.Write(base, []byte("aliased")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 7)
	if err := drv.Read(alias, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf), drv.Used(0)>>20, "MiB used")

	fmt.Println(errors.Is(drv.Close(), driver.ErrBusy)) // refused while anything is mapped
	for _, addr := range []driver.Addr{base, alias} {
		if err := drv.Unmap(addr, 2<<20); err != nil {
			log.Fatal(err)
		}
	}
	if err := drv.Release(h); err != nil { // unmapped: the memory goes back now
		log.Fatal(err)
	}
	if err := drv.Unreserve(base, 1<<30); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// host0 64 MiB, granularity 2 MiB
	// host1 64 MiB, granularity 2 MiB
	// device 1 may none
	// aliased 2 MiB used
	// true
}
