package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// demo walks through the core on the host driver: a 64 GiB reservation,
// chunks of two logical devices mapped into it, access granted and revoked
// per device, a chunk aliased at two addresses, release while mapped, and
// every refusal as the error a user would see; then a growing arena,
// stitching, and an arena striped over both devices, half of it migrated.
func demo(w io.Writer) (err error) {
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 * units.MiB})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	space := vaspace.New(drv)
	mem := physical.New(drv)
	gran := drv.Granularity()

	step := 0
	say := func(format string, args ...any) {
		step++
		fmt.Fprintf(w, "\n%d. %s\n", step, fmt.Sprintf(format, args...))
	}
	refused := func(err error) {
		if err == nil {
			fmt.Fprintln(w, "   !! expected a refusal, got none")
			return
		}
		fmt.Fprintf(w, "   refused: %v\n", err)
	}

	fmt.Fprintf(w, "vmarena demo: host driver, 2 logical devices of %s, granularity %s\n",
		units.Bytes(drv.Devices()[0].Capacity), units.Bytes(gran))

	res, err := space.Reserve(64*units.GiB, 0)
	if err != nil {
		return err
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		return err
	}
	at := func(off uint64) driver.Addr { return res.Base() + driver.Addr(off) }
	say("Reserve 64 GiB of address space: no memory behind it yet.")
	printMap(w, tab, mem)

	a, err := mem.Create(0, 2*gran, driver.ChunkOptions{})
	if err != nil {
		return err
	}
	b, err := mem.Create(1, gran, driver.ChunkOptions{})
	if err != nil {
		return err
	}
	if err := tab.Map(at(0), a); err != nil {
		return err
	}
	if err := tab.Map(at(2*gran), b); err != nil {
		return err
	}
	say("Create %s on device 0 and %s on device 1 and map them side by side: one contiguous range backed by two devices, inaccessible until granted.",
		units.Bytes(a.Size()), units.Bytes(b.Size()))
	printMap(w, tab, mem)

	if err := tab.SetAccess(at(0), 3*gran, 0, driver.AccessReadWrite); err != nil {
		return err
	}
	if err := tab.SetAccess(at(0), gran, 1, driver.AccessRead); err != nil {
		return err
	}
	say("Grant device 0 read-write over all three granules, and device 1 read over the first only.")
	printMap(w, tab, mem)

	msg := []byte("hello from device 0")
	if err := tab.Write(0, at(0), msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if err := tab.Read(1, at(0), got); err != nil {
		return err
	}
	say("Device 0 writes %q at the base; device 1 reads it back: %q.", msg, got)
	fmt.Fprintln(w, "   device 1 writing there:")
	refused(tab.Write(1, at(0), msg))
	fmt.Fprintln(w, "   device 1 reading the second granule, which it was not granted:")
	refused(tab.Read(1, at(gran), got))

	if err := tab.Map(at(32*units.GiB), a); err != nil {
		return err
	}
	if err := tab.SetAccess(at(32*units.GiB), gran, 1, driver.AccessRead); err != nil {
		return err
	}
	alias := make([]byte, len(msg))
	if err := tab.Read(1, at(32*units.GiB), alias); err != nil {
		return err
	}
	say("Alias: map the same %s chunk again 32 GiB further on. Device 1 reads %q through the alias: one chunk, two addresses.",
		units.Bytes(a.Size()), alias)
	printMap(w, tab, mem)

	say("Refusals, each leaving everything as it was:")
	refused(tab.Map(at(gran), b))
	refused(tab.Unmap(at(gran)))
	refused(tab.SetAccess(at(4*gran), gran, 0, driver.AccessRead))
	refused(tab.Read(0, at(8*gran), got))
	_, oom := mem.Create(0, 64*units.MiB, driver.ChunkOptions{})
	refused(oom)
	refused(res.Free())

	if err := tab.SetAccess(at(0), 3*gran, 0, driver.AccessNone); err != nil {
		return err
	}
	say("Revoke device 0's access; reading now fails instead of crashing:")
	refused(tab.Read(0, at(0), got))
	printMap(w, tab, mem)

	if err := a.Release(); err != nil {
		return err
	}
	say("Release the aliased chunk's handle while both mappings live: its memory stays until the last mapping goes.")
	printUsage(w, mem)
	if err := tab.Unmap(at(0)); err != nil {
		return err
	}
	if err := tab.Unmap(at(32 * units.GiB)); err != nil {
		return err
	}
	say("Unmap both mappings of the released chunk: now its memory is returned.")
	printMap(w, tab, mem)

	if err := tab.Close(); err != nil {
		return err
	}
	if err := b.Release(); err != nil {
		return err
	}
	if err := res.Free(); err != nil {
		return err
	}
	say("Close the table, release the last chunk, free the reservation.")
	printUsage(w, mem)

	if err := demoGrowth(w, say, space, mem); err != nil {
		return err
	}
	if err := demoGiveBack(w, say, space, mem); err != nil {
		return err
	}
	if err := demoStitch(w, say, space, mem); err != nil {
		return err
	}
	return demoMultidev(w, say, space, mem)
}

// demoGrowth grows an arena chunk by chunk: the base stays put and each
// step maps only the new chunk.
func demoGrowth(w io.Writer, say func(string, ...any), space *vaspace.Space, mem *physical.Memory) error {
	a, err := arena.New(space, mem, arena.Options{Device: 1, Max: 16 * units.GiB})
	if err != nil {
		return err
	}
	say("An arena reserves 16 GiB up front and commits %s chunks at its end as it grows:", units.Bytes(a.ChunkSize()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   grow by\tlength\tcommitted\tbase\tchunk maps")
	for _, n := range []uint64{units.MiB, 3 * units.MiB, 20 * units.MiB} {
		if err := a.Grow(n); err != nil {
			return err
		}
		st := a.Stats()
		fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\t%d\n", units.Bytes(n), units.Bytes(st.Len), units.Bytes(st.Committed), a.Base(), st.ChunkMaps)
	}
	_ = tw.Flush()
	if err := a.Resize(units.MiB); err != nil {
		return err
	}
	if err := a.Trim(); err != nil {
		return err
	}
	fmt.Fprintf(w, "   shrink to 1 MiB and trim: committed %s, base %s, chunk unmaps %d\n",
		units.Bytes(a.Committed()), a.Base(), a.Stats().ChunkUnmaps)
	return a.Close()
}

// demoGiveBack shows the allocator giving memory back from the middle of
// its range: free chunks between live allocations go back to the device,
// and come back when a block over them is handed out again.
func demoGiveBack(w io.Writer, say func(string, ...any), space *vaspace.Space, mem *physical.Memory) error {
	gran := space.Driver().Granularity()
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Device: 0, Max: 32 * units.MiB})
	if err != nil {
		return err
	}
	var ps []driver.Addr
	for range 6 {
		p, err := al.Alloc(gran, 0)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	for _, i := range []int{1, 2, 4} {
		if err := al.Free(ps[i]); err != nil {
			return err
		}
	}
	before := al.Stats()
	say("Giving memory back from anywhere: six %s allocations, the 2nd, 3rd and 5th freed; %s stays committed.",
		units.Bytes(gran), units.Bytes(before.Committed))
	if err := al.Trim(); err != nil {
		return err
	}
	after := al.Stats()
	fmt.Fprintf(w, "   trim: committed %s -> %s, %s given back in %d unmap events from between live allocations\n",
		units.Bytes(before.Committed), units.Bytes(after.Committed), units.Bytes(after.DecommittedBytes), after.UnmapEvents-before.UnmapEvents)
	p, err := al.Alloc(2*gran, 0)
	if err != nil {
		return err
	}
	again := al.Stats()
	fmt.Fprintf(w, "   alloc %s: at %s, where the 2nd and 3rd were (same address: %t), committed %s again\n",
		units.Bytes(2*gran), p, p == ps[1], units.Bytes(again.Committed))
	for _, q := range []driver.Addr{ps[0], ps[3], ps[5], p} {
		if err := al.Free(q); err != nil {
			return err
		}
	}
	return al.Close()
}

// demoStitch fragments an allocator and serves a request no free block
// fits by stitching scattered free chunks: no copy, no new memory.
func demoStitch(w io.Writer, say func(string, ...any), space *vaspace.Space, mem *physical.Memory) error {
	gran := space.Driver().Granularity()
	// A release threshold of one byte: the allocator keeps nothing spare
	// when it must commit more, so it stitches what is free instead.
	al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{Device: 0, Max: 64 * units.MiB, ReleaseThreshold: 1})
	if err != nil {
		return err
	}
	var ps []driver.Addr
	for range 8 {
		p, err := al.Alloc(gran, 0)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		if err := al.Free(ps[i]); err != nil {
			return err
		}
	}
	before := al.Stats()
	say("Stitching: eight %s allocations, every other one freed. %s is free in all, but the largest free range is %s.",
		units.Bytes(gran), units.Bytes(4*gran), units.Bytes(before.LargestFree))
	big, err := al.Alloc(3*gran, 0)
	if err != nil {
		return err
	}
	after := al.Stats()
	fmt.Fprintf(w, "   alloc %s: served at %s by mapping %d scattered free chunks side by side (%d map event)\n",
		units.Bytes(3*gran), big, after.ChunkMaps-before.ChunkMaps, after.MapEvents-before.MapEvents)
	fmt.Fprintf(w, "   committed before %s, after %s; stitches %d; commits %d -> %d\n",
		units.Bytes(before.Committed), units.Bytes(after.Committed), after.Stitches, before.Grows, after.Grows)
	if err := al.Free(big); err != nil {
		return err
	}
	for i := 1; i < 8; i += 2 {
		if err := al.Free(ps[i]); err != nil {
			return err
		}
	}
	return al.Close()
}

// demoMultidev stripes an arena over both devices, then moves half of it
// onto device 0 at the same addresses.
func demoMultidev(w io.Writer, say func(string, ...any), space *vaspace.Space, mem *physical.Memory) (err error) {
	gran := space.Driver().Granularity()
	a, err := multidev.New(space, mem, multidev.Options{Max: 4 * gran, ChunkSize: gran, Placement: multidev.Striped(0, 1)})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, a.Close()) }()
	if err := a.Grow(4 * gran); err != nil {
		return err
	}
	if err := a.Grant(0, 0, a.Len(), driver.AccessReadWrite); err != nil {
		return err
	}
	msg := []byte("written before the move")
	if err := a.Write(0, gran, msg); err != nil { // in the chunk on device 1
		return err
	}
	say("Several devices behind one range: %s at %s striped over devices 0 and 1 a chunk at a time, device 0 granted read-write over all of it:",
		units.Bytes(a.Len()), a.Base())
	printLayout(w, a)
	if err := a.Migrate(0, a.Len()/2, 0); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if err := a.Read(0, gran, got); err != nil {
		return err
	}
	fmt.Fprintf(w, "   migrate the first half to device 0: the base is still %s and offset %#x still reads %q\n", a.Base(), gran, got)
	printLayout(w, a)
	return a.Check()
}

// printLayout prints a multidev arena's memory map: runs of chunks on one
// device.
func printLayout(w io.Writer, a *multidev.Arena) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   offset\tsize\tdevice")
	for _, e := range a.Layout() {
		fmt.Fprintf(tw, "   %#x\t%s\t%d\n", uint64(e.Range.Base-a.Base()), units.Bytes(e.Range.Size), e.Device)
	}
	_ = tw.Flush()
}

// printMap prints the reservation's memory map, and how many kernel
// mappings the reservation costs.
func printMap(w io.Writer, tab *mapping.Table, mem *physical.Memory) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   offset\tsize\tstate\tdevice\tchunk\taccess")
	base := tab.Reservation().Base()
	for s := range tab.Spans() {
		dev, chunk, access := "-", "-", "-"
		if s.Chunk != nil {
			dev = fmt.Sprint(s.Chunk.Device())
			chunk = fmt.Sprintf("%d +%#x", s.Chunk.Handle(), s.ChunkOffset)
			var parts []string
			for d, a := range s.Access {
				if a != driver.AccessNone {
					parts = append(parts, fmt.Sprintf("dev%d:%s", d, a))
				}
			}
			access = strings.Join(parts, " ")
			if access == "" {
				access = "none"
			}
		}
		fmt.Fprintf(tw, "   %#x\t%s\t%s\t%s\t%s\t%s\n", uint64(s.Range.Base-base), units.Bytes(s.Range.Size),
			s.State, dev, chunk, access)
	}
	_ = tw.Flush()
	if es, err := procmaps.Read(); err == nil {
		r := tab.Reservation().Range()
		fmt.Fprintf(w, "   kernel mappings in the reservation: %d\n", len(procmaps.Within(es, uint64(r.Base), uint64(r.End()))))
	}
	printUsage(w, mem)
}

func printUsage(w io.Writer, mem *physical.Memory) {
	var parts []string
	for d := range mem.Driver().Devices() {
		u, err := mem.Usage(driver.DeviceID(d))
		if err != nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("device %d: %s used (peak %s) of %s", d,
			units.Bytes(u.Used), units.Bytes(u.Peak), units.Bytes(u.Capacity)))
	}
	fmt.Fprintf(w, "   %s\n", strings.Join(parts, "; "))
}
