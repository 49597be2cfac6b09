package memsvg

import (
	"fmt"
	"sync"

	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/runs"
)

// Book is a memory map kept from the calls that change a driver's: the
// reservations, the chunks, which chunk is mapped where, and what each
// device may do there. A wrapper around a driver tells it each call that
// succeeded, after the driver did; Picture draws what it holds then. It is
// the driver's view, so it shows the memory of every layer above (an
// arena's, an allocator's stitch range, a KV cache's) without reaching
// into them.
//
// It is safe for concurrent use. Calls of several goroutines may reach it
// in another order than the driver saw them; the layers above serialize
// the calls on one reservation, and a call that does not fit what the
// book holds (an unmap of nothing, a map over a mapping) is ignored rather
// than guessed at.
type Book struct {
	devices int
	granule uint64

	// mu guards the maps below. Invariant: reservations and maps are
	// sorted and disjoint; every mapping lies inside a reservation; its
	// access has one unit per granule.
	mu           sync.Mutex
	reservations ranges.List[uint64, struct{}]
	chunks       map[uint64]*bookChunk
	maps         ranges.List[uint64, *bookMapping]
}

// bookChunk is a chunk as created: its device and size, and whether its
// handle was released. Its mappings share it, so a release marks them all.
type bookChunk struct {
	device   int
	size     uint64
	released bool
}

// bookMapping is one mapping: the chunk mapped whole, and per granule
// what each device may do there, a byte a device (trailing NoAccess
// trimmed, so that equal rows compare equal).
type bookMapping struct {
	handle uint64
	chunk  *bookChunk
	access runs.List[string]
}

// NewBook returns an empty book of a driver with devices devices whose
// smallest granularity is granule bytes: the unit of its pictures.
func NewBook(devices int, granule uint64) *Book {
	return &Book{devices: devices, granule: max(granule, 1), chunks: map[uint64]*bookChunk{}}
}

// Reserve records a reservation of [base, base+size).
func (b *Book) Reserve(base, size uint64) {
	if size == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reservations.Insert(base, base+size, struct{}{})
}

// Unreserve records that the reservation at base is gone.
func (b *Book) Unreserve(base uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i, ok := b.reservations.Find(base); ok && b.reservations.At(i).Start == base {
		b.reservations.Delete(i, i+1)
	}
}

// Create records chunk handle: size bytes on device.
func (b *Book) Create(handle uint64, device int, size uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chunks[handle] = &bookChunk{device: device, size: size}
}

// Release records that the chunk's handle is released: its mappings stay
// until they are unmapped (they hold its record), and the driver may give
// the handle to a new chunk.
func (b *Book) Release(handle uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch := b.chunks[handle]; ch != nil {
		ch.released = true
		delete(b.chunks, handle)
	}
}

// Map records the chunk handle mapped whole at addr, no device allowed.
func (b *Book) Map(addr, handle uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := b.chunks[handle]
	if ch == nil || ch.size == 0 || ch.size%b.granule != 0 {
		return
	}
	b.maps.Insert(addr, addr+ch.size, &bookMapping{handle: handle, chunk: ch, access: runs.New[string](ch.size / b.granule)})
}

// Unmap records that the mapping at addr is gone.
func (b *Book) Unmap(addr uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i, ok := b.maps.Find(addr); ok && b.maps.At(i).Start == addr {
		b.maps.Delete(i, i+1)
	}
}

// SetAccess records what device may do over [addr, addr+size), which may
// span several mappings.
func (b *Book) SetAccess(addr, size uint64, device int, a Access) {
	if device < 0 || device >= b.devices || size == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lo, hi := b.maps.Overlapping(addr, addr+size)
	for i := lo; i < hi; i++ {
		it := b.maps.At(i)
		from, to := max(addr, it.Start), min(addr+size, it.End)
		it.Val.access.Set((from-it.Start)/b.granule, (to-it.Start+b.granule-1)/b.granule, func(row string) string {
			return setAccess(row, device, a)
		})
	}
}

// setAccess is row with device's byte set to a, NoAccess trimmed off its
// end.
func setAccess(row string, device int, a Access) string {
	r := []byte(row)
	for len(r) <= device {
		r = append(r, byte(NoAccess))
	}
	r[device] = byte(a)
	for len(r) > 0 && r[len(r)-1] == byte(NoAccess) {
		r = r[:len(r)-1]
	}
	return string(r)
}

// Picture is what the book holds now: every live reservation, in address
// order, named by its base address.
func (b *Book) Picture(title string) Picture {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := Picture{Title: title, Granule: b.granule}
	for _, res := range b.reservations.All() {
		r := Range{Name: fmt.Sprintf("reservation %#x", res.Start), Base: res.Start, Size: res.Size()}
		lo, hi := b.maps.Overlapping(res.Start, res.End)
		for i := lo; i < hi; i++ {
			it := b.maps.At(i)
			if it.Start < res.Start || it.End > res.End {
				continue // not inside: the reservation went and came back meanwhile
			}
			m := it.Val
			_ = m.access.Each(0, m.access.Len(), func(g0, g1 uint64, row string) error {
				s := Span{Offset: it.Start - res.Start + g0*b.granule, Size: (g1 - g0) * b.granule, State: Mapped,
					Chunk: m.handle, Device: m.chunk.device, ChunkOffset: g0 * b.granule, Released: m.chunk.released,
					Access: make([]Access, b.devices)}
				for d := range min(len(row), b.devices) {
					s.Access[d] = Access(row[d])
					if s.Access[d] != NoAccess {
						s.State = Accessible
					}
				}
				r.Spans = append(r.Spans, s)
				return nil
			})
		}
		p.Ranges = append(p.Ranges, r)
	}
	return p
}
