package replay

// This file is the only one in the package that knows vmarena's allocator
// (package arena): building one per device, the calls a replay makes, and
// reading its figures into Figures. The rest of the package sees only
// allocator and Figures, so a new allocator API changes this file alone.

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Policy is the allocator's size and alignment rule.
type Policy uint8

const (
	// PolicyDefault: sizes round up to 256 bytes and starts are 256-byte
	// aligned, like device allocators.
	PolicyDefault Policy = iota
	// PolicyAscend: AscendCL's rule, a piece of len bytes takes
	// ALIGN_UP(len,32)+32 bytes and starts 64-byte aligned.
	PolicyAscend
	// PolicyAscendMedia: the same footprint, 128-byte aligned starts.
	PolicyAscendMedia
)

// Policies lists every policy.
var Policies = []Policy{PolicyDefault, PolicyAscend, PolicyAscendMedia}

var arenaPolicies = [...]arena.Policy{PolicyDefault: arena.PolicyDefault,
	PolicyAscend: arena.PolicyAscend, PolicyAscendMedia: arena.PolicyAscendMedia}

func (p Policy) arena() (arena.Policy, bool) {
	if int(p) >= len(arenaPolicies) {
		return 0, false
	}
	return arenaPolicies[p], true
}

func (p Policy) String() string {
	if a, ok := p.arena(); ok {
		return a.String()
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParsePolicy is the policy String names.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "replay: unknown allocator policy %q, want default, ascend or ascend-media", s)
}

// quantum is the policy's start alignment: every address the allocator
// returns is a multiple of it.
func (p Policy) quantum() uint64 {
	a, _ := p.arena()
	return a.Quantum()
}

// Figures are an allocator's figures, as a replay reports them.
type Figures struct {
	// Allocated is the sum of the sizes asked for by live allocations.
	Allocated, PeakAllocated uint64
	// Committed is the memory behind the allocator's ranges.
	Committed, PeakCommitted uint64
	// MapEvents and UnmapEvents count map and unmap calls as PyTorch counts
	// its segment events: one event per contiguous range mapped or unmapped
	// at once, whatever the number of chunks in it.
	MapEvents, UnmapEvents int
	// ChunkMaps and ChunkUnmaps count the driver calls: one per chunk
	// mapped or unmapped.
	ChunkMaps, ChunkUnmaps int
	// Decommits counts the calls that gave committed memory back to the
	// device, DecommittedBytes how much they gave.
	Decommits        int
	DecommittedBytes uint64
	// Stitches counts requests served by stitching free chunks; Grows
	// counts commits of new memory.
	Stitches, Grows int
	// OOMRetries counts requests that failed for want of memory and were
	// retried after giving free memory back.
	OOMRetries int
	// Live is the number of live allocations.
	Live int
}

// allocator is vmarena's allocator on one device of a replay's driver.
type allocator struct {
	al     *arena.Allocator
	policy Policy
}

// newAllocators builds one allocator on each of the driver's first n
// devices, all sharing the driver's address space and physical memory.
// Each may grow to opts.Capacity in chunks of opts.Granularity. On error
// nothing is left open.
func newAllocators(drv driver.Driver, n int, opts Options) ([]*allocator, error) {
	policy, ok := opts.Policy.arena()
	if !ok {
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: unknown allocator policy %d", opts.Policy)
	}
	space, mem := vaspace.New(drv), physical.New(drv)
	als := make([]*allocator, 0, n)
	for dev := range n {
		al, err := arena.NewAllocator(space, mem, arena.AllocatorOptions{
			Device: driver.DeviceID(dev), Max: opts.Capacity, ChunkSize: opts.Granularity,
			Policy: policy, NoStitch: opts.NoStitch, SlackDivisor: opts.SlackDivisor,
		})
		if err != nil {
			for _, a := range als {
				err = errors.CombineErrors(err, a.close())
			}
			return nil, errors.Wrapf(err, "replay: allocator for device %d", dev)
		}
		als = append(als, &allocator{al: al, policy: opts.Policy})
	}
	return als, nil
}

// alloc returns the address of size fresh bytes at the policy's alignment.
// Running out of memory is driver.ErrOutOfMemory.
func (a *allocator) alloc(size uint64) (driver.Addr, error) { return a.al.Alloc(size, 0) }

// free frees what alloc returned.
func (a *allocator) free(p driver.Addr) error { return a.al.Free(p) }

// trim gives back to the device all the free memory the allocator can.
func (a *allocator) trim() error { return a.al.Trim() }

// trimTo gives free chunks back while more than keep bytes are committed.
func (a *allocator) trimTo(keep uint64) error { return a.al.TrimTo(keep) }

// check walks the allocator's structures and reports every inconsistency.
func (a *allocator) check() error { return a.al.Check() }

// close closes the allocator; it refuses while allocations are live.
func (a *allocator) close() error { return a.al.Close() }

// figures reads the allocator's figures.
func (a *allocator) figures() Figures {
	st := a.al.Stats()
	return Figures{
		Allocated: st.Allocated, PeakAllocated: st.PeakAllocated,
		Committed: st.Committed, PeakCommitted: st.PeakCommitted,
		MapEvents: st.MapEvents, UnmapEvents: st.UnmapEvents,
		ChunkMaps: st.ChunkMaps, ChunkUnmaps: st.ChunkUnmaps,
		Decommits: st.Decommits, DecommittedBytes: st.DecommittedBytes,
		Stitches: st.Stitches, Grows: st.Grows, OOMRetries: st.OOMRetries,
		Live: st.Live,
	}
}

// usage is what live allocations asked for and what the allocator holds
// committed.
func (a *allocator) usage() (allocated, committed uint64) {
	st := a.al.Stats()
	return st.Allocated, st.Committed
}

// mapKinds are arena's block kinds as a replay names them.
var mapKinds = map[arena.BlockKind]MapKind{arena.BlockUsed: MapUsed, arena.BlockFree: MapFree,
	arena.BlockUncommitted: MapUncommitted, arena.BlockLent: MapLent, arena.BlockStitched: MapStitched}

// memoryMap copies the allocator's memory map: its ranges are the two
// heaps' (small requests, then large) and, with stitching on, the stitch
// range.
func (a *allocator) memoryMap() *PeakMap {
	names := []string{"small requests", "large requests", "stitch range"}
	m := &PeakMap{Ranges: names[:len(a.al.Ranges())]}
	for _, b := range a.al.MemoryMap() {
		m.Blocks = append(m.Blocks, MapBlock{Range: b.Range, Offset: b.Offset, Size: b.Size, Kind: mapKinds[b.Kind]})
	}
	return m
}
