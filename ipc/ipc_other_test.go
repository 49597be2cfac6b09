//go:build !linux

package ipc

import (
	"path/filepath"
	"testing"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestUnsupported: off Linux, Listen and Dial answer ErrUnsupported.
func TestUnsupported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vmarena.sock")
	_, err := Listen(path, 0o600)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "needs Linux")
	_, err = Dial(path)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "needs Linux")
}
