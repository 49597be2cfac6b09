package ipc_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/ipc"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// Sharing a chunk, as docs/sharing.md shows it: a producer and a consumer — two
// processes in life, one here, each with a host driver of its own —
// connect over a Unix socket; the producer exports a chunk to the
// consumer's process ID and sends it, the consumer maps it, and each reads
// what the other wrote. Each side releases its own chunk and closes its
// own stack; the memory goes with the last holder.
func Example() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	// One process's stack: a driver, its memory, 2 MiB of address space
	// and the page table over it.
	open := func() (*host.Driver, *physical.Memory, *vaspace.Reservation, *mapping.Table) {
		drv, err := host.New(host.Options{Capacity: 64 << 20})
		must(err)
		mem := physical.New(drv)
		res, err := vaspace.New(drv).Reserve(2<<20, 0)
		must(err)
		tab, err := mapping.New(res, mem)
		must(err)
		return drv, mem, res, tab
	}
	dir, err := os.MkdirTemp("", "vmarena-ipc-")
	must(err)
	l, err := ipc.Listen(filepath.Join(dir, "mem.sock"), 0o600) // the path's permissions decide who connects
	must(err)
	consumer, err := ipc.Dial(l.Path()) // the consumer's end
	must(err)
	producer, err := l.Accept() // the producer's end: the kernel names the peer (SO_PEERCRED)
	must(err)

	pdrv, pmem, pres, ptab := open() // the producer
	c, err := pmem.Create(0, 2<<20, driver.ChunkOptions{Shareable: true})
	must(err)
	must(ptab.Map(pres.Base(), c))
	must(ptab.SetAccess(pres.Base(), 2<<20, 0, driver.AccessReadWrite))
	must(ptab.Write(0, pres.Base(), []byte("hello")))
	_, err = c.Export(os.Getpid()) // the allow-list: the consumer's process ID (this one, here)
	must(err)
	must(producer.SendChunk(c)) // SCM_RIGHTS; a process not on the list gets a refusal, no descriptor

	cdrv, cmem, cres, ctab := open()        // the consumer
	got, err := consumer.RecvChunk(cmem, 0) // its own chunk, over the same memory
	must(err)
	must(ctab.Map(cres.Base(), got)) // mapped like any chunk
	must(ctab.SetAccess(cres.Base(), 2<<20, 0, driver.AccessReadWrite))
	buf := make([]byte, 5)
	must(ctab.Read(0, cres.Base(), buf))
	fmt.Println("the consumer reads", string(buf))
	must(ctab.Write(0, cres.Base(), []byte("world")))
	must(ptab.Read(0, pres.Base(), buf))
	fmt.Println("the producer reads", string(buf))

	must(got.Release()) // the consumer's chunk; the producer's mapping stays
	must(ctab.Close())
	must(cres.Free())
	must(cdrv.Close())
	must(c.Release())
	must(ptab.Close())
	must(pres.Free())
	must(pdrv.Close())
	must(consumer.Close())
	must(producer.Close())
	must(l.Close()) // removes the socket file
	must(os.RemoveAll(dir))
	// Output:
	// the consumer reads hello
	// the producer reads world
}

// Sharing an allocation of a stream-ordered pool, as
// cudaMemPoolExportPointer does: the exporter sends the pool and a
// pointer, the importer maps the chunks under it and reads it, and the
// exporter may free the pointer only once the importer has released it.
// Both ends are in this process here; in life they are two.
func ExampleExportPool() {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	dir, err := os.MkdirTemp("", "vmarena-ipc-")
	must(err)
	l, err := ipc.Listen(filepath.Join(dir, "pool.sock"), 0o600)
	must(err)
	importer, err := ipc.Dial(l.Path())
	must(err)
	exporter, err := l.Accept()
	must(err)

	// The exporter: a shareable pool and one allocation written on a stream.
	edrv, err := host.New(host.Options{Capacity: 64 << 20})
	must(err)
	p, err := pool.New(vaspace.New(edrv), physical.New(edrv), pool.Props{Shareable: true, MaxSize: 16 << 20})
	must(err)
	s, err := stream.New(edrv, 0)
	must(err)
	ptr, err := p.MallocAsync(4096, s)
	must(err)
	must(s.CopyHtoD(ptr, []byte("tensor")))
	must(s.Synchronize())
	ep, err := ipc.ExportPool(p, os.Getpid()) // the importer's process ID (this one, here)
	must(err)
	must(exporter.SendPool(ep))
	must(exporter.SendPointer(ep, ptr)) // the chunks under ptr, then ptr

	// The importer: a driver of its own, the pool's chunks mapped at the
	// exporter's offsets.
	idrv, err := host.New(host.Options{Capacity: 64 << 20})
	must(err)
	ip, err := importer.RecvPool(vaspace.New(idrv), physical.New(idrv), 0)
	must(err)
	got, err := importer.RecvPointer(ip)
	must(err)
	buf := make([]byte, 6)
	must(ip.Read(0, got, buf))
	fmt.Println("the importer reads", string(buf))

	err = p.FreeAsync(ptr, s) // the importer still holds it
	fmt.Println(errors.Is(err, driver.ErrBusy), exporter.Holds(), "held")
	must(ip.Free(got)) // tells the exporter
	released, err := exporter.RecvRelease(ep)
	must(err)
	fmt.Println(released == ptr, exporter.Holds(), "held")
	must(p.FreeAsync(ptr, s))

	must(ip.Close())
	must(idrv.Close())
	must(s.Destroy())
	must(p.Destroy())
	must(edrv.Close())
	must(importer.Close())
	must(exporter.Close())
	must(l.Close())
	must(os.RemoveAll(dir))
	// Output:
	// the importer reads tensor
	// true 1 held
	// true 0 held
}
