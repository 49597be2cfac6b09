package mapping_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The session of docs/drivers.md: reserve, create, map, grant one device, see
// the other refused, and close in order (the driver refuses to close while
// anything is mapped).
func Example() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 << 20})
	must(err)
	space, mem := vaspace.New(drv), physical.New(drv)
	res, err := space.Reserve(64<<30, 0) // 64 GiB of address space, no memory
	must(err)
	tab, err := mapping.New(res, mem)
	must(err)

	c, err := mem.Create(0, 2<<20, driver.ChunkOptions{}) // 2 MiB committed on device 0
	must(err)
	must(tab.Map(res.Base(), c)) // mapped, but no device may touch it yet
	must(tab.SetAccess(res.Base(), 2<<20, 0, driver.AccessReadWrite))
	must(tab.Write(0, res.Base(), []byte("hello"))) // device 0 writes

	buf := make([]byte, 5)
	err = tab.Read(1, res.Base(), buf) // device 1 was not granted
	fmt.Println(errors.Is(err, driver.ErrAccessDenied))
	must(tab.Read(0, res.Base(), buf))
	fmt.Println(string(buf))
	for s := range tab.Spans() {
		fmt.Println(s.State, s.Range.Size>>20, "MiB")
	}

	fmt.Println(errors.Is(drv.Close(), driver.ErrBusy)) // still mapped: refused
	must(c.Release())                                   // the memory stays while mapped
	must(tab.Close())                                   // unmaps everything
	must(res.Free())
	must(drv.Close())
	// Output:
	// true
	// hello
	// accessible 2 MiB
	// reserved 65534 MiB
	// true
}

// One chunk mapped at two addresses of a reservation (virtual aliasing):
// what is written through one is read through the other. Map never
// replaces a mapping, and a chunk is unmapped whole, one mapping at a time.
func ExampleTable_Map() {
	drv, err := host.New(host.Options{Capacity: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	mem := physical.New(drv)
	res, err := vaspace.New(drv).Reserve(64<<20, 0)
	if err != nil {
		log.Fatal(err)
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		log.Fatal(err)
	}
	c, err := mem.Create(0, 2<<20, driver.ChunkOptions{})
	if err != nil {
		log.Fatal(err)
	}
	front, back := res.Base(), res.Base()+32<<20
	for _, addr := range []driver.Addr{front, back} {
		if err := tab.Map(addr, c); err != nil {
			log.Fatal(err)
		}
		if err := tab.SetAccess(addr, c.Size(), 0, driver.AccessReadWrite); err != nil {
			log.Fatal(err)
		}
	}
	if err := tab.Write(0, front, []byte("alias")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 5)
	if err := tab.Read(0, back, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf), c.Mappings(), "mappings")

	err = tab.Map(back, c) // over a mapping
	fmt.Println(errors.Is(err, driver.ErrOverlap))
	err = tab.Unmap(back + 1<<20) // inside a mapping, not at its start
	fmt.Println(errors.Is(err, driver.ErrPartial))

	if err := c.Release(); err != nil { // the handle goes; the mappings keep the memory
		log.Fatal(err)
	}
	if err := tab.Unmap(front); err != nil {
		log.Fatal(err)
	}
	u, err := mem.Usage(0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.Used>>20, "MiB used")
	if err := tab.Unmap(back); err != nil { // the last mapping: the memory goes back
		log.Fatal(err)
	}
	u, err = mem.Usage(0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.Used>>20, "MiB used")

	if err := tab.Close(); err != nil {
		log.Fatal(err)
	}
	if err := res.Free(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// alias 2 mappings
	// true
	// true
	// 2 MiB used
	// 0 MiB used
}
