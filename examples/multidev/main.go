// Multidev spreads one tensor over four devices behind one contiguous
// address range, striped a chunk per device in turn, and fills it through
// device 0, granted access to all of it. It prints the memory map, moves
// the first half of the tensor onto device 0 at the same addresses, prints
// the map again, and checks that every byte still reads the same.
//
//	go run ./examples/multidev [-svg DIR]
//
// With -svg it draws the memory map into DIR before and after the
// migration, a colour a device.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/examples/mapsvg"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// chunk is the devices' granularity and the arena's chunk: the stripe.
const chunk = 64 * units.KiB

// devices is how many logical devices the tensor spans.
const devices = 4

// cols and rows shape the tensor: rows of cols float32, two chunks a
// device.
const (
	cols     = 256
	rowBytes = cols * 4
	rows     = 2 * devices * chunk / rowBytes
)

func main() { os.Exit(mapsvg.Main("multidev", os.Args[1:], os.Stdout, os.Stderr, run)) }

// run runs the example, writing its output to w and, when svgDir is not
// "", its memory maps there.
func run(w io.Writer, svgDir string) (err error) {
	hd, err := host.New(host.Options{Devices: devices, Capacity: 16 * chunk, Granularity: chunk})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, hd.Close()) }()
	drv, pics, err := mapsvg.Record(hd, svgDir)
	if err != nil {
		return err
	}
	mem := physical.New(drv)
	size := uint64(rows * rowBytes)
	a, err := multidev.New(vaspace.New(drv), mem, multidev.Options{
		Max: size, ChunkSize: chunk, Placement: multidev.Striped(0, 1, 2, 3),
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, a.Close()) }()
	if err := a.Grow(size); err != nil {
		return err
	}
	// Device 0 fills and reads the whole tensor: it needs access to the
	// other devices' chunks (Grant enables its peer access to them).
	if err := a.Grant(0, 0, a.Len(), driver.AccessReadWrite); err != nil {
		return err
	}
	row := make([]byte, rowBytes)
	for r := range rows {
		for c := range cols {
			binary.LittleEndian.PutUint32(row[4*c:], math.Float32bits(float32(r)+float32(c)/1000))
		}
		if err := a.Write(0, uint64(r*rowBytes), row); err != nil {
			return err
		}
	}
	before := make([]byte, size)
	if err := a.Read(0, 0, before); err != nil {
		return err
	}
	base := a.Base()
	fmt.Fprintf(w, "A tensor of %d × %d float32 (%s) at %s, striped over %d devices in %s chunks;\n",
		rows, cols, units.Bytes(size), base, devices, units.Bytes(chunk))
	fmt.Fprintf(w, "device 0 granted read-write over all of it and wrote every row (crc32 %08x):\n",
		crc32.ChecksumIEEE(before))
	if err := printLayout(w, a, mem); err != nil {
		return err
	}
	if err := pics.Save("striped", fmt.Sprintf("A %s tensor striped over %d devices, a %s chunk each in turn", units.Bytes(size), devices, units.Bytes(chunk)),
		"Device 0 is granted read-write over all of it, so every chunk is accessible, whichever device holds it."); err != nil {
		return err
	}

	half := size / 2
	elsewhere := 0
	for off := uint64(0); off < half; off += chunk {
		dev, err := a.DeviceAt(off)
		if err != nil {
			return err
		}
		if dev != 0 {
			elsewhere++
		}
	}
	if err := a.Migrate(0, half, 0); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nMigrate(0, %s, device 0): the first half moves onto device 0, at the same addresses;\n", units.Bytes(half))
	fmt.Fprintf(w, "%d of its %d chunks were on other devices and are copied, the one on device 0 stays:\n",
		elsewhere, half/chunk)
	if err := printLayout(w, a, mem); err != nil {
		return err
	}
	if err := pics.Save("migrated", fmt.Sprintf("Migrate(0, %s, device 0): the first half on device 0, at the same addresses", units.Bytes(half)),
		fmt.Sprintf("%d of its %d chunks were on other devices: each was copied into a new chunk on device 0, mapped where the old one was.", elsewhere, half/chunk)); err != nil {
		return err
	}

	after := make([]byte, size)
	if err := a.Read(0, 0, after); err != nil {
		return err
	}
	same := bytes.Equal(before, after)
	fmt.Fprintf(w, "\nBase %s (moved: %v); all %s read back by device 0 are the same: %v (crc32 %08x)\n",
		a.Base(), a.Base() != base, units.Bytes(size), same, crc32.ChecksumIEEE(after))
	if !same {
		return errors.AssertionFailedf("multidev: the tensor's bytes changed in the migration")
	}
	if base != a.Base() {
		return errors.AssertionFailedf("multidev: the base moved from %s to %s", base, a.Base())
	}
	return a.Check()
}

// printLayout prints the arena's memory map, one line per run of chunks
// on one device, and what each device holds.
func printLayout(w io.Writer, a *multidev.Arena, mem *physical.Memory) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  offset\tsize\tdevice")
	for _, e := range a.Layout() {
		fmt.Fprintf(tw, "  %#x\t%s\t%d\n", uint64(e.Range.Base-a.Base()), units.Bytes(e.Range.Size), e.Device)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var parts []string
	for d := range devices {
		u, err := mem.Usage(driver.DeviceID(d))
		if err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("device %d %s", d, units.Bytes(u.Used)))
	}
	fmt.Fprintf(w, "  in use: %s\n", strings.Join(parts, ", "))
	return nil
}
