package driver

// Books is implemented by drivers that answer what their own record
// holds: every driver of this module (its ledger). The Checks of the
// layers above (physical, mapping, vaspace, arena) compare their books
// with these answers, so that a change made through the driver behind a
// layer's back — a Release, Map, Unmap or Unreserve called on the driver
// itself, or through a second layer over the same range — is reported
// by that layer's Check. A driver without it (a wrapper of another) leaves
// those comparisons out. Each answer is one look-up in the driver's
// record, or, for Mapped, a walk over the mappings in the range.
type Books interface {
	// ChunkInfo is the device and size of the live chunk h: created or
	// imported, and not released. Any other handle is ErrBadHandle.
	ChunkInfo(h Handle) (DeviceID, uint64, error)
	// MappingAt is the handle and size of the mapping that starts at
	// addr (its chunk may be released, held by the mapping alone):
	// ErrNotMapped where none starts there, ErrNotReserved outside every
	// reservation.
	MappingAt(addr Addr) (Handle, uint64, error)
	// Mapped is how many mappings overlap [base, base+size) and their
	// bytes (each counted whole).
	Mapped(base Addr, size uint64) (n int, bytes uint64, err error)
	// ReservationAt is the size of the reservation that starts at base:
	// ErrNotReserved where none does.
	ReservationAt(base Addr) (uint64, error)
	// Used is the bytes device dev's live chunks hold (created or
	// imported there and not released): what the device has given out of
	// its Capacity. 0 for a device the driver does not have.
	Used(dev DeviceID) uint64
}
