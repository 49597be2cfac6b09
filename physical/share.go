package physical

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Sharing chunks between processes (AscendCL's
// aclrtMemExportToShareableHandle / aclrtMemImportFromShareableHandle and
// CUDA's cuMemExportToShareableHandle / cuMemImportFromShareableHandle). The exporter exports a chunk once — one
// shareable handle per chunk per process — naming the process IDs allowed
// to import it (AscendCL's aclrtMemSetPidToShareableHandle); the importer
// makes a chunk of its own from the handle. Each process releases its own
// chunk; the memory goes when every process has released it and unmapped
// it. Moving the handle between processes is package ipc's.

// Export makes the chunk's shareable handle — once: a second Export is
// ErrBusy — and sets the processes allowed to import it. The chunk keeps
// the handle (Exported) until its memory is returned here: a descriptor
// in it (HandlePOSIXFD) is the chunk's, which closes it then, so the
// caller sends it (package ipc does) and never closes it — a descriptor
// closed early is a number the chunk would later close under whatever
// file the process has opened on it since. A driver that
// keeps an allow-list of its own (driver.AllowList: AscendCL's tokens) is
// given allowPIDs too; if it refuses them, the chunk stays exported with
// nobody allowed to import it, and the error says so (SetAllowedPIDs
// retries).
func (c *Chunk) Export(allowPIDs ...int) (driver.Shareable, error) {
	what := func() string { return fmt.Sprintf("physical: export %s", c) }
	if err := c.made("export"); err != nil {
		return driver.Shareable{}, err
	}
	if err := driver.CheckPIDs(what, allowPIDs); err != nil {
		return driver.Shareable{}, err
	}
	sh, ok := c.m.d.(driver.Sharing)
	if !ok {
		return driver.Shareable{}, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver cannot share chunks between processes", what(), c.m.d.Name())
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("export")
	if c.m.closed {
		return driver.Shareable{}, driver.Closed(what() + ": the memory is closed")
	}
	if c.released {
		return driver.Shareable{}, errors.Wrapf(driver.ErrBadHandle, "%s: the chunk is released", what())
	}
	if c.export != nil {
		return driver.Shareable{}, errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: exported already (one shareable handle per chunk per process)", what()),
			"use Exported for the handle, and SetAllowedPIDs to change who may import it")
	}
	s, err := sh.Export(c.handle)
	if err != nil {
		return driver.Shareable{}, errors.Wrapf(err, "%s", what())
	}
	c.export = &exported{sh: s}
	if err := c.grantLocked(allowPIDs); err != nil {
		// The driver has exported the chunk and cannot take that back:
		// it stays exported with nobody allowed to import it.
		return driver.Shareable{}, errors.WithHint(errors.Wrapf(err, "%s: exported, but no process is allowed to import it", what()),
			"retry with SetAllowedPIDs")
	}
	c.export.allow = slices.Clone(allowPIDs)
	return s, nil
}

// exported is a chunk's shareable handle and its allow-list. granted are
// the processes the driver's own allow-list names (driver.AllowList):
// every process ever allowed, since that list only grows.
type exported struct {
	sh      driver.Shareable
	allow   []int
	granted []int
}

// grantLocked hands the processes of pids not granted yet to the driver's
// own allow-list, when the driver keeps one.
func (c *Chunk) grantLocked(pids []int) error {
	al, ok := c.m.d.(driver.AllowList)
	if !ok {
		return nil
	}
	var add []int
	for _, p := range pids {
		if !slices.Contains(c.export.granted, p) && !slices.Contains(add, p) {
			add = append(add, p)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := al.AllowPIDs(c.handle, add); err != nil {
		return err
	}
	c.export.granted = append(c.export.granted, add...)
	return nil
}

// Exported returns the chunk's shareable handle, if exported.
func (c *Chunk) Exported() (driver.Shareable, bool) {
	if c == nil {
		return driver.Shareable{}, false
	}
	if c.m == nil {
		return driver.Shareable{}, false
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.export == nil || c.returned {
		return driver.Shareable{}, false
	}
	return c.export.sh, true
}

// SetAllowedPIDs replaces the processes allowed to import the chunk. A
// driver that keeps an allow-list of its own (AscendCL) is given the new
// processes; its list cannot shrink, so a process taken off this one is
// refused by the sender (ipc checks this list), not by the driver.
func (c *Chunk) SetAllowedPIDs(pids ...int) error {
	if err := c.made("set allowed PIDs of"); err != nil {
		return err
	}
	if err := driver.CheckPIDs(func() string { return fmt.Sprintf("physical: set allowed PIDs of %s", c) }, pids); err != nil {
		return err
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer c.m.checkAfter("setAllowedPIDs")
	if c.export == nil {
		return errors.Wrapf(driver.ErrInvalid, "physical: set allowed PIDs of %s: not exported", c)
	}
	if err := c.grantLocked(pids); err != nil {
		return errors.Wrapf(err, "physical: set allowed PIDs of %s", c)
	}
	c.export.allow = slices.Clone(pids)
	return nil
}

// Allowed reports whether process pid may import the chunk.
func (c *Chunk) Allowed(pid int) bool {
	if c == nil {
		return false
	}
	if c.m == nil {
		return false
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.export != nil && slices.Contains(c.export.allow, pid)
}

// Imported reports whether the chunk came from another process.
func (c *Chunk) Imported() bool {
	if c == nil {
		return false
	}
	return c.imported
}

// closeExportLocked closes the exported descriptor, when the chunk's
// memory is returned here: other processes keep theirs.
func (c *Chunk) closeExportLocked() {
	if c.export != nil && c.export.sh.Type == driver.HandlePOSIXFD {
		_ = closeFD(c.export.sh.FD)
		c.export = nil
	}
}

// Import makes a chunk of this process, on dev, from another process's
// shareable handle. The caller keeps its descriptor (and closes it); the
// chunk holds its own. The chunk counts in Usage like a created one.
func (m *Memory) Import(s driver.Shareable, dev driver.DeviceID) (*Chunk, error) {
	what := func() string { return fmt.Sprintf("physical: import %s on device %d", units.Bytes(s.Size), dev) }
	if err := m.usable(what); err != nil {
		return nil, err
	}
	sh, ok := m.d.(driver.Sharing)
	if !ok {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver cannot share chunks between processes", what(), m.d.Name())
	}
	if err := driver.CheckDevice(what, dev, len(m.devs)); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.checkAfter("import")
	if m.closed {
		return nil, driver.Closed(what() + ": the memory is closed")
	}
	h, err := sh.Import(s, dev)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	c := &Chunk{m: m, handle: h, dev: dev, size: s.Size, shareable: true, imported: true}
	m.addLocked(c)
	return c, nil
}
