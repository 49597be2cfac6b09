package multidev_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// One range striped over two devices: chunk i on device i mod 2, all at
// consecutive addresses. Access is granted per device and range, and
// Migrate moves the backing of a range to another device at the same
// addresses, bytes and grants included.
func ExampleArena_Migrate() {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	a, err := multidev.New(vaspace.New(drv), physical.New(drv), multidev.Options{
		Max:       1 << 30,
		ChunkSize: 2 << 20,
		Placement: multidev.Striped(0, 1),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Grow(8 << 20); err != nil { // four chunks, inaccessible until granted
		log.Fatal(err)
	}
	printLayout(a)

	err = a.Write(0, 0, []byte("weights"))
	fmt.Println(errors.Is(err, driver.ErrAccessDenied))
	if err := a.Grant(0, 0, a.Len(), driver.AccessReadWrite); err != nil { // all of it, for device 0
		log.Fatal(err)
	}
	if err := a.Write(0, 2<<20, []byte("weights")); err != nil { // on device 1's memory
		log.Fatal(err)
	}

	base := a.Base()
	if err := a.Migrate(0, a.Len(), 0); err != nil { // everything to device 0
		log.Fatal(err)
	}
	printLayout(a)
	buf := make([]byte, 7)
	if err := a.Read(0, 2<<20, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf), a.Base() == base)

	if err := a.Close(); err != nil {
		log.Fatal(err)
	}
	if err := drv.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// device 0: 2 MiB, device 1: 2 MiB, device 0: 2 MiB, device 1: 2 MiB
	// true
	// device 0: 8 MiB
	// weights true
}

// printLayout prints the runs of chunks on one device, in address order.
func printLayout(a *multidev.Arena) {
	for i, e := range a.Layout() {
		if i > 0 {
			fmt.Print(", ")
		}
		fmt.Printf("device %d: %d MiB", e.Device, e.Range.Size>>20)
	}
	fmt.Println()
}
