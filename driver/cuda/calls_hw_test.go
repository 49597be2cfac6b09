package cuda

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkHardwareCalls times each virtual-memory call on the machine's
// first GPU, one chunk at a time as the library makes them (create, map,
// grant, unmap, release), at 2 MiB and at 20 MiB, and reports each call's
// µs beside its price in the sim driver's A100 table (sim.A100, from
// kvcached's published figures): the table is what replay prices driver
// time with, and this is the check of that table on real hardware.
// `go test ./driver/cuda -run '^$' -bench HardwareCalls -benchtime 200x`;
// it skips where there is no GPU.
func BenchmarkHardwareCalls(b *testing.B) {
	for _, size := range []uint64{2 * units.MiB, 20 * units.MiB} {
		b.Run(units.Bytes(size), func(b *testing.B) {
			if _, err := probeGranularity(); err != nil {
				b.Skipf("no usable GPU on this machine: %v", err)
			}
			d, err := Open(Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := d.tearDown(); err != nil {
					b.Error(err)
				}
			}()
			if size%d.Granularity() != 0 {
				b.Skipf("%s is not a multiple of the granularity %s", units.Bytes(size), units.Bytes(d.Granularity()))
			}
			base, err := d.Reserve(size, 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := d.Unreserve(base, size); err != nil {
					b.Error(err)
				}
			}()
			var spent [5]time.Duration
			for b.Loop() {
				t0 := time.Now()
				h, err := d.Create(0, size, driver.ChunkOptions{})
				t1 := time.Now()
				if err == nil {
					err = d.Map(base, h)
				}
				t2 := time.Now()
				if err == nil {
					err = d.SetAccess(base, size, 0, driver.AccessReadWrite)
				}
				t3 := time.Now()
				if err == nil {
					err = d.Unmap(base, size)
				}
				t4 := time.Now()
				if err == nil {
					err = d.Release(h)
				}
				t5 := time.Now()
				if err != nil {
					b.Fatal(err)
				}
				for i, dt := range []time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4)} {
					spent[i] += dt
				}
			}
			a := sim.A100
			for i, c := range []struct {
				name  string
				price time.Duration
			}{{"create", a.Create}, {"map", a.Map}, {"access", a.SetAccess}, {"unmap", a.Unmap}, {"release", a.Release}} {
				per := spent[i] / time.Duration(b.N)
				b.ReportMetric(float64(per.Nanoseconds())/1e3, c.name+"-us")
				if c.price > 0 {
					b.ReportMetric(float64(per)/float64(c.price), fmt.Sprintf("%s/A100", c.name))
				}
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
