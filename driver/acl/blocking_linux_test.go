package acl

import (
	"testing"

	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// TestOpenBlockingPath: Open of a library path that is a FIFO (dlopen
// would block on it forever, and every later Open behind it) is refused
// at once with ErrInvalid, and a later Open returns.
func TestOpenBlockingPath(t *testing.T) {
	acceltest.OpenRefusesBlockingPaths(t, standin.ACL, small, "libascendcl.so", func(path string) error {
		d, err := Open(Options{Library: path})
		if err != nil {
			return err
		}
		return d.Close()
	})
}
