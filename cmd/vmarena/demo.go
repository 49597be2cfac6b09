package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/examples/mapsvg"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

const demoUsage = `usage: vmarena demo [--driver host|sim|cuda|acl] [--library PATH] [--svg DIR] [--json]

Walks through reserve, map, access, aliasing and release, printing the
memory map after each step, then a growing arena, memory given back from
anywhere, stitching, and an arena striped over two devices. The host driver
(the default) needs no GPU; on sim the steps that move bytes are skipped;
on cuda and acl it uses the first two devices, at most 32 granules of each,
and frees everything it made. With --svg it also draws the memory map of
each step as DIR/step-NN-<what>.svg: granules coloured by state and device,
chunks labelled, aliases outlined.
`

// demoCmd runs `vmarena demo`: 0 when the demo ran to the end, 1 when a
// step failed or the driver cannot run here, 2 on bad usage.
func demoCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("demo", stderr)
	drv := driverFlag("host")
	fs.Var(&drv, "driver", "the `DRIVER` to run on: "+orList(driverNames))
	library := fs.String("library", "", "the vendor library to load for --driver cuda or acl, a `PATH` or soname")
	svg := fs.String("svg", "", "draw the memory map of each step as an SVG picture into `DIR` (made if need be)")
	jsonOut := fs.Bool("json", false, jsonHelp)
	bad := func(format string, args ...any) int { return usageError(stderr, "demo", format, args...) }
	if code, ok := parseFlags(fs, "demo", demoUsage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	if *library != "" && !vendor(string(drv)) {
		return bad("--library is for --driver cuda or acl; the %s driver loads no library", drv)
	}
	svgSet := false
	fs.Visit(func(f *flag.Flag) { svgSet = svgSet || f.Name == "svg" })
	if svgSet && *svg == "" {
		return bad("--svg needs a directory")
	}
	if *svg != "" {
		// Made, and checked to take a file, before the demo runs, so that a
		// bad --svg fails at once.
		if err := mapsvg.Writable(*svg); err != nil {
			fmt.Fprintf(stderr, "vmarena demo: %v\n", err)
			return 1
		}
	}
	if *jsonOut {
		return demoJSONCmd(stdout, stderr, backend{name: string(drv), library: *library}, *svg)
	}
	if err := demo(stdout, backend{name: string(drv), library: *library}, *svg); err != nil {
		fmt.Fprintf(stderr, "vmarena demo: %v\n", err)
		return 1
	}
	return 0
}

// demoDevices is how many devices the demo uses, and demoGranules each
// one's capacity in granules: 64 MiB at 2 MiB, the most it commits on a
// GPU or NPU.
const (
	demoDevices  = 2
	demoGranules = 32
)

// demoRun is one run of the demo: its driver and the core objects over it,
// what the driver can show, and the numbered steps printed so far.
type demoRun struct {
	w     io.Writer
	drv   driver.Driver
	space *vaspace.Space
	mem   *physical.Memory
	step  int
	// pics draws each step's memory map (nil without --svg): slug and
	// title are the current step's, pictured whether it is drawn, names
	// what the part calls its reservations (by base), and picErr the first
	// failure to write one.
	pics        *demoPictures
	slug, title string
	pictured    bool
	names       map[driver.Addr]string
	picErr      error
	// noBytes and noSecond say why parts of the demo cannot run on this
	// driver, and are empty where they can: moving bytes needs
	// driver.FeatureHostAccess (the sim driver keeps the books only), and
	// a second device's part needs a second device that can reach device
	// 0's memory and be reached by it.
	noBytes, noSecond string
	// doc is the document of --json (nil without), whose steps take what
	// each printed to text, the buffer w writes to.
	doc  *DemoJSON
	text *bytes.Buffer
}

// say starts the next numbered step; slug names its picture.
func (d *demoRun) say(slug, format string, args ...any) {
	d.endStep()
	d.step++
	d.slug, d.title, d.pictured = slug, fmt.Sprintf(format, args...), false
	fmt.Fprintf(d.w, "\n%d. %s\n", d.step, d.title)
	d.startStep()
}

// name names the reservation at base in the pictures.
func (d *demoRun) name(base driver.Addr, name string) {
	if d.names == nil {
		d.names = map[driver.Addr]string{}
	}
	d.names[base] = name
}

// nameAllocator names an allocator's ranges in the pictures, in the order
// Ranges lists them: its heaps, then its stitch range.
func (d *demoRun) nameAllocator(al *arena.Allocator) {
	rs := al.Ranges()
	for i, r := range rs {
		switch {
		case i == len(rs)-1 && len(rs) == 3:
			d.name(r.Base, "the allocator's stitch range")
		case i == 0:
			d.name(r.Base, "the allocator's heap of small requests")
		default:
			d.name(r.Base, "the allocator's heap of large requests")
		}
	}
}

// picture draws the memory map now as the current step's picture, once a
// step, with notes under it (with --svg; otherwise it does nothing).
func (d *demoRun) picture(notes ...string) {
	if d.pics == nil || d.pictured || d.picErr != nil {
		return
	}
	d.pictured = true
	if err := d.pics.write(d.step, d.slug, d.title, d.names, notes); err != nil {
		d.picErr = errors.Wrapf(err, "the picture of step %d", d.step)
	}
}

// refused prints the error a refused call returned.
func (d *demoRun) refused(err error) {
	if err == nil {
		fmt.Fprintln(d.w, "   !! expected a refusal, got none")
		d.jsonRefused("")
		return
	}
	fmt.Fprintf(d.w, "   refused: %v\n", err)
	d.jsonRefused(err.Error())
}

// skipped says that part of a step cannot run on this driver, and why.
func (d *demoRun) skipped(what, why string) {
	fmt.Fprintf(d.w, "   skipped: %s: %s\n", what, why)
	d.jsonSkipped(what + ": " + why)
}

// secondDevice says why the demo cannot use a second device of drv, or
// "" when it can: it needs two devices that reach each other's memory
// (CanAccessPeer; a driver without streams cannot be asked, and its
// devices are taken to be peers).
func secondDevice(drv driver.Driver) string {
	if len(drv.Devices()) < 2 {
		return fmt.Sprintf("the %s driver has one device", drv.Name())
	}
	if b, ok := drv.(interface{ ReservationsBindOneDevice() bool }); ok && b.ReservationsBindOneDevice() {
		return fmt.Sprintf("the %s driver binds a reservation to one device's memory (AscendCL)", drv.Name())
	}
	s, ok := drv.(driver.Streams)
	if !ok {
		return ""
	}
	to, err := s.CanAccessPeer(0, 1)
	if err != nil {
		return err.Error()
	}
	from, err := s.CanAccessPeer(1, 0)
	if err != nil {
		return err.Error()
	}
	if !to || !from {
		return fmt.Sprintf("devices 0 and 1 of the %s driver cannot reach each other's memory (no peer access)", drv.Name())
	}
	return ""
}

// demo walks through the core: a 64 GiB reservation, chunks of two
// devices mapped into it, access granted and revoked per device, a chunk
// aliased at two addresses, release while mapped, and every refusal as the
// error a user would see; then a growing arena, stitching, and an arena
// striped over both devices, half of it migrated. On the host driver it
// runs on two logical devices of 64 MiB; elsewhere on at most two devices
// of demoGranules granules each. Parts that move bytes are skipped on a
// driver without host access (sim), parts of a second device on a driver
// with one or with two that are not peers; every step is still numbered.
// With svg not "", each step's memory map is drawn into that directory.
func demo(w io.Writer, b backend, svg string) (err error) {
	return demoTo(w, b, svg, nil)
}

// demoTo runs the demo as demo does, and with doc not nil fills it in:
// w is then a *bytes.Buffer whose text goes into doc's steps.
func demoTo(w io.Writer, b backend, svg string, doc *DemoJSON) (err error) {
	drv, err := b.open(demoDevices, 0, func(gran uint64) uint64 { return demoGranules * gran })
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	var pics *demoPictures
	if svg != "" {
		rec, p, err := recordDriver(drv, svg)
		if err != nil {
			return err
		}
		drv, pics = rec, p
	}
	d := &demoRun{w: w, drv: drv, space: vaspace.New(drv), mem: physical.New(drv),
		noSecond: secondDevice(drv), pics: pics, doc: doc}
	if doc != nil {
		d.text = w.(*bytes.Buffer)
		defer d.endJSON(drv.Granularity())
	}
	if !drv.Supports(driver.FeatureHostAccess) {
		d.noBytes = fmt.Sprintf("the %s driver has no memory behind its ranges (no %s)", drv.Name(), driver.FeatureHostAccess)
	}
	devs := drv.Devices()
	gran := drv.Granularity()
	switch b.name {
	case "host":
		fmt.Fprintf(w, "vmarena demo: host driver, 2 logical devices of %s, granularity %s\n",
			units.Bytes(devs[0].Capacity), units.Bytes(gran))
	case "sim":
		fmt.Fprintf(w, "vmarena demo: sim driver, %s of %s with no memory behind them, granularity %s\n",
			plural(len(devs), "device"), units.Bytes(devs[0].Capacity), units.Bytes(gran))
	default:
		fmt.Fprintf(w, "vmarena demo: %s driver, %s (%s), %s of each for the demo, granularity %s\n",
			drv.Name(), plural(len(devs), "device"), deviceNames(devs), units.Bytes(devs[0].Capacity), units.Bytes(gran))
	}
	for _, part := range []func() error{d.core, d.growth, d.giveBack, d.stitch, d.multidev} {
		d.names = nil // each part names its own reservations; addresses are reused
		if err := part(); err != nil {
			return err
		}
		if d.picErr != nil {
			return d.picErr
		}
	}
	return nil
}

// core is the walk through reservations, chunks, mappings and access.
// On an error it unmaps what it mapped, so the driver can close.
func (d *demoRun) core() (err error) {
	w, mem, gran := d.w, d.mem, d.drv.Granularity()
	// other is the device that reads what device 0 writes: device 1, or
	// device 0 itself where there is no second device to use.
	other := driver.DeviceID(0)
	if d.noSecond == "" {
		other = 1
	}
	res, err := d.space.Reserve(64*units.GiB, 0)
	if err != nil {
		return err
	}
	tab, err := mapping.New(res, mem)
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			err = errors.CombineErrors(err, tab.Close())
		}
	}()
	at := func(off uint64) driver.Addr { return res.Base() + driver.Addr(off) }
	d.name(res.Base(), "the demo's reservation")
	d.say("reserve", "Reserve 64 GiB of address space: no memory behind it yet.")
	d.printMap(tab)

	a, err := mem.Create(0, 2*gran, driver.ChunkOptions{})
	if err != nil {
		return err
	}
	b, err := mem.Create(other, gran, driver.ChunkOptions{})
	if err != nil {
		return err
	}
	if err := tab.Map(at(0), a); err != nil {
		return err
	}
	if err := tab.Map(at(2*gran), b); err != nil {
		return err
	}
	if d.noSecond == "" {
		d.say("map-two-chunks", "Create %s on device 0 and %s on device 1 and map them side by side: one contiguous range backed by two devices, inaccessible until granted.",
			units.Bytes(a.Size()), units.Bytes(b.Size()))
	} else {
		d.say("map-two-chunks", "Create %s and %s on device 0 and map them side by side: one contiguous range backed by two chunks, inaccessible until granted.",
			units.Bytes(a.Size()), units.Bytes(b.Size()))
	}
	d.printMap(tab)

	if err := tab.SetAccess(at(0), 3*gran, 0, driver.AccessReadWrite); err != nil {
		return err
	}
	if d.noSecond == "" {
		if err := tab.SetAccess(at(0), gran, 1, driver.AccessRead); err != nil {
			return err
		}
		d.say("grant-access", "Grant device 0 read-write over all three granules, and device 1 read over the first only.")
	} else {
		d.say("grant-access", "Grant device 0 read-write over all three granules.")
		d.skipped("device 1's read access over the first", d.noSecond)
	}
	d.printMap(tab)

	msg := []byte("hello from device 0")
	got := make([]byte, len(msg))
	if d.noBytes == "" {
		if err := tab.Write(0, at(0), msg); err != nil {
			return err
		}
		if err := tab.Read(other, at(0), got); err != nil {
			return err
		}
		if d.noSecond == "" {
			d.say("write-read", "Device 0 writes %q at the base; device 1 reads it back: %q.", msg, got)
		} else {
			d.say("write-read", "Device 0 writes %q at the base and reads it back: %q.", msg, got)
		}
	} else {
		d.say("write-read", "Device 0 writes %q at the base; device %d reads it back.", msg, other)
		d.skipped("the write and the read", d.noBytes)
	}
	if d.noSecond == "" {
		fmt.Fprintln(w, "   device 1 writing there:")
		d.refused(tab.Write(1, at(0), msg))
		fmt.Fprintln(w, "   device 1 reading the second granule, which it was not granted:")
		d.refused(tab.Read(1, at(gran), got))
	} else {
		d.skipped("device 1 writing there, and reading what it was not granted", d.noSecond)
	}
	d.picture("Reads and writes change no state: the map is the last step's.")

	if err := tab.Map(at(32*units.GiB), a); err != nil {
		return err
	}
	if err := tab.SetAccess(at(32*units.GiB), gran, other, driver.AccessRead); err != nil {
		return err
	}
	if d.noBytes == "" {
		alias := make([]byte, len(msg))
		if err := tab.Read(other, at(32*units.GiB), alias); err != nil {
			return err
		}
		d.say("alias", "Alias: map the same %s chunk again 32 GiB further on. Device %d reads %q through the alias: one chunk, two addresses.",
			units.Bytes(a.Size()), other, alias)
	} else {
		d.say("alias", "Alias: map the same %s chunk again 32 GiB further on, device %d granted read through it: one chunk, two addresses.",
			units.Bytes(a.Size()), other)
		d.skipped("the read through the alias", d.noBytes)
	}
	d.printMap(tab)

	d.say("refusals", "Refusals, each leaving everything as it was:")
	d.refused(tab.Map(at(gran), b))
	d.refused(tab.Unmap(at(gran)))
	d.refused(tab.SetAccess(at(4*gran), gran, 0, driver.AccessRead))
	d.refused(tab.Read(0, at(8*gran), got))
	_, oom := mem.Create(0, d.drv.Devices()[0].Capacity, driver.ChunkOptions{})
	d.refused(oom)
	d.refused(res.Free())
	d.picture("Each refusal left the map as it was.")

	if err := tab.SetAccess(at(0), 3*gran, 0, driver.AccessNone); err != nil {
		return err
	}
	d.say("revoke", "Revoke device 0's access; reading now fails instead of crashing:")
	d.refused(tab.Read(0, at(0), got))
	d.printMap(tab)

	if err := a.Release(); err != nil {
		return err
	}
	d.say("release-handle", "Release the aliased chunk's handle while both mappings live: its memory stays until the last mapping goes.")
	d.picture(fmt.Sprintf("Chunk %d's handle is released (dashed): both mappings still hold its memory.", a.Handle()))
	d.printUsage()
	if err := tab.Unmap(at(0)); err != nil {
		return err
	}
	if err := tab.Unmap(at(32 * units.GiB)); err != nil {
		return err
	}
	d.say("unmap", "Unmap both mappings of the released chunk: now its memory is returned.")
	d.printMap(tab)

	done = true
	if err := tab.Close(); err != nil {
		return err
	}
	if err := b.Release(); err != nil {
		return err
	}
	if err := res.Free(); err != nil {
		return err
	}
	d.say("free", "Close the table, release the last chunk, free the reservation.")
	d.picture()
	d.printUsage()
	return nil
}

// growth grows an arena chunk by chunk: the base stays put and each step
// maps only the new chunk.
func (d *demoRun) growth() (err error) {
	dev := driver.DeviceID(len(d.drv.Devices()) - 1) // device 1 where there is one
	a, err := arena.New(d.space, d.mem, arena.Options{Device: dev, Max: 16 * units.GiB})
	if err != nil {
		return err
	}
	d.name(a.Base(), "the arena's range")
	defer func() {
		if err != nil {
			err = errors.CombineErrors(err, a.Close())
		}
	}()
	d.say("arena-grows", "An arena reserves 16 GiB up front and commits %s chunks at its end as it grows:", units.Bytes(a.ChunkSize()))
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   grow by\tlength\tcommitted\tbase\tchunk maps")
	for _, n := range []uint64{units.MiB, 3 * units.MiB, 20 * units.MiB} {
		if err := a.Grow(n); err != nil {
			return err
		}
		st := a.Stats()
		fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\t%d\n", units.Bytes(n), units.Bytes(st.Len), units.Bytes(st.Committed), a.Base(), st.ChunkMaps)
	}
	_ = tw.Flush()
	d.picture(fmt.Sprintf("After the last grow: %s committed at the start of the 16 GiB, a chunk a mapping; then it shrinks to 1 MiB.",
		units.Bytes(a.Committed())))
	if err := a.Resize(units.MiB); err != nil {
		return err
	}
	if err := a.Trim(); err != nil {
		return err
	}
	fmt.Fprintf(d.w, "   shrink to 1 MiB and trim: committed %s, base %s, chunk unmaps %d\n",
		units.Bytes(a.Committed()), a.Base(), a.Stats().ChunkUnmaps)
	return a.Close()
}

// liveAllocations are an allocator's live allocations in the demo, so
// that an error part-way frees them and closes the allocator: nothing of
// the demo's stays mapped on a device.
type liveAllocations struct {
	al   *arena.Allocator
	live map[driver.Addr]bool
}

func (l *liveAllocations) alloc(size uint64) (driver.Addr, error) {
	p, err := l.al.Alloc(size, 0)
	if err == nil {
		l.live[p] = true
	}
	return p, err
}

func (l *liveAllocations) free(p driver.Addr) error {
	delete(l.live, p)
	return l.al.Free(p)
}

// close frees what is still live and closes the allocator.
func (l *liveAllocations) close() error {
	var err error
	for p := range l.live {
		err = errors.CombineErrors(err, l.free(p))
	}
	return errors.CombineErrors(err, l.al.Close())
}

// newAllocator makes an allocator on device 0 whose chunks are one
// granule each, so the demo's figures speak of granules on any driver.
func (d *demoRun) newAllocator(opts arena.AllocatorOptions) (*liveAllocations, error) {
	opts.ChunkSize = d.drv.Granularity()
	al, err := arena.NewAllocator(d.space, d.mem, opts)
	if err != nil {
		return nil, err
	}
	return &liveAllocations{al: al, live: map[driver.Addr]bool{}}, nil
}

// giveBack shows the allocator giving memory back from the middle of its
// range: free chunks between live allocations go back to the device, and
// come back when a block over them is handed out again.
func (d *demoRun) giveBack() (err error) {
	gran := d.drv.Granularity()
	l, err := d.newAllocator(arena.AllocatorOptions{Device: 0, Max: 16 * gran})
	if err != nil {
		return err
	}
	d.nameAllocator(l.al)
	defer func() { err = errors.CombineErrors(err, l.close()) }()
	var ps []driver.Addr
	for range 6 {
		p, err := l.alloc(gran)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	for _, i := range []int{1, 2, 4} {
		if err := l.free(ps[i]); err != nil {
			return err
		}
	}
	before := l.al.Stats()
	d.say("give-back", "Giving memory back from anywhere: six %s allocations, the 2nd, 3rd and 5th freed; %s stays committed.",
		units.Bytes(gran), units.Bytes(before.Committed))
	if err := l.al.Trim(); err != nil {
		return err
	}
	after := l.al.Stats()
	fmt.Fprintf(d.w, "   trim: committed %s -> %s, %s given back in %d unmap events from between live allocations\n",
		units.Bytes(before.Committed), units.Bytes(after.Committed), units.Bytes(after.DecommittedBytes), after.UnmapEvents-before.UnmapEvents)
	d.picture(fmt.Sprintf("After the trim: %s committed; the freed chunks between live allocations went back to the device (the gaps), then an alloc of %s maps two again.",
		units.Bytes(after.Committed), units.Bytes(2*gran)))
	p, err := l.alloc(2 * gran)
	if err != nil {
		return err
	}
	again := l.al.Stats()
	fmt.Fprintf(d.w, "   alloc %s: at %s, where the 2nd and 3rd were (same address: %t), committed %s again\n",
		units.Bytes(2*gran), p, p == ps[1], units.Bytes(again.Committed))
	return nil
}

// stitch fragments an allocator and serves a request no free block fits
// by stitching scattered free chunks: no copy, no new memory.
func (d *demoRun) stitch() (err error) {
	gran := d.drv.Granularity()
	// A release threshold of one byte: the allocator keeps nothing spare
	// when it must commit more. Its address space is its Max, eight
	// chunks: once they are committed no hole has room to move free chunks
	// to (which an allocator with room does, arena.Allocator says), so it
	// stitches what is free instead.
	l, err := d.newAllocator(arena.AllocatorOptions{Device: 0, Max: 8 * gran, AddressSpace: 8 * gran, ReleaseThreshold: 1})
	if err != nil {
		return err
	}
	d.nameAllocator(l.al)
	defer func() { err = errors.CombineErrors(err, l.close()) }()
	var ps []driver.Addr
	for range 8 {
		p, err := l.alloc(gran)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		if err := l.free(ps[i]); err != nil {
			return err
		}
	}
	before := l.al.Stats()
	d.say("stitch", "Stitching: eight %s allocations fill an allocator with no address space to spare, every other one freed. %s is free in all, but the largest free range is %s.",
		units.Bytes(gran), units.Bytes(4*gran), units.Bytes(before.LargestFree))
	big, err := l.alloc(3 * gran)
	if err != nil {
		return err
	}
	after := l.al.Stats()
	fmt.Fprintf(d.w, "   alloc %s: served at %s by mapping %d scattered free chunks side by side (%d map event)\n",
		units.Bytes(3*gran), big, after.ChunkMaps-before.ChunkMaps, after.MapEvents-before.MapEvents)
	d.picture(fmt.Sprintf("After the alloc of %s: each free chunk it took is mapped twice (outlined), where it lies and in the stitch range.",
		units.Bytes(3*gran)))
	fmt.Fprintf(d.w, "   committed before %s, after %s; stitches %d; commits %d -> %d\n",
		units.Bytes(before.Committed), units.Bytes(after.Committed), after.Stitches, before.Grows, after.Grows)
	return nil
}

// multidev stripes an arena over both devices, then moves half of it onto
// device 0 at the same addresses.
func (d *demoRun) multidev() (err error) {
	w, gran := d.w, d.drv.Granularity()
	if d.noSecond != "" {
		d.say("multidev", "Several devices behind one range: an arena striped over devices 0 and 1, half of it migrated to device 0.")
		d.skipped("the striped arena", d.noSecond)
		d.picture()
		return nil
	}
	a, err := multidev.New(d.space, d.mem, multidev.Options{Max: 4 * gran, ChunkSize: gran, Placement: multidev.Striped(0, 1)})
	if err != nil {
		return err
	}
	d.name(a.Base(), "the striped arena's range")
	defer func() { err = errors.CombineErrors(err, a.Close()) }()
	if err := a.Grow(4 * gran); err != nil {
		return err
	}
	if err := a.Grant(0, 0, a.Len(), driver.AccessReadWrite); err != nil {
		return err
	}
	msg := []byte("written before the move")
	if d.noBytes == "" {
		if err := a.Write(0, gran, msg); err != nil { // in the chunk on device 1
			return err
		}
	}
	d.say("multidev", "Several devices behind one range: %s at %s striped over devices 0 and 1 a chunk at a time, device 0 granted read-write over all of it:",
		units.Bytes(a.Len()), a.Base())
	printLayout(w, a)
	if err := a.Migrate(0, a.Len()/2, 0); err != nil {
		return err
	}
	if d.noBytes == "" {
		got := make([]byte, len(msg))
		if err := a.Read(0, gran, got); err != nil {
			return err
		}
		fmt.Fprintf(w, "   migrate the first half to device 0: the base is still %s and offset %#x still reads %q\n", a.Base(), gran, got)
	} else {
		fmt.Fprintf(w, "   migrate the first half to device 0: the base is still %s\n", a.Base())
		d.skipped(fmt.Sprintf("writing at offset %#x before the move and reading it after", gran), d.noBytes)
	}
	printLayout(w, a)
	d.picture("After the migration: the first half on device 0, at the same addresses; it was striped over devices 0 and 1.")
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

// printMap prints the reservation's memory map as the table keeps it;
// on the host driver also how many kernel mappings (/proc/self/maps) the
// reservation costs.
func (d *demoRun) printMap(tab *mapping.Table) {
	d.picture()
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   offset\tsize\tstate\tdevice\tchunk\taccess")
	base := tab.Reservation().Base()
	d.jsonMap(tab)
	for s := range tab.Spans() {
		dev, chunk, access := "-", "-", "-"
		if s.Chunk != nil {
			dev = fmt.Sprint(s.Chunk.Device())
			chunk = fmt.Sprintf("%d +%#x", s.Chunk.Handle(), s.ChunkOffset)
			var parts []string
			for id, a := range s.Access {
				if a != driver.AccessNone {
					parts = append(parts, fmt.Sprintf("dev%d:%s", id, a))
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
	if d.drv.Devices()[0].Kind == driver.KindHost {
		if es, err := procmaps.Read(); err == nil {
			r := tab.Reservation().Range()
			fmt.Fprintf(d.w, "   kernel mappings in the reservation: %d\n", len(procmaps.Within(es, uint64(r.Base), uint64(r.End()))))
		}
	}
	d.printUsage()
}

// printUsage prints each device's memory in use, its peak and capacity.
func (d *demoRun) printUsage() {
	var parts []string
	d.jsonUsageReset()
	for dev := range d.drv.Devices() {
		u, err := d.mem.Usage(driver.DeviceID(dev))
		if err != nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("device %d: %s used (peak %s) of %s", dev,
			units.Bytes(u.Used), units.Bytes(u.Peak), units.Bytes(u.Capacity)))
		d.jsonUsage(dev, u.Used, u.Peak, u.Capacity)
	}
	fmt.Fprintf(d.w, "   %s\n", strings.Join(parts, "; "))
}
