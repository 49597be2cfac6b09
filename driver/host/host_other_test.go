//go:build !linux

package host

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestNewUnsupported: off Linux, New answers ErrUnsupported, saying why.
func TestNewUnsupported(t *testing.T) {
	d, err := New(Options{})
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "needs Linux")
	if d != nil {
		t.Fatalf("New returned a driver with its error")
	}
}
