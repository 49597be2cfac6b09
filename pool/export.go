package pool

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

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
// calls ReleaseImport itself. Package ipc counts its imports with
// ExportPointerFor instead, for its connection, which alone releases them. On error the import is not counted (chunks
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
	return p.exportPointer(nil, ptr, importers)
}

// ImportHolder keeps imports of pool pointers that only it may release:
// package ipc makes one for each connection, and counts with it the imports
// its peer process holds, which go when that process sends its release or
// exits — never by a ReleaseImport by hand, which would let the pool free
// (and hand to new allocations) memory the peer still maps. Give it a name
// that tells a reader who holds the imports and how they are released.
type ImportHolder struct {
	name string
}

// NewImportHolder returns a holder named name in messages.
func NewImportHolder(name string) *ImportHolder { return &ImportHolder{name: name} }

// String is the holder's name.
func (h *ImportHolder) String() string {
	if h == nil {
		return "nobody"
	}
	return h.name
}

// ExportPointerFor is ExportPointer with the import kept by h: only
// ReleaseImportFor with the same h releases it, and ReleaseImport refuses
// it (ErrBusy, naming h). A nil h is ErrInvalid.
func (p *Pool) ExportPointerFor(h *ImportHolder, ptr driver.Addr, importers ...int) (ExportedPointer, error) {
	if p.unmade() {
		return ExportedPointer{}, unmade("Pool.ExportPointerFor", "New")
	}
	if h == nil {
		return ExportedPointer{}, errors.Wrapf(driver.ErrInvalid, "pool: export pointer %s for a holder: the holder is nil", ptr)
	}
	return p.exportPointer(h, ptr, importers)
}

// exportPointer is ExportPointer, counting the import for h when h is not
// nil.
func (p *Pool) exportPointer(h *ImportHolder, ptr driver.Addr, importers []int) (ExportedPointer, error) {
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
	if h != nil {
		if p.held == nil {
			p.held = map[driver.Addr]map[*ImportHolder]int{}
		}
		if p.held[ptr] == nil {
			p.held[ptr] = map[*ImportHolder]int{}
		}
		p.held[ptr][h]++
	}
	return xp, nil
}

// ReleaseImport records that one import of ptr (one ExportPointer) was
// released; when none is left, FreeAsync may free ptr again. Imports that
// an ImportHolder keeps (ExportPointerFor: those package ipc sent to
// another process) are not the caller's to release: while only such
// imports are left, ReleaseImport refuses with ErrBusy naming their
// holders, and changes nothing.
func (p *Pool) ReleaseImport(ptr driver.Addr) error {
	if p.unmade() {
		return unmade("Pool.ReleaseImport", "New")
	}
	return p.releaseImport(nil, ptr)
}

// ReleaseImportFor records that one import of ptr that h keeps was
// released. An import h does not keep is ErrNotAllocated. A nil h is
// ErrInvalid.
func (p *Pool) ReleaseImportFor(h *ImportHolder, ptr driver.Addr) error {
	if p.unmade() {
		return unmade("Pool.ReleaseImportFor", "New")
	}
	if h == nil {
		return errors.Wrapf(driver.ErrInvalid, "pool: release of an import of %s for a holder: the holder is nil", ptr)
	}
	return p.releaseImport(h, ptr)
}

// releaseImport releases one import of ptr: one h keeps, or with a nil h
// one of the caller's own.
func (p *Pool) releaseImport(h *ImportHolder, ptr driver.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.checkAfterLocked("release import")
	if p.imports[ptr] == 0 {
		return errors.Wrapf(driver.ErrNotAllocated, "pool: release of an import of %s: no process imported it", ptr)
	}
	kept := 0
	for _, k := range p.held[ptr] {
		kept += k
	}
	switch {
	case h == nil && kept == p.imports[ptr]:
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "pool: release of an import of %s: its %d import(s) are kept by their holders (%s), which release them themselves",
				ptr, kept, p.holdersLocked(ptr)),
			"an import sent with ipc.Conn.SendPointer is released when the peer frees it (ipc.Conn.RecvRelease), or by ipc.Conn.ReleaseIfGone once the peer has exited; ReleaseImport is for imports made with ExportPointer")
	case h != nil && p.held[ptr][h] == 0:
		return errors.Wrapf(driver.ErrNotAllocated, "pool: release of an import of %s for %s: it keeps none", ptr, h)
	}
	if h != nil {
		if p.held[ptr][h]--; p.held[ptr][h] == 0 {
			delete(p.held[ptr], h)
			if len(p.held[ptr]) == 0 {
				delete(p.held, ptr)
			}
		}
	}
	if p.imports[ptr]--; p.imports[ptr] == 0 {
		delete(p.imports, ptr)
	}
	return nil
}

// holdersLocked names the holders that keep imports of ptr and how many,
// for messages: "1 by ipc connection ...; 2 by ...", "" when none does.
func (p *Pool) holdersLocked(ptr driver.Addr) string {
	names := make([]string, 0, len(p.held[ptr]))
	for h, k := range p.held[ptr] {
		names = append(names, fmt.Sprintf("%d by %s", k, h))
	}
	slices.Sort(names)
	return strings.Join(names, "; ")
}
