package cuda_test

import (
	"testing"

	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestUnmadeDriver: a nil *Driver and a zero Driver refuse every method
// with ErrInvalid instead of dereferencing what they do not have.
func TestUnmadeDriver(t *testing.T) {
	drivertest.RequireUnmadeRefused(t, (*cuda.Driver)(nil), &cuda.Driver{})
}
