package mapping_test

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The session from the README: reserve, create, map, grant one device, see
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
