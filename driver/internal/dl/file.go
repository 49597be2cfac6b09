package dl

import (
	"io/fs"
	"os"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// CheckFile refuses, with driver.ErrInvalid, a library path that names
// something other than a regular file (after symbolic links): the loader
// would open it and read it, and opening a FIFO blocks until a writer
// comes — forever, in the middle of dlopen — while a device or a
// directory is no library either. A name without a slash is a soname the
// loader searches for on its own path, which the loader alone resolves:
// it is not checked. A path that does not exist passes, for the loader to
// report.
func CheckFile(path string) error {
	if !strings.Contains(path, "/") {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	var what string
	switch m := fi.Mode(); {
	case m.IsRegular():
		return nil
	case m&fs.ModeNamedPipe != 0:
		what = "a named pipe (FIFO)"
	case m.IsDir():
		what = "a directory"
	case m&fs.ModeDevice != 0:
		what = "a device"
	case m&fs.ModeSocket != 0:
		what = "a socket"
	default:
		what = "not a regular file"
	}
	return errors.WithHint(
		errors.Wrapf(driver.ErrInvalid, "cannot load %s: it is %s, not a library file", path, what),
		"name the vendor's shared library (a regular file) or its soname")
}
