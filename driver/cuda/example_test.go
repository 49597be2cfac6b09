package cuda_test

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Example opens the machine's GPUs and grows an arena on the first one;
// on a machine without them, the error says why (no libcuda.so.1, the
// toolkit's link stub, no GPU), and it prints true either way.
func Example() {
	drv, err := cuda.Open(cuda.Options{}) // or acl.Open(acl.Options{}) on Ascend NPUs
	if err != nil {
		fmt.Println(errors.Is(err, driver.ErrUnsupported) || errors.Is(err, driver.ErrNoDevice))
		return
	}
	defer drv.Close()
	space, mem := vaspace.New(drv), physical.New(drv)
	defer mem.Close()
	a, err := arena.New(space, mem, arena.Options{Max: 1 << 30})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	if err := a.Grow(4 << 20); err != nil { // 4 MiB of GPU memory, mapped in place
		panic(err)
	}
	msg := []byte("on the GPU")
	if err := a.Write(0, 0, msg); err != nil { // as device 0
		panic(err)
	}
	got := make([]byte, len(msg))
	if err := a.Read(0, 0, got); err != nil {
		panic(err)
	}
	fmt.Println(string(got) == string(msg))
	// Output: true
}
