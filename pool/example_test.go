package pool_test

import (
	"fmt"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
)

// Stream-ordered allocation of docs/streams-pools.md: memory from the device's
// default pool, a copy and a host function in stream order, the memory
// freed in stream order and the stream synchronized.
func ExampleMallocAsync() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	must(err)
	s, err := stream.New(drv, 0)
	must(err)
	p, err := pool.MallocAsync(1<<20, s) // the device's default pool
	must(err)
	data := []byte("weights")
	must(s.CopyHtoD(p, data))              // async; data must stay put until s passes it
	must(s.Launch("kernel", func() error { // a host function, in stream order
		fmt.Println("kernel runs after the copy")
		return nil
	}))
	must(pool.FreeAsync(p, s)) // reusable by later work on s at once
	must(s.Synchronize())      // reports any failure of the work above

	must(s.Destroy())
	must(pool.CloseDefaults(drv)) // the default pools go before the driver
	must(drv.Close())
	// Output:
	// kernel runs after the copy
}
