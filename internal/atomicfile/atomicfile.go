// Package atomicfile writes a file whole or not at all: the bytes go to
// a temporary file beside it, which is renamed over the name only once
// every byte is written, so a write that fails (a full disk, a file size
// limit, a signal) leaves the name as it was — no half-written file, and
// no temporary one behind.
package atomicfile

import (
	"os"
	"path/filepath"

	"github.com/vmarena/vmarena/internal/errors"
)

// Write writes data to the file name with mode perm, replacing it (a
// symbolic link's target, not the link). On failure name is unchanged
// (absent if it was) and the temporary file is removed. The rename needs
// the directory to be writable, as creating the file does. A name (or a
// link's target) that is there and not a regular file — a directory, a
// FIFO, a device such as /dev/full — is refused and left as it is: the
// rename would replace it.
func Write(name string, data []byte, perm os.FileMode) (err error) {
	if fi, err := os.Lstat(name); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if name, err = filepath.EvalSymlinks(name); err != nil {
			return err
		}
	}
	if fi, err := os.Stat(name); err == nil && !fi.Mode().IsRegular() {
		return errors.Newf("write %s: %s is not a regular file", name, name)
	}
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "write %s", name), f.Close())
	}
	if err := f.Chmod(perm); err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "write %s", name), f.Close())
	}
	if err := f.Close(); err != nil {
		return errors.Wrapf(err, "write %s", name)
	}
	return errors.Wrapf(os.Rename(tmp, name), "write %s", name)
}
