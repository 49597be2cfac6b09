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

// The session from the README: reserve, create, map, grant one device, and
// see the other refused.
func Example() {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 << 20})
	if err != nil {
		panic(err)
	}
	defer drv.Close()
	res, _ := vaspace.New(drv).Reserve(64<<30, 0) // 64 GiB of address space, no memory
	mem := physical.New(drv)
	tab, _ := mapping.New(res, mem)

	c, _ := mem.Create(0, 2<<20, driver.ChunkOptions{}) // 2 MiB committed on device 0
	_ = tab.Map(res.Base(), c)                          // mapped, no device may touch it yet
	_ = tab.SetAccess(res.Base(), 2<<20, 0, driver.AccessReadWrite)
	_ = tab.Write(0, res.Base(), []byte("hello")) // device 0 writes

	buf := make([]byte, 5)
	err = tab.Read(1, res.Base(), buf) // device 1 was not granted
	fmt.Println(errors.Is(err, driver.ErrAccessDenied))
	_ = tab.Read(0, res.Base(), buf)
	fmt.Println(string(buf))
	for s := range tab.Spans() {
		fmt.Println(s.State, s.Range.Size>>20, "MiB")
	}
	// Output:
	// true
	// hello
	// accessible 2 MiB
	// reserved 65534 MiB
}
