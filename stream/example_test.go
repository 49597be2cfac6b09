package stream_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// Two streams of one device: the producer fills device memory, the
// consumer copies it into pinned host memory. Work on one stream runs in
// order; the consumer runs after the producer's fill only because it
// waits on an event recorded behind it, and the stream knows it
// (OrderedAfter, what a stream-ordered pool asks before reusing memory).
func ExampleStream_Wait() {
	drv, err := host.New(host.Options{Capacity: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	// 2 MiB of device memory, read-write for device 0.
	mem := physical.New(drv)
	res, err := vaspace.New(drv).Reserve(2<<20, 0)
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
	if err := tab.Map(res.Base(), c); err != nil {
		log.Fatal(err)
	}
	if err := tab.SetAccess(res.Base(), 2<<20, 0, driver.AccessReadWrite); err != nil {
		log.Fatal(err)
	}

	producer, err := stream.New(drv, 0)
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := stream.New(drv, 0)
	if err != nil {
		log.Fatal(err)
	}
	filled, err := stream.NewEvent(drv, 0)
	if err != nil {
		log.Fatal(err)
	}
	out, err := stream.NewHostBuffer(drv, 4) // pinned, for async copies
	if err != nil {
		log.Fatal(err)
	}

	if err := producer.Memset(res.Base(), 'x', 4); err != nil {
		log.Fatal(err)
	}
	if err := producer.Record(filled); err != nil {
		log.Fatal(err)
	}
	fmt.Println(consumer.OrderedAfter(producer, producer.Position()))
	if err := consumer.Wait(filled); err != nil {
		log.Fatal(err)
	}
	fmt.Println(consumer.OrderedAfter(producer, producer.Position()))
	if err := consumer.CopyDtoH(out.Bytes(), res.Base()); err != nil { // after the fill
		log.Fatal(err)
	}
	if err := consumer.Synchronize(); err != nil { // reports any failure of the work above
		log.Fatal(err)
	}
	fmt.Println(string(out.Bytes()))

	// Everything goes back in the reverse order of its making.
	if err := errors.Join(
		out.Free(), filled.Destroy(), consumer.Destroy(), producer.Destroy(),
		c.Release(), tab.Close(), res.Free(), drv.Close(),
	); err != nil {
		log.Fatal(err)
	}
	// Output:
	// false
	// true
	// xxxx
}
