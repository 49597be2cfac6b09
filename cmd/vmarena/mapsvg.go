package main

import (
	"fmt"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/examples/mapsvg"
)

// The demo's pictures (vmarena demo --svg DIR): examples/mapsvg wraps the
// driver so that every reservation, chunk, mapping and grant it is asked
// for is kept, and each step writes the picture of its moment. The book is
// the driver's view, so the steps of arenas and allocators are drawn as
// well as those of the demo's own table.

// demoPictures writes the demo's pictures.
type demoPictures struct{ rec *mapsvg.Recorder }

// recordDriver returns d wrapped so that its memory map is kept, and the
// pictures that draw it into dir.
func recordDriver(d driver.Driver, dir string) (driver.Driver, *demoPictures, error) {
	drv, rec, err := mapsvg.Record(d, dir)
	if err != nil {
		return nil, nil, err
	}
	return drv, &demoPictures{rec: rec}, nil
}

// write writes the memory map now as step's picture, DIR/step-NN-slug.svg,
// the reservations that names has named so (by base address).
func (p *demoPictures) write(step int, slug, title string, names map[driver.Addr]string, notes []string) error {
	pic := p.rec.Picture(fmt.Sprintf("Step %d. %s", step, title))
	pic.Notes = notes
	for i := range pic.Ranges {
		if n, ok := names[driver.Addr(pic.Ranges[i].Base)]; ok {
			pic.Ranges[i].Name = n
		}
	}
	return p.rec.WriteStep(step, slug, pic)
}
