package sleep_test

import (
	"fmt"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/sleep"
)

func Example() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 << 20})
	must(err)
	m, err := sleep.New(drv, sleep.Options{TagMax: 16 << 20})
	must(err)
	w, err := m.Alloc("weights", 4<<20) // a model's weights
	must(err)
	must(drv.Write(w, []byte("weights")))
	kv, err := m.Alloc("kv_cache", 8<<20)
	must(err)
	fmt.Println(drv.Used(0)>>20, "MiB used") // with free chunks the allocators keep

	must(m.Sleep(sleep.Host, "weights"))     // copied to host memory, then given back
	must(m.Sleep(sleep.Discard, "kv_cache")) // given back, nothing kept
	fmt.Println(drv.Used(0)>>20, "MiB used asleep")

	must(m.Wake()) // every tag, at the same addresses
	buf := make([]byte, 7)
	must(drv.Read(w, buf))
	fmt.Println(string(buf), drv.Used(0)>>20, "MiB used awake") // sleep gave the free chunks back for good
	for _, s := range m.Stats() {
		fmt.Println(s.Tag, s.Live, "live,", s.Cycles, "cycle")
	}

	must(m.Free(w))
	must(m.Free(kv))
	must(m.Close())
	must(drv.Close())
	// Output:
	// 16 MiB used
	// 0 MiB used asleep
	// weights 12 MiB used awake
	// kv_cache 1 live, 1 cycle
	// weights 1 live, 1 cycle
}
