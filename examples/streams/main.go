// Streams runs a producer and a consumer of tensors on two streams of one
// device, handing memory across with events. The producer allocates each
// tensor from a stream-ordered pool on its own stream (MallocAsync), fills
// it in a host function (the host driver's kind of kernel) and records an
// event; the consumer waits on that event, checks the tensor's checksum in
// a host function and frees the memory on its own stream (FreeAsync), then
// records an event of its own.
//
// The pool reuses memory freed on the consumer's stream for the producer
// only once the producer is ordered after the free: here, once it has
// waited on the consumer's event recorded after it (CUDA's
// reuse-follow-event-dependencies; the pool's two other reuse policies are
// turned off so that this is the only way across). The program runs the
// pipeline twice — with the producer waiting for the consumer to be at most
// four tensors behind, and without that wait — compares the addresses the
// producer got, and prints the pool's high-water marks.
//
//	go run ./examples/streams
package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

const (
	// rows × cols float32 elements make one tensor: 64 KiB.
	rows, cols  = 64, 256
	tensorBytes = rows * cols * 4
	// chunk is the device's granularity and the pool's chunk.
	chunk = 64 * units.KiB
	// tensors is how many tensors go through the pipeline.
	tensors = 100
	// depth is how many tensors may be live at once: the producer
	// allocates tensor i once the consumer has freed tensor i-depth.
	depth = 4
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "streams: %v\n", err)
		os.Exit(1)
	}
}

// poolBuffer is a tensor.Buffer over a live allocation of a pool: its
// bytes, which the pool gives for a live allocation, and its device
// address.
type poolBuffer struct {
	p    *pool.Pool
	addr driver.Addr
}

func (b poolBuffer) Bytes() ([]byte, error) { return b.p.Bytes(b.addr) }
func (b poolBuffer) Addr() driver.Addr      { return b.addr }

// value is element j of tensor i.
func value(i, j int) float32 { return float32((i*31 + j) % 251) }

// checksum weighs each element's bits by its position, so a tensor with
// two elements swapped, or another tensor's data, does not pass.
func checksum(data []float32) uint64 {
	var s uint64
	for j, v := range data {
		s += uint64(j+1) * uint64(math.Float32bits(v))
	}
	return s
}

// figures is what one run of the pipeline saw.
type figures struct {
	matched                    int // checksums the consumer found right
	fresh, reused, distinct    int // blocks new to the pool, reused from the consumer's frees, addresses seen
	reservedHigh, reservedCur  uint64
	usedHigh, usedCur, trimmed uint64 // trimmed: ReservedMemCurrent after TrimTo(0)
}

func run(w io.Writer) (err error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 16 * units.MiB, Granularity: chunk})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	space, mem := vaspace.New(drv), physical.New(drv)

	fmt.Fprintf(w, "Two streams on device 0 of the host driver (granularity %s). For each of %d tensors\n", units.Bytes(chunk), tensors)
	fmt.Fprintf(w, "(%d×%d float32, %s), the producer stream allocates it from a pool (MallocAsync),\n", rows, cols, units.Bytes(tensorBytes))
	fmt.Fprintln(w, "fills it in a host function and records an event; the consumer stream waits on the")
	fmt.Fprintln(w, "event, checks the tensor's checksum in a host function, frees it (FreeAsync on the")
	fmt.Fprintln(w, "consumer) and records an event of its own. The pool reuses memory across streams only")
	fmt.Fprintln(w, "by following event dependencies (its opportunistic and internal-dependency reuse are off).")

	var runs [2]figures
	for k, wait := range []bool{true, false} {
		if runs[k], err = pipeline(drv, space, mem, wait); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\nThe producer either waits on the consumer's event of tensor i-%d before allocating tensor i\n", depth)
	fmt.Fprintln(w, "(ordered after that free), or never waits on the consumer:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\twaits\tnever waits\t")
	for _, row := range []struct {
		name string
		get  func(f figures) any
	}{
		{"checksums matched", func(f figures) any { return fmt.Sprintf("%d of %d", f.matched, tensors) }},
		{"fresh blocks", func(f figures) any { return f.fresh }},
		{"reused across streams", func(f figures) any { return f.reused }},
		{"distinct addresses", func(f figures) any { return f.distinct }},
		{"ReservedMemHigh", func(f figures) any { return units.Bytes(f.reservedHigh) }},
		{"UsedMemHigh", func(f figures) any { return units.Bytes(f.usedHigh) }},
		{"ReservedMemCurrent", func(f figures) any { return units.Bytes(f.reservedCur) }},
		{"UsedMemCurrent", func(f figures) any { return units.Bytes(f.usedCur) }},
		{"reserved after TrimTo(0)", func(f figures) any { return units.Bytes(f.trimmed) }},
	} {
		fmt.Fprintf(tw, "%s\t%v\t%v\t\n", row.name, row.get(runs[0]), row.get(runs[1]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nThe host enqueued all the work before synchronizing: the pool decided each reuse from")
	fmt.Fprintf(w, "stream order alone. Waiting, every reuse was of a block the consumer freed at or before\n")
	fmt.Fprintf(w, "tensor i-%d, the last free the producer was ordered after; %d blocks carried all %d tensors.\n",
		depth, runs[0].distinct, tensors)
	fmt.Fprintln(w, "Never waiting, the producer was never ordered after a free: each tensor took fresh")
	fmt.Fprintf(w, "memory and the pool reserved %s, though no more than %s was in use at once.\n",
		units.Bytes(runs[1].reservedHigh), units.Bytes(runs[1].usedHigh))
	for _, f := range runs {
		if f.matched != tensors {
			return errors.Newf("streams: %d of %d checksums matched", f.matched, tensors)
		}
	}
	fmt.Fprintf(w, "All %d checksums matched in both runs.\n", 2*tensors)
	return nil
}

// pipeline runs the tensors through a fresh pool; with wait, the producer
// waits on the consumer's event of tensor i-depth before allocating tensor
// i. The host enqueues everything from this goroutine, the producer's part
// of tensor i beside the consumer's part of tensor i-(depth-1), so that up
// to depth tensors are live at once.
func pipeline(drv driver.Driver, space *vaspace.Space, mem *physical.Memory, wait bool) (f figures, err error) {
	pl, err := pool.New(space, mem, pool.Props{ChunkSize: chunk})
	if err != nil {
		return f, err
	}
	defer func() { err = errors.CombineErrors(err, pl.Destroy()) }()
	for _, a := range []pool.Attr{pool.ReuseAllowOpportunistic, pool.ReuseAllowInternalDependencies} {
		if err := pl.SetAttribute(a, 0); err != nil {
			return f, err
		}
	}
	var prod, cons *stream.Stream
	for _, s := range []**stream.Stream{&prod, &cons} {
		if *s, err = stream.New(drv, 0); err != nil {
			return f, err
		}
		defer func(s *stream.Stream) { err = errors.CombineErrors(err, s.Destroy()) }(*s)
	}
	// ready[i%depth] is recorded on the producer after filling tensor i,
	// done[i%depth] on the consumer after freeing it.
	var ready, done [depth]*stream.Event
	for k := range depth {
		for _, e := range []**stream.Event{&ready[k], &done[k]} {
			if *e, err = stream.NewEvent(drv, 0); err != nil {
				return f, err
			}
			defer func(e *stream.Event) { err = errors.CombineErrors(err, e.Destroy()) }(*e)
		}
	}

	addrs := make([]driver.Addr, tensors)
	ts := make([]*tensor.Tensor, tensors)
	ok := make([]bool, tensors)       // written by the consumer's host functions
	lastUser := map[driver.Addr]int{} // the last tensor at each address
	produce := func(i int) error {
		if wait && i >= depth {
			if err := prod.Wait(done[(i-depth)%depth]); err != nil {
				return err
			}
		}
		p, err := pl.MallocAsync(tensorBytes, prod)
		if err != nil {
			return err
		}
		addrs[i] = p
		if j, seen := lastUser[p]; !seen {
			f.fresh++
		} else {
			// Every free is the consumer's, so this is reuse across streams;
			// it must be of a free the producer is ordered after.
			if !wait || j > i-depth {
				return errors.AssertionFailedf("streams: tensor %d got %s, freed by the consumer after tensor %d, a free the producer is not ordered after", i, p, j)
			}
			f.reused++
		}
		lastUser[p] = i
		t, err := tensor.New(poolBuffer{pl, p}, tensor.Float32, rows, cols)
		if err != nil {
			return err
		}
		ts[i] = t
		if err := prod.Launch(fmt.Sprintf("fill tensor %d", i), func() error {
			data, err := tensor.Data[float32](t)
			if err != nil {
				return err
			}
			for j := range data {
				data[j] = value(i, j)
			}
			return nil
		}); err != nil {
			return err
		}
		return prod.Record(ready[i%depth])
	}
	consume := func(i int) error {
		if err := cons.Wait(ready[i%depth]); err != nil {
			return err
		}
		want := make([]float32, rows*cols)
		for j := range want {
			want[j] = value(i, j)
		}
		sum := checksum(want)
		t := ts[i]
		if err := cons.Launch(fmt.Sprintf("check tensor %d", i), func() error {
			data, err := tensor.Data[float32](t)
			if err != nil {
				return err
			}
			ok[i] = checksum(data) == sum
			return nil
		}); err != nil {
			return err
		}
		if err := pl.FreeAsync(addrs[i], cons); err != nil {
			return err
		}
		return cons.Record(done[i%depth])
	}
	lag := depth - 1
	for i := range tensors + lag {
		if i < tensors {
			if err := produce(i); err != nil {
				return f, err
			}
		}
		if i >= lag {
			if err := consume(i - lag); err != nil {
				return f, err
			}
		}
	}
	if err := errors.CombineErrors(prod.Synchronize(), cons.Synchronize()); err != nil {
		return f, err
	}
	for _, m := range ok {
		if m {
			f.matched++
		}
	}
	f.distinct = len(lastUser)
	for _, x := range []struct {
		a    pool.Attr
		into *uint64
	}{
		{pool.ReservedMemHigh, &f.reservedHigh}, {pool.ReservedMemCurrent, &f.reservedCur},
		{pool.UsedMemHigh, &f.usedHigh}, {pool.UsedMemCurrent, &f.usedCur},
	} {
		if *x.into, err = pl.Attribute(x.a); err != nil {
			return f, err
		}
	}
	// With opportunistic reuse off, a synchronize releases nothing (freed
	// memory in the allocator could go to any stream): TrimTo does.
	if err := pl.TrimTo(0); err != nil {
		return f, err
	}
	if f.trimmed, err = pl.Attribute(pool.ReservedMemCurrent); err != nil {
		return f, err
	}
	return f, pl.Check()
}
