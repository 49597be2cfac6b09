package host_test

import (
	"testing"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
)

// TestUnmadeDriver: a nil *Driver and a zero Driver refuse every method
// with ErrInvalid instead of dereferencing books they do not have.
func TestUnmadeDriver(t *testing.T) {
	drivertest.RequireUnmadeRefused(t, (*host.Driver)(nil), &host.Driver{})
}
