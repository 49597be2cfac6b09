//go:build linux

package acceltest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// OpenRefusesBlockingPaths: a library path that names no regular file is
// refused before the loader opens it — a FIFO would block dlopen forever
// — and an Open of another library afterwards returns. open opens the
// vendor's driver over the library at path and closes it; name is the
// vendor library's file name. Every Open runs under a watchdog: a hang is
// a failure, and the FIFO is then opened for writing and closed so that
// the blocked loader reads an empty file and gives up.
func OpenRefusesBlockingPaths(t *testing.T, kind standin.Vendor, cfg standin.Config, name string, open func(path string) error) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, name)
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	returns := func(what, path string) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- open(path) }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				_ = f.Close()
			}
			t.Fatalf("Open of %s (%s) has not returned after 10s", what, path)
			return nil
		}
	}
	err := returns("a FIFO", fifo)
	drivertest.RequireIs(t, err, driver.ErrInvalid, fifo, "named pipe")
	err = returns("the FIFO again", fifo)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "named pipe")
	err = returns("a directory", dir)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "directory")
	err = returns("a device", "/dev/null")
	drivertest.RequireIs(t, err, driver.ErrInvalid, "device")

	lib := standin.Open(t, kind, cfg)
	require.NoError(t, returns("the stand-in, after the FIFO", lib.Path()))
}
