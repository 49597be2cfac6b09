package ledger

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// The ledger is tested through every driver's conformance suite; these
// tests pin what only the accelerator drivers reach: access kept per
// device by the hardware (DeviceProtector), and host accesses cut into
// segments a device can make.

const g = 4096

// perDevice is a backend with no memory whose hardware keeps each
// device's access: it records the calls it was given and refuses the
// call numbered failAt (1-based; 0 never).
type perDevice struct {
	next   driver.Addr
	calls  []call
	failAt int
}

type call struct {
	addr     driver.Addr
	size     uint64
	dev      driver.DeviceID
	from, to driver.Access
}

func (b *perDevice) Reserve(size, _ uint64, _ driver.Addr) (driver.Addr, any, error) {
	b.next += 1 << 30
	return b.next, nil, nil
}
func (b *perDevice) Unreserve(*Region) error { return nil }
func (b *perDevice) Commit(*Chunk) error     { return nil }
func (b *perDevice) Free(*Chunk) error       { return nil }
func (b *perDevice) Map(*Mapping) error      { return nil }
func (b *perDevice) Unmap(*Mapping) error    { return nil }
func (b *perDevice) Close() error            { return nil }

func (b *perDevice) SetDeviceAccess(_ *Region, addr driver.Addr, size uint64, dev driver.DeviceID, from, to driver.Access) error {
	b.calls = append(b.calls, call{addr, size, dev, from, to})
	if len(b.calls) == b.failAt {
		return errors.Wrap(driver.ErrOutOfMemory, "refused")
	}
	return nil
}

func devices(n int) []driver.Device {
	devs := make([]driver.Device, n)
	for i := range devs {
		devs[i] = driver.Device{ID: driver.DeviceID(i), Capacity: 1 << 20, MinGranularity: g, RecommendedGranularity: g}
	}
	return devs
}

// mapped makes a ledger over b with a reservation holding n chunks of
// size bytes, side by side.
func mapped(t *testing.T, b Backend, n int, size uint64) (*Ledger, driver.Addr) {
	t.Helper()
	l, err := New("test", devices(3), b, false)
	require.NoError(t, err)
	base, err := l.Reserve(uint64(n)*size, 0, 0)
	require.NoError(t, err)
	for i := range n {
		h, err := l.Create(0, size, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Map(base+driver.Addr(uint64(i)*size), h))
	}
	return l, base
}

// TestNewNeedsOneWayOfProtecting: a backend must say how access reaches
// its hardware, one way exactly.
func TestNewNeedsOneWayOfProtecting(t *testing.T) {
	type neither struct{ Backend }
	_, err := New("test", devices(1), neither{}, false)
	require.Error(t, err)
	require.True(t, errors.IsAssertionFailure(err), "%v", err)
}

// TestSetAccessPerDevice: with a DeviceProtector the ledger asks the
// hardware for dev's own change, one call per mapping the range covers
// (never one spanning two), skipping mappings where dev's access does not
// change; a refusal part-way sets the mappings already changed back and
// records nothing.
func TestSetAccessPerDevice(t *testing.T) {
	b := &perDevice{}
	l, base := mapped(t, b, 3, 2*g)
	require.NoError(t, l.SetAccess(base+g, g, 1, driver.AccessRead))
	require.Equal(t, []call{{base + g, g, 1, driver.AccessNone, driver.AccessRead}}, b.calls)

	b.calls = nil
	require.NoError(t, l.SetAccess(base, 6*g, 1, driver.AccessRead))
	require.Equal(t, []call{
		{base, g, 1, driver.AccessNone, driver.AccessRead},
		{base + 2*g, 2 * g, 1, driver.AccessNone, driver.AccessRead},
		{base + 4*g, 2 * g, 1, driver.AccessNone, driver.AccessRead},
	}, b.calls, "one call per mapping; the granule already readable needs none")

	b.calls, b.failAt = nil, 2
	err := l.SetAccess(base, 6*g, 0, driver.AccessReadWrite)
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Equal(t, []call{
		{base, 2 * g, 0, driver.AccessNone, driver.AccessReadWrite},
		{base + 2*g, 2 * g, 0, driver.AccessNone, driver.AccessReadWrite},
		{base, 2 * g, 0, driver.AccessReadWrite, driver.AccessNone},
	}, b.calls, "the first mapping set back")
	for off := uint64(0); off < 6*g; off += g {
		a, err := l.Access(base+driver.Addr(off), 0)
		require.NoError(t, err)
		require.Equal(t, driver.AccessNone, a)
	}
	require.NoError(t, l.Check())
}

// TestWithHostSegments: a host access is cut where the lowest-numbered
// device that may make it changes, across mappings too, and refused where
// no device may.
func TestWithHostSegments(t *testing.T) {
	b := &perDevice{}
	l, base := mapped(t, b, 2, 2*g)
	require.NoError(t, l.SetAccess(base, 4*g, 2, driver.AccessRead))
	require.NoError(t, l.SetAccess(base+g, 2*g, 1, driver.AccessReadWrite))
	var got []Segment
	keep := func(segs []Segment) error { got = segs; return nil }

	require.NoError(t, l.WithHostSegments("read", base+100, 4*g-200, driver.AccessRead, keep))
	require.Equal(t, []Segment{
		{base + 100, g - 100, 2},
		{base + g, 2 * g, 1},
		{base + 3*g, g - 100, 2},
	}, got)

	require.NoError(t, l.WithHostSegments("write", base+g, 2*g, driver.AccessReadWrite, keep))
	require.Equal(t, []Segment{{base + g, 2 * g, 1}}, got, "one segment across the two mappings")

	err := l.WithHostSegments("write", base, 2*g, driver.AccessReadWrite, keep)
	require.True(t, errors.Is(err, driver.ErrAccessDenied), "%v", err)
	require.Contains(t, err.Error(), "mapped with access read for every device, read-write is needed")
}
