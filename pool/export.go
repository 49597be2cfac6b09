package pool

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Exporting a pool's allocations to other processes (CUDA's
// cudaMemPoolExportPointer). Package ipc moves what these methods return;
// the pool keeps the count of imports, so that it refuses to free an
// allocation another process still uses (importers free first).

// Base is the address offsets into the pool count from: the start of the
// range the pool's allocations lie in. It never changes.
func (p *Pool) Base() driver.Addr {
	if p.unmade() {
		return 0
	}
	return p.base
}

// Max is the size of that range: an importer reserves as much to map the
// pool's chunks at the same offsets.
func (p *Pool) Max() uint64 {
	if p.unmade() {
		return 0
	}
	return p.max
}

// Offset is where the live allocation ptr starts, from Base, and its size
// (the bytes asked for).
func (p *Pool) Offset(ptr driver.Addr) (off, size uint64, err error) {
	if p.unmade() {
		return 0, 0, unmade("Pool.Offset", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.live[ptr]
	if !ok {
		return 0, 0, p.notLiveLocked(fmt.Sprintf("pool: offset of %s", ptr), ptr)
	}
	return uint64(ptr - p.base), b.size, nil
}

// ExportedPointer is a live allocation of a shareable pool as another
// process needs it: where it lies and the chunks under it.
type ExportedPointer struct {
	// Offset is where the allocation starts, from Base; Size is the size
	// asked for.
	Offset, Size uint64
	// Chunks are the physical chunks the allocation lies on, in address
	// order.
	Chunks []ExportedChunk
}

// ExportedChunk is one physical chunk under an exported allocation.
type ExportedChunk struct {
	// Offset is where the chunk is mapped, from Base; Size is its size.
	Offset, Size uint64
	// ID tells chunks apart: the driver's handle of the chunk. When the
	// pool gives a chunk back and later commits a new one at the same
	// offset, the new one has another ID, so an importer still mapping
	// the old one knows to replace it.
	ID driver.Handle
	// Shareable is the chunk's shareable handle, exported the first time
	// it is asked for. The chunk owns it: it stays open while the chunk
	// lives, and the receiver must not close it.
	Shareable driver.Shareable
}

// ExportPointer describes the live allocation ptr of a shareable pool for
// another process, exporting the chunks under it that are not exported
// yet, and counts one import of it: FreeAsync refuses ptr until
// ReleaseImport has been called once for each successful ExportPointer
// (CUDA's rule: importers free first), so its chunks stay mapped while the
// description travels. A caller whose export never reaches an importer
// calls ReleaseImport itself. On error the import is not counted (chunks
// exported before the failure stay exported: a chunk is exported once).
//
// importers are the processes that will import the pointer. A driver
// whose shareable handles carry an allow-list of their own (AscendCL's
// tokens, driver.AllowList) is told to let them import each chunk under
// ptr; descriptors (host, CUDA) need nothing: whoever holds one may map
// it, and the sender decides who gets it.
func (p *Pool) ExportPointer(ptr driver.Addr, importers ...int) (ExportedPointer, error) {
	if p.unmade() {
		return ExportedPointer{}, unmade("Pool.ExportPointer", "New")
	}
	if err := driver.CheckPIDs(func() string { return fmt.Sprintf("pool: export pointer %s", ptr) }, importers); err != nil {
		return ExportedPointer{}, err
	}
	if !p.props.Shareable {
		return ExportedPointer{}, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "pool: export pointer %s: the pool was created without Props.Shareable", ptr),
			"create pools meant for other processes shareable")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return ExportedPointer{}, p.errDestroyed("export pointer")
	}
	b, ok := p.live[ptr]
	if !ok {
		return ExportedPointer{}, p.notLiveLocked(fmt.Sprintf("pool: export pointer %s", ptr), ptr)
	}
	ex, err := alExport(p.al, ptr)
	if err != nil {
		return ExportedPointer{}, errors.Wrapf(err, "pool: export pointer %s", ptr)
	}
	if ex.RangeBase != p.base {
		return ExportedPointer{}, errors.AssertionFailedf("pool: export pointer %s: it lies in a range at %s, the pool's is at %s", ptr, ex.RangeBase, p.base)
	}
	xp := ExportedPointer{Offset: ex.Offset, Size: b.size}
	al, lists := p.d.(driver.AllowList)
	for _, ch := range ex.Chunks {
		if lists && len(importers) > 0 {
			if err := al.AllowPIDs(ch.Handle, importers); err != nil {
				return ExportedPointer{}, errors.Wrapf(err, "pool: export pointer %s: allowing processes %v to import chunk %d", ptr, importers, ch.Handle)
			}
		}
		xp.Chunks = append(xp.Chunks, ExportedChunk{Offset: ch.Offset, Size: ch.Size, ID: ch.Handle, Shareable: ch.Shareable})
	}
	if p.imports == nil {
		p.imports = map[driver.Addr]int{}
	}
	p.imports[ptr]++
	return xp, nil
}

// ReleaseImport records that one import of ptr (one ExportPointer) was
// released; when none is left, FreeAsync may free ptr again.
func (p *Pool) ReleaseImport(ptr driver.Addr) error {
	if p.unmade() {
		return unmade("Pool.ReleaseImport", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.imports[ptr] == 0 {
		return errors.Wrapf(driver.ErrNotAllocated, "pool: release of an import of %s: no process imported it", ptr)
	}
	if p.imports[ptr]--; p.imports[ptr] == 0 {
		delete(p.imports, ptr)
	}
	return nil
}
