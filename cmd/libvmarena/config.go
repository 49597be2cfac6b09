package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// config is what the environment asks of the library (vmarena.h documents
// each variable). It is read at the first call, and again after
// vmarena_shutdown.
type config struct {
	// Driver is host, cuda or acl.
	Driver string
	// Devices: on host the number of logical devices (nil: 1), on cuda
	// and acl the device ordinals to open (nil: every device), in the
	// numbering the caller's device argument uses.
	Devices []int
	// Capacity caps each device's memory (0: the driver's default).
	Capacity uint64
	// TagMax is the most one tag may hold on a device (0: its capacity).
	TagMax uint64
	// BackupDir is where file-mode sleeps write (default: os.TempDir).
	BackupDir string
	// HostCache is how much pinned host memory each device's Manager
	// keeps after a host-mode wake for the next sleep (0: none).
	HostCache uint64
}

// The environment variables the library reads. The vendor libraries'
// paths are the drivers' own: VMARENA_CUDA_LIBRARY and
// VMARENA_ACL_LIBRARY, which cuda.Open and acl.Open read themselves.
const (
	envDriver    = "VMARENA_DRIVER"
	envDevices   = "VMARENA_DEVICES"
	envCapacity  = "VMARENA_CAPACITY"
	envTagMax    = "VMARENA_TAG_MAX"
	envBackupDir = "VMARENA_BACKUP_DIR"
	envHostCache = "VMARENA_HOST_CACHE"
)

// configFrom reads the configuration through getenv (os.Getenv in the
// library, a map in tests). A bad value is driver.ErrInvalid naming the
// variable.
func configFrom(getenv func(string) string) (config, error) {
	c := config{Driver: getenv(envDriver), BackupDir: getenv(envBackupDir)}
	bad := func(name, v, want string) error {
		return errors.WithHintf(errors.Wrapf(driver.ErrInvalid, "libvmarena: %s=%q", name, v), "set %s to %s", name, want)
	}
	switch c.Driver {
	case "":
		c.Driver = "host"
	case "host", "cuda", "acl":
	default:
		return c, bad(envDriver, c.Driver, "host, cuda or acl")
	}
	if v := getenv(envDevices); v != "" {
		if c.Driver == "host" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > driver.MaxDevices {
				return c, bad(envDevices, v, "a number of host devices from 1 to "+strconv.Itoa(driver.MaxDevices))
			}
			for i := range n {
				c.Devices = append(c.Devices, i)
			}
		} else {
			seen := map[int]bool{}
			for _, f := range strings.Split(v, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 0 || n >= driver.MaxDevices || seen[n] {
					return c, bad(envDevices, v, "a comma-separated list of distinct device ordinals below "+strconv.Itoa(driver.MaxDevices)+", e.g. 0,1")
				}
				seen[n] = true
				c.Devices = append(c.Devices, n)
			}
		}
	}
	for _, s := range []struct {
		name string
		to   *uint64
	}{{envCapacity, &c.Capacity}, {envTagMax, &c.TagMax}, {envHostCache, &c.HostCache}} {
		if v := getenv(s.name); v != "" {
			n, err := units.Parse(v)
			if err != nil {
				return c, bad(s.name, v, "a size in bytes, e.g. 1073741824 or 1GiB")
			}
			*s.to = n
		}
	}
	if c.BackupDir == "" {
		c.BackupDir = os.TempDir()
	}
	return c, nil
}
