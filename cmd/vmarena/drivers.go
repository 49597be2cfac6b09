package main

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// driverNames are the backends --driver accepts.
var driverNames = []string{"host", "sim", "cuda", "acl"}

// driverFlag is a --driver flag: a backend by name.
type driverFlag string

func (d *driverFlag) String() string { return string(*d) }
func (d *driverFlag) Set(v string) error {
	for _, n := range driverNames {
		if v == n {
			*d = driverFlag(v)
			return nil
		}
	}
	return errors.Newf("unknown driver %q, want %s", v, orList(driverNames))
}

// orList joins names as "a, b, c or d".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// vendor reports whether a --driver names a vendor runtime, which loads a
// library (--library) and opens real devices.
func vendor(name string) bool { return name == "cuda" || name == "acl" }

// backend is the driver a command runs on: its name, and for cuda and acl
// the vendor library to load ("" for the default or the environment's).
type backend struct {
	name    string
	library string
}

// open opens the backend with want devices — for cuda and acl the first
// want the runtime sees, or all of them when it sees fewer (the caller
// checks the count it needs) — each capped at capacity(g), where g is the
// devices' granularity: hostGran on host and sim (0 for their default,
// 2 MiB), the largest minimum granularity of the devices on cuda and acl.
// A capacity of 0 leaves the driver's own: a vendor device's memory, the
// host driver's share of the machine, the sim driver's 80 GiB.
func (b backend) open(want int, hostGran uint64, capacity func(gran uint64) uint64) (driver.Driver, error) {
	switch b.name {
	case "host":
		return host.New(host.Options{Devices: want, Granularity: hostGran, Capacity: capacity(cmp.Or(hostGran, 2*units.MiB))})
	case "sim":
		return sim.New(sim.Options{Devices: want, Granularity: hostGran, Capacity: capacity(cmp.Or(hostGran, 2*units.MiB))})
	case "cuda":
		rep, err := cuda.Probe(b.library)
		if err != nil {
			return nil, err
		}
		ords, gran, err := firstDevices(rep.Devices, want, func(d cuda.DeviceReport) (int, uint64) { return d.Ordinal, d.MinGranularity })
		if err != nil {
			return nil, errors.Wrapf(err, "cuda: %s sees no GPU", rep.Library)
		}
		return cuda.Open(cuda.Options{Library: b.library, Devices: ords, Capacity: capacity(gran)})
	case "acl":
		rep, err := acl.Probe(b.library)
		if err != nil {
			return nil, err
		}
		ids, gran, err := firstDevices(rep.Devices, want, func(d acl.DeviceReport) (int, uint64) { return d.ID, d.MinGranularity })
		if err != nil {
			return nil, errors.Wrapf(err, "acl: %s sees no NPU", rep.Library)
		}
		return acl.Open(acl.Options{Library: b.library, Devices: ids, Capacity: capacity(gran)})
	}
	return nil, errors.AssertionFailedf("vmarena: driver %q has no opener", b.name)
}

// deviceNames lists the devices' names, once each with a count where
// several share one: "2 × NVIDIA H100 80GB HBM3".
func deviceNames(devs []driver.Device) string {
	var names []string
	count := map[string]int{}
	for _, d := range devs {
		if count[d.Name] == 0 {
			names = append(names, d.Name)
		}
		count[d.Name]++
	}
	for i, n := range names {
		if count[n] > 1 {
			names[i] = fmt.Sprintf("%d × %s", count[n], n)
		}
	}
	return strings.Join(names, ", ")
}

// firstDevices are the vendor's IDs of the first want devices of a probe's
// report (or all, when it has fewer) and the largest of their minimum
// granularities; driver.ErrNoDevice when the report has none.
func firstDevices[D any](devs []D, want int, idGran func(D) (int, uint64)) (ids []int, gran uint64, err error) {
	for _, d := range devs[:min(want, len(devs))] {
		id, g := idGran(d)
		ids = append(ids, id)
		gran = max(gran, g)
	}
	if len(ids) == 0 {
		return nil, 0, driver.ErrNoDevice
	}
	return ids, gran, nil
}
