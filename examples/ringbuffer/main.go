// Ringbuffer maps one chunk twice, back to back, in one reservation: the
// bytes at base+size+i are the bytes at base+i. A ring buffer laid over the
// first mapping can then hand out any message as one contiguous range, even
// one that wraps past the ring's end: the reader never splits a read in
// two, and only the writer wraps (in a real system, the producer that owns
// the ring; here, two Writes).
//
//	go run ./examples/ringbuffer [-svg DIR]
//
// With -svg it draws the reservation's memory map into DIR as it goes:
// the chunk mapped twice, then both mappings accessible.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/examples/mapsvg"
	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// ringSize is the ring: one chunk of the host driver's smallest
// granularity here, 64 KiB.
const ringSize = 64 * units.KiB

// dev is the one device that writes and reads the ring.
const dev driver.DeviceID = 0

func main() { os.Exit(mapsvg.Main("ringbuffer", os.Args[1:], os.Stdout, os.Stderr, run)) }

// ring is a byte ring over [base, base+size), with the same chunk mapped
// again at [base+size, base+2*size). Invariant: tail <= head <= tail+size
// (positions grow without bound; their remainder mod size is the offset).
type ring struct {
	tab        *mapping.Table
	base       driver.Addr
	size       uint64
	head, tail uint64
}

// put appends p, wrapping at the write side: the part past the ring's end
// goes to its start. It returns the number of Writes it took.
func (r *ring) put(p []byte) (int, error) {
	if uint64(len(p)) > r.size-(r.head-r.tail) {
		return 0, errors.Newf("ringbuffer: %d bytes do not fit in the %d free", len(p), r.size-(r.head-r.tail))
	}
	off := r.head % r.size
	first := min(uint64(len(p)), r.size-off)
	if err := r.tab.Write(dev, r.base+driver.Addr(off), p[:first]); err != nil {
		return 0, err
	}
	writes := 1
	if first < uint64(len(p)) {
		if err := r.tab.Write(dev, r.base, p[first:]); err != nil {
			return 0, err
		}
		writes++
	}
	r.head += uint64(len(p))
	return writes, nil
}

// get reads the next n bytes with one Read at the tail, never wrapping:
// past the ring's end it reads the second mapping, which is the ring's
// start.
func (r *ring) get(n int) ([]byte, driver.Addr, error) {
	if uint64(n) > r.head-r.tail {
		return nil, 0, errors.Newf("ringbuffer: %d bytes asked, %d held", n, r.head-r.tail)
	}
	at := r.base + driver.Addr(r.tail%r.size)
	p := make([]byte, n)
	if err := r.tab.Read(dev, at, p); err != nil {
		return nil, 0, err
	}
	r.tail += uint64(n)
	return p, at, nil
}

// run runs the example, writing its output to w and, when svgDir is not
// "", its memory maps there.
func run(w io.Writer, svgDir string) (err error) {
	hd, err := host.New(host.Options{Devices: 1, Capacity: ringSize, Granularity: ringSize})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, hd.Close()) }()
	drv, pics, err := mapsvg.Record(hd, svgDir)
	if err != nil {
		return err
	}
	mem := physical.New(drv)
	res, err := vaspace.New(drv).Reserve(2*ringSize, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, res.Free()) }()
	tab, err := mapping.New(res, mem)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, tab.Close()) }()

	c, err := mem.Create(dev, ringSize, driver.ChunkOptions{})
	if err != nil {
		return err
	}
	base := res.Base()
	if err := tab.Map(base, c); err != nil {
		return errors.CombineErrors(err, c.Release())
	}
	if err := tab.Map(base+driver.Addr(ringSize), c); err != nil {
		return errors.CombineErrors(err, c.Release())
	}
	// The two mappings hold the chunk now; its memory goes when they do.
	if err := c.Release(); err != nil {
		return err
	}
	if err := pics.Write("mapped-twice", ringPicture(pics, "One chunk mapped twice, back to back, its handle released",
		"The two mappings hold the chunk: its memory goes when they do. No device may touch it yet.")); err != nil {
		return err
	}
	if err := tab.SetAccess(base, 2*ringSize, dev, driver.AccessReadWrite); err != nil {
		return err
	}
	u, err := mem.Usage(dev)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "One %s chunk mapped twice, back to back, in a %s reservation (device memory used: %s):\n",
		units.Bytes(ringSize), units.Bytes(2*ringSize), units.Bytes(u.Used))
	for m := range tab.Mappings() {
		fmt.Fprintf(w, "  %s  %s\n", m.Range, m.Chunk)
	}

	// One message across the end of the ring, shown step by step.
	r := &ring{tab: tab, base: base, size: ringSize}
	r.head, r.tail = ringSize-20, ringSize-20 // the ring has been used up to 20 bytes before its end
	msg := []byte("this message wraps past the end of the ring")
	writes, err := r.put(msg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nThe writer puts a %d-byte message at offset %d of the ring: %d bytes fit before the end,\n",
		len(msg), ringSize-20, 20)
	fmt.Fprintf(w, "the other %d wrap to offset 0 (%d Writes).\n", len(msg)-20, writes)
	p := ringPicture(pics, "Device 0 may read and write both mappings: the ring and, right after it, the ring again",
		fmt.Sprintf("The %d-byte message written 20 bytes before the ring's end (%d Writes) is read with one Read straight across +%s.",
			len(msg), writes, units.Bytes(ringSize)))
	if len(p.Ranges) == 1 {
		p.Ranges[0].Marks = append(p.Ranges[0].Marks, memsvg.Mark{Offset: ringSize - 20, Text: "the message starts, 20 bytes before the ring's end"})
	}
	if err := pics.Write("accessible", p); err != nil {
		return err
	}
	startOfRing := make([]byte, len(msg)-20)
	if err := tab.Read(dev, base, startOfRing); err != nil {
		return err
	}
	alias := make([]byte, len(msg)-20)
	if err := tab.Read(dev, base+driver.Addr(ringSize), alias); err != nil {
		return err
	}
	fmt.Fprintf(w, "Offset 0 of the ring (%s) holds %q,\n", base, startOfRing)
	fmt.Fprintf(w, "and so does the second mapping at %s: %q.\n", base+driver.Addr(ringSize), alias)
	got, at, err := r.get(len(msg))
	if err != nil {
		return err
	}
	if !bytes.Equal(got, msg) || !bytes.Equal(startOfRing, alias) {
		return errors.AssertionFailedf("ringbuffer: read %q, wrote %q", got, msg)
	}
	fmt.Fprintf(w, "The reader reads %d bytes at %s with one Read, straight across %s: %q\n",
		len(msg), at, base+driver.Addr(ringSize), got)

	// Then a stream: messages of random lengths, a length prefix each, lap
	// after lap; every read is one Read, wrapped or not.
	const messages = 2000
	rng := rand.New(rand.NewPCG(1, 2))
	var hdr [4]byte
	wrapped, laps0 := 0, r.tail/ringSize
	for i := range messages {
		body := make([]byte, 16+rng.IntN(4000))
		for j := range body {
			body[j] = byte(i + j)
		}
		binary.LittleEndian.PutUint32(hdr[:], uint32(len(body)))
		frame := append(hdr[:], body...)
		if r.head%ringSize+uint64(len(frame)) > ringSize {
			wrapped++
		}
		if _, err := r.put(frame); err != nil {
			return err
		}
		h, _, err := r.get(4)
		if err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint32(h))
		got, _, err := r.get(n)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, body) {
			return errors.AssertionFailedf("ringbuffer: message %d of %d bytes read back wrong", i, len(body))
		}
	}
	fmt.Fprintf(w, "\nA stream of %d messages of 16 to 4015 bytes went %d times round the ring; %d of them\n",
		messages, r.tail/ringSize-laps0, wrapped)
	fmt.Fprintf(w, "crossed its end, and every one was read back intact with a single Read.\n")
	return tab.Check()
}

// ringPicture is the reservation's memory map now, its two mappings
// marked.
func ringPicture(pics *mapsvg.Recorder, title, note string) memsvg.Picture {
	p := pics.Picture(title)
	p.Notes = []string{note}
	if len(p.Ranges) == 1 {
		p.Ranges[0].Name = "the ring's reservation"
		p.Ranges[0].Marks = []memsvg.Mark{{Offset: 0, Text: "the ring"}, {Offset: ringSize, Text: "the same chunk again"}}
	}
	return p
}
