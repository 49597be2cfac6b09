package sim_test

import (
	"testing"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
)

// TestUnmadeDriver: a nil *Driver and a zero Driver refuse every method
// with ErrInvalid instead of dereferencing books they do not have.
func TestUnmadeDriver(t *testing.T) {
	drivertest.RequireUnmadeRefused(t, (*sim.Driver)(nil), &sim.Driver{})
}
