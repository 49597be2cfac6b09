// Stitch fragments an allocator so that no free range can hold a large
// request, and no hole in its address space either, then shows the
// request served anyway by stitching: the
// scattered free chunks are mapped side by side into a second range, with
// no copy and no new memory, and the bytes written through the stitched
// allocation are the bytes of the chunks where they lie.
//
//	go run ./examples/stitch [-svg DIR]
//
// With -svg it draws the allocator's memory map into DIR at each step:
// fragmented, stitched (each lent chunk mapped twice, in its heap and in
// the stitch range), and freed.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/examples/mapsvg"
	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// chunk is the allocator's chunk and the size of each small allocation;
// every chunk is its own driver handle.
const chunk = 64 * units.KiB

// blocks is how many chunk-sized allocations are made; every other one is
// freed.
const blocks = 16

// want is the large request: four chunks, where the largest free range is
// one.
const want = 4 * chunk

func main() { os.Exit(mapsvg.Main("stitch", os.Args[1:], os.Stdout, os.Stderr, run)) }

// run runs the example, writing its output to w and, when svgDir is not
// "", its memory maps there.
func run(w io.Writer, svgDir string) (err error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * chunk, Granularity: chunk})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	// The allocator runs on the recorded driver; the example reads the
	// chunks' bytes through drv itself (the same addresses).
	rec, pics, err := mapsvg.Record(drv, svgDir)
	if err != nil {
		return err
	}
	// A release threshold of one byte: the allocator commits exactly what
	// it needs, and keeps nothing spare when it must commit more. Its
	// address space is its Max, the blocks' chunks: once they are
	// committed no hole has room to move the free chunks to (which an
	// allocator with room does instead, arena.Allocator says), so it
	// stitches what is free.
	al, err := arena.NewAllocator(vaspace.New(rec), physical.New(rec), arena.AllocatorOptions{
		Max: blocks * chunk, AddressSpace: blocks * chunk, ChunkSize: chunk, ReleaseThreshold: 1,
	})
	if err != nil {
		return err
	}
	ps := make([]driver.Addr, blocks)
	defer func() {
		// The allocator closes only once nothing is live: free the rest.
		for i := 1; i < blocks; i += 2 {
			if ps[i] != 0 {
				err = errors.CombineErrors(err, al.Free(ps[i]))
			}
		}
		err = errors.CombineErrors(err, al.Close())
	}()

	// Chunk-sized allocations, side by side; each records its own address
	// in its first 8 bytes.
	for i := range ps {
		if ps[i], err = al.Alloc(chunk, 0); err != nil {
			return err
		}
		b, err := al.Bytes(ps[i])
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(b, uint64(ps[i]))
	}
	base, end := ps[0], ps[blocks-1]+driver.Addr(chunk)
	for i := 0; i < blocks; i += 2 {
		if err := al.Free(ps[i]); err != nil {
			return err
		}
	}
	before := al.Stats()
	fmt.Fprintf(w, "An allocator holding %d chunks of %s, each its own handle, filled with %d allocations of one chunk;\n",
		before.Committed/chunk, units.Bytes(chunk), blocks)
	fmt.Fprintf(w, "every other one freed. Its memory now reads (U used, . free):\n  %s\n", layout(al, base, end, ps))
	fmt.Fprintf(w, "%s free in all, but the largest free range is %s.\n",
		units.Bytes(before.Committed-before.Allocated), units.Bytes(before.LargestFree))
	if err := pics.Write("fragmented", picture(pics, al, "Sixteen chunks, every other allocation freed: the free memory is scattered",
		"Allocations (U used, . free): "+layout(al, base, end, ps),
		fmt.Sprintf("%s free in all, but the largest free range is %s.", units.Bytes(before.Committed-before.Allocated), units.Bytes(before.LargestFree)))); err != nil {
		return err
	}

	p, err := al.Alloc(want, 0)
	if err != nil {
		return err
	}
	after := al.Stats()
	fmt.Fprintf(w, "\nAlloc(%s) is served at %s, outside [%s, +%s) where the chunks lie: a stitch.\n",
		units.Bytes(want), p, base, units.Bytes(uint64(end-base)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tbefore\tafter\t")
	for _, row := range []struct {
		name string
		b, a any
	}{
		{"Stitches", before.Stitches, after.Stitches},
		{"Grows", before.Grows, after.Grows},
		{"Committed", units.Bytes(before.Committed), units.Bytes(after.Committed)},
		{"Allocated", units.Bytes(before.Allocated), units.Bytes(after.Allocated)},
		{"MapEvents", before.MapEvents, after.MapEvents},
		{"ChunkMaps", before.ChunkMaps, after.ChunkMaps},
		{"Live", before.Live, after.Live},
	} {
		fmt.Fprintf(tw, "%s\t%v\t%v\t\n", row.name, row.b, row.a)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if after.Stitches != before.Stitches+1 || after.Committed != before.Committed || after.Grows != before.Grows {
		return errors.AssertionFailedf("stitch: the request was not stitched from memory already committed: %+v then %+v", before, after)
	}

	// Each chunk of the stitched allocation begins with the address its
	// last owner wrote: which chunk is behind it. Write through the
	// stitched allocation, then read the memory at those addresses.
	sb, err := al.Bytes(p)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nIts %d chunks are the freed chunks at", want/chunk)
	at := make([]driver.Addr, want/chunk)
	for i := range at {
		at[i] = driver.Addr(binary.LittleEndian.Uint64(sb[uint64(i)*chunk:]))
		fmt.Fprintf(w, " %s", at[i])
		copy(sb[uint64(i)*chunk:], fmt.Sprintf("stitched part %d, written at %s", i, p+driver.Addr(uint64(i)*chunk)))
	}
	fmt.Fprintln(w, " (each says so in its first bytes),")
	fmt.Fprintf(w, "lent to the stitch while it lives (S):\n  %s\n", layout(al, base, end, ps, at...))
	stitchedPic := picture(pics, al, fmt.Sprintf("Alloc(%s) served by stitching: the free chunks mapped again, side by side, in the stitch range", units.Bytes(want)),
		"Allocations (U used, S lent to the stitch, . free): "+layout(al, base, end, ps, at...),
		fmt.Sprintf("No copy and no new memory: committed %s before and after.", units.Bytes(after.Committed)))
	for i, r := range stitchedPic.Ranges {
		if at := driver.Addr(r.Base); p >= at && uint64(p-at) < r.Size {
			stitchedPic.Ranges[i].Marks = []memsvg.Mark{{Offset: uint64(p - at), Text: fmt.Sprintf("the stitched Alloc(%s)", units.Bytes(want))}}
		}
	}
	if err := pics.Write("stitched", stitchedPic); err != nil {
		return err
	}
	fmt.Fprintln(w, "Written through the stitched allocation, read back at each chunk's own address:")
	for i, a := range at {
		ab, err := drv.HostBytes(a, chunk)
		if err != nil {
			return err
		}
		text := string(ab[:bytes.IndexByte(ab, 0)])
		same := bytes.Equal(ab, sb[uint64(i)*chunk:uint64(i+1)*chunk])
		fmt.Fprintf(w, "  %s: %q (all %s the same: %v)\n", a, text, units.Bytes(chunk), same)
		if !same {
			return errors.AssertionFailedf("stitch: the chunk at %s differs from part %d of the stitch", a, i)
		}
	}

	if err := al.Free(p); err != nil {
		return err
	}
	freed := al.Stats()
	fmt.Fprintf(w, "\nFree unmaps the stitch (%d unmap event, %d chunks) and returns the chunks to the free space:\n",
		freed.UnmapEvents-after.UnmapEvents, freed.ChunkUnmaps-after.ChunkUnmaps)
	fmt.Fprintf(w, "  %s\n", layout(al, base, end, ps))
	fmt.Fprintf(w, "Committed %s, Allocated %s, Live %d, largest free range %s.\n",
		units.Bytes(freed.Committed), units.Bytes(freed.Allocated), freed.Live, units.Bytes(freed.LargestFree))
	if err := pics.Write("freed", picture(pics, al, "Free unmaps the stitch: each chunk is mapped once again, in its heap",
		"Allocations (U used, . free): "+layout(al, base, end, ps))); err != nil {
		return err
	}
	return al.Check()
}

// layout draws [base, end) a chunk a character: U for a live allocation of
// ps, S for a chunk lent (to a stitch), . for a free one.
func layout(al *arena.Allocator, base, end driver.Addr, ps []driver.Addr, lent ...driver.Addr) string {
	live := map[driver.Addr]bool{}
	for _, p := range ps {
		if _, err := al.Size(p); err == nil {
			live[p] = true
		}
	}
	var s []byte
	for a := base; a < end; a += driver.Addr(chunk) {
		switch {
		case live[a]:
			s = append(s, 'U')
		case slices.Contains(lent, a):
			s = append(s, 'S')
		default:
			s = append(s, '.')
		}
	}
	return string(s)
}

// rangeNames name the allocator's ranges in the order Ranges lists them:
// its two heaps, then the stitch range.
var rangeNames = []string{"the heap of small requests", "the heap of large requests", "the stitch range"}

// picture is the memory map now, titled title, with notes, the
// allocator's ranges named.
func picture(pics *mapsvg.Recorder, al *arena.Allocator, title string, notes ...string) memsvg.Picture {
	p := pics.Picture(title)
	p.Notes = notes
	names := map[driver.Addr]string{}
	if rs := al.Ranges(); len(rs) == len(rangeNames) {
		for i, r := range rs {
			names[r.Base] = rangeNames[i]
		}
	}
	for i := range p.Ranges {
		if n, ok := names[driver.Addr(p.Ranges[i].Base)]; ok {
			p.Ranges[i].Name = n
		}
	}
	return p
}
