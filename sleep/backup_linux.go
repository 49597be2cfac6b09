package sleep

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// punchHole gives the file system back the blocks under [off, off+n) of
// a backup file: the piece of an allocation freed while its tag sleeps.
// A file system that cannot punch holes keeps them until the file goes at
// wake; that is not an error.
func punchHole(f *os.File, off int64, n uint64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	return err
}
